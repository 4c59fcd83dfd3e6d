//! The HTTP layer of `onepass serve` over a test double of `SlotModel` (no real model): routes,
//! the OpenAI shapes, errors, limits, the header read timeout, a client that hangs up, and the
//! graceful end. Raw HTTP/1.1 over 127.0.0.1, every wait bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onepass::model::chat::ChatTemplate;
use onepass::model::slots::{Pick, RowOutput, SlotModel, StepRow};
use onepass::serve::{Limits, ServeOptions, ServedModel, TextCodec};
use onepass::{Error, Result};

/// The double's end token; tokens below 256 are bytes.
const END: u32 = 256;

/// A model whose next token is the next letter after the slot's last byte (`z` wraps to `a`);
/// `!` is followed by the end token. Each decode step takes `step` so that requests overlap.
struct Alphabet {
    last: Vec<u32>,
    step: Duration,
}

fn next_after(token: u32) -> u32 {
    match token {
        0x21 => END,
        t if (u32::from(b'a')..u32::from(b'z')).contains(&t) => t + 1,
        _ => u32::from(b'a'),
    }
}

/// Logits that any sampler turns into `token` (every other logit is 100 below).
fn one_hot(token: u32) -> Vec<f32> {
    let mut logits = vec![0.0; 257];
    logits[token as usize] = 100.0;
    logits
}

impl SlotModel for Alphabet {
    fn slots(&self) -> usize {
        self.last.len()
    }
    fn slot_ctx(&self) -> usize {
        64
    }
    fn vocab(&self) -> usize {
        257
    }
    fn max_chunk(&self) -> usize {
        8
    }
    fn max_rows(&self) -> usize {
        self.last.len()
    }
    fn prefill(&mut self, slot: usize, tokens: &[u32], _pos0: usize) -> Result<Vec<f32>> {
        let last = *tokens
            .last()
            .ok_or_else(|| Error::InvalidArgument("empty".into()))?;
        self.last[slot] = last;
        Ok(one_hot(next_after(last)))
    }
    fn decode(&mut self, rows: &[StepRow]) -> Result<Vec<RowOutput>> {
        std::thread::sleep(self.step);
        Ok(rows
            .iter()
            .map(|r| {
                self.last[r.slot] = r.token;
                let next = next_after(r.token);
                // A model that cannot draw on the device gives sampled rows their logits.
                if r.pick == Pick::Greedy {
                    RowOutput::Token(next)
                } else {
                    RowOutput::Logits(one_hot(next))
                }
            })
            .collect())
    }
}

/// Text is bytes, one token each.
struct Bytes;

impl TextCodec for Bytes {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn token_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        if id < 256 {
            out.push(id as u8);
        }
        Ok(())
    }
    fn is_special(&self, id: u32) -> bool {
        id == END
    }
    fn end_ids(&self) -> Vec<u32> {
        vec![END]
    }
}

/// A server on a thread; `stop` ends it as a signal would and waits for `run_until` to return.
struct TestServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl TestServer {
    fn start(slots: usize, queue: usize, step: Duration, api_key: Option<&str>) -> TestServer {
        let options = ServeOptions {
            api_key: api_key.map(str::to_owned),
            model_id: "alphabet".into(),
            limits: Limits {
                max_body_bytes: 4096,
                max_prompt_tokens: 32,
                max_new_tokens: 48,
                context: 64,
            },
            queue,
            header_timeout: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            http_threads: 2,
            warm_up: true,
            mix_limit: None,
        };
        let template = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}\
             {% if add_generation_prompt %}a:{% endif %}",
            "",
            "",
        )
        .unwrap();
        let served = ServedModel {
            model: Box::new(Alphabet {
                last: vec![0; slots],
                step,
            }),
            codec: Arc::new(Bytes),
            template: Some(template),
        };
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let listener = onepass::serve::bind("127.0.0.1", 0).unwrap();
        let thread = std::thread::spawn(move || {
            onepass::serve::run_until(
                listener,
                options,
                served,
                |addr| addr_tx.send(addr).unwrap(),
                async move {
                    let _ = stop_rx.await;
                },
            )
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the server listens");
        TestServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.thread.take().map_or(Ok(()), |t| t.join().unwrap())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An answer: status, headers (lower-case names) and the body (chunked encoding undone).
struct Answer {
    status: u16,
    headers: String,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn send(stream: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(req.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
}

fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut stream = connect(addr);
    send(&mut stream, method, path, headers, body.as_bytes());
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read the answer");
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, rest) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head[9..12].parse().unwrap();
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&tail[..size]);
        rest = &tail[size + 2..];
    }
}

fn post(addr: SocketAddr, path: &str, body: &str) -> Answer {
    http(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body,
    )
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let m = http(addr, "GET", "/metrics", &[], "");
    m.body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in\n{}", m.body))
        .parse()
        .unwrap()
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_routes_answer_in_the_openai_shapes() {
    let mut server = TestServer::start(2, 4, Duration::from_millis(1), None);
    let a = server.addr;
    assert_eq!(http(a, "GET", "/health", &[], "").status, 200);
    let models = http(a, "GET", "/v1/models", &[], "").json();
    assert_eq!(models["data"][0]["id"], "alphabet");

    let r = post(
        a,
        "/v1/completions",
        r#"{"model": "alphabet", "prompt": "abc", "max_tokens": 5}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(j["choices"][0]["text"], "defgh");
    assert_eq!(j["choices"][0]["finish_reason"], "length");
    assert_eq!(j["usage"]["prompt_tokens"], 3);
    assert_eq!(j["usage"]["total_tokens"], 8);

    // The end token after `!`: finish reason stop, no text; a stop string across tokens.
    let j = post(
        a,
        "/v1/completions",
        r#"{"model": "alphabet", "prompt": "x!", "max_tokens": 5}"#,
    );
    let j = j.json();
    assert_eq!(j["choices"][0]["text"], "");
    assert_eq!(j["choices"][0]["finish_reason"], "stop");
    assert_eq!(j["usage"]["completion_tokens"], 1);
    let j = post(
        a,
        "/v1/completions",
        r#"{"model": "alphabet", "prompt": "a", "max_tokens": 20, "stop": ["fg", "zz"]}"#,
    )
    .json();
    assert_eq!(j["choices"][0]["text"], "bcde");
    assert_eq!(j["choices"][0]["finish_reason"], "stop");

    let s = post(
        a,
        "/v1/chat/completions",
        r#"{"model": "alphabet", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}"#,
    );
    assert_eq!(s.status, 200);
    assert!(
        s.headers.contains("content-type: text/event-stream"),
        "{}",
        s.headers
    );
    assert!(s.body.ends_with("data: [DONE]\n\n"), "{}", s.body);
    let frames: Vec<serde_json::Value> = s
        .body
        .split_terminator("\n\n")
        .filter(|f| *f != "data: [DONE]")
        .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    let text: String = frames
        .iter()
        .filter_map(|f| f["choices"][0]["delta"]["content"].as_str())
        .collect();
    // The template renders "user:hi;a:", whose last byte is `:`; then the alphabet from `a`.
    assert_eq!(text, "abc");
    assert_eq!(frames[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = frames.last().unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    let m = http(a, "GET", "/metrics", &[], "").body;
    assert!(
        m.contains("onepass_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 3"),
        "{m}"
    );
    server.shutdown().unwrap();
}

#[test]
fn bad_requests_get_json_errors_with_the_right_status() {
    let mut server = TestServer::start(1, 1, Duration::from_millis(1), Some("k3y"));
    let a = server.addr;
    let key = [
        ("Authorization", "Bearer k3y"),
        ("Content-Type", "application/json"),
    ];
    let call = |path: &str, body: &str| http(a, "POST", path, &key, body);
    let no_key = post(
        a,
        "/v1/completions",
        r#"{"model": "alphabet", "prompt": "a"}"#,
    );
    assert_eq!(no_key.status, 401);
    assert_eq!(no_key.json()["error"]["type"], "authentication_error");
    let wrong = http(
        a,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer nope")],
        "",
    );
    assert_eq!(wrong.status, 401);
    assert_eq!(
        http(a, "GET", "/health", &[], "").status,
        200,
        "no key for /health"
    );
    let cases = [
        ("{\"model\": ", 400, None),
        (
            r#"{"model": "alphabet", "prompt": "a", "top_p": "x"}"#,
            400,
            Some("top_p"),
        ),
        (
            r#"{"model": "alphabet", "prompt": "a", "max_tokens": 49}"#,
            400,
            Some("max_tokens"),
        ),
        (
            r#"{"model": "alphabet", "prompt": "a", "max_tokens": 40, "x": 1}"#,
            400,
            Some("x"),
        ),
        (r#"{"model": "other", "prompt": "a"}"#, 404, Some("model")),
        (
            r#"{"model": "alphabet", "prompt": [999]}"#,
            400,
            Some("prompt"),
        ),
    ];
    for (body, status, param) in cases {
        let r = call("/v1/completions", body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"].as_str(), param, "{body}");
        assert!(!e["error"]["message"].as_str().unwrap().is_empty());
    }
    let long = format!(r#"{{"model": "alphabet", "prompt": "{}"}}"#, "a".repeat(40));
    let r = call("/v1/completions", &long);
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    let huge = format!(
        r#"{{"model": "alphabet", "prompt": "{}"}}"#,
        "a".repeat(5000)
    );
    assert_eq!(call("/v1/completions", &huge).status, 413);
    let r = http(a, "GET", "/nowhere", &[], "");
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (404, Some("invalid_request_error"))
    );
    assert_eq!(http(a, "GET", "/v1/completions", &key, "").status, 405);
    // Bytes that are not text, and a body cut short, are answered too (never a panic).
    let mut s = connect(a);
    send(&mut s, "POST", "/v1/completions", &key, b"\xff\xfe{{");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    assert!(
        raw.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    server.shutdown().unwrap();
}

#[test]
fn slow_headers_time_out_and_a_client_that_hangs_up_frees_its_slot() {
    let mut server = TestServer::start(1, 2, Duration::from_millis(20), None);
    let a = server.addr;
    // Headers never finished: the server closes the connection after its 1 s limit.
    let mut slow = connect(a);
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 256];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "closed after {:?}",
        t0.elapsed()
    );
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");

    // A non-streamed request whose client goes away frees the slot within a step or so.
    let mut gone = connect(a);
    send(
        &mut gone,
        "POST",
        "/v1/completions",
        &[],
        br#"{"model": "alphabet", "prompt": "a", "max_tokens": 48}"#,
    );
    wait_for("the request to take the slot", || {
        metric(a, "onepass_slots_in_use") == 1.0
    });
    drop(gone);
    let t0 = Instant::now();
    wait_for("the slot to be freed", || {
        metric(a, "onepass_slots_in_use") == 0.0
    });
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // A streamed one too.
    let mut stream = connect(a);
    send(
        &mut stream,
        "POST",
        "/v1/completions",
        &[],
        br#"{"model": "alphabet", "prompt": "a", "max_tokens": 48, "stream": true}"#,
    );
    let n = stream.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(stream);
    wait_for("the streamed slot to be freed", || {
        metric(a, "onepass_slots_in_use") == 0.0
    });
    server.shutdown().unwrap();
}

#[test]
fn a_full_queue_is_a_429_and_shutdown_lets_open_streams_finish() {
    let mut server = TestServer::start(1, 1, Duration::from_millis(20), None);
    let a = server.addr;
    let body = br#"{"model": "alphabet", "prompt": "a", "max_tokens": 30, "stream": true}"#;
    let mut running = connect(a);
    send(&mut running, "POST", "/v1/completions", &[], body);
    wait_for("the first stream to run", || {
        metric(a, "onepass_slots_in_use") == 1.0
    });
    let mut queued = connect(a);
    send(&mut queued, "POST", "/v1/completions", &[], body);
    wait_for("the second to queue", || {
        metric(a, "onepass_queue_length") == 1.0
    });
    let full = post(
        a,
        "/v1/completions",
        r#"{"model": "alphabet", "prompt": "a"}"#,
    );
    assert_eq!(full.status, 429);
    assert_eq!(full.json()["error"]["type"], "rate_limit_error");
    assert!(full.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue"));
    // Shut down now: both open streams still end with their last chunk and [DONE].
    let stopper = std::thread::spawn(move || server.shutdown());
    for s in [&mut running, &mut queued] {
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
        assert!(text.contains("data: [DONE]"), "{text}");
    }
    stopper.join().unwrap().unwrap();
    assert!(TcpStream::connect(a).is_err(), "no longer listening");
}

#[test]
fn mutated_bodies_get_answers_and_never_break_the_server() {
    let mut server = TestServer::start(2, 8, Duration::ZERO, None);
    let a = server.addr;
    let seeds = [
        r#"{"model": "alphabet", "prompt": "abc", "max_tokens": 3, "stop": ["x"], "seed": 5}"#,
        r#"{"model": "alphabet", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2, "stream": true}"#,
    ];
    // A seeded xorshift, so a failure can be replayed.
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..200 {
        let path = if round % 2 == 0 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let mut body = seeds[round % 2].as_bytes().to_vec();
        for _ in 0..1 + next() % 4 {
            let at = (next() % body.len() as u64) as usize;
            match next() % 3 {
                0 => body[at] = (next() % 256) as u8,
                1 => body.insert(at, b"{}[],:\"0-e\\"[(next() % 11) as usize]),
                _ => {
                    body.remove(at);
                }
            }
        }
        let mut s = connect(a);
        send(
            &mut s,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            &body,
        );
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("an answer");
        let status: u16 = String::from_utf8_lossy(&raw[9..12]).parse().unwrap_or(0);
        assert!(
            [200, 400, 404].contains(&status),
            "round {round}: {status} for {}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(http(a, "GET", "/health", &[], "").status, 200);
    wait_for("the slots to empty", || {
        metric(a, "onepass_slots_in_use") == 0.0
    });
    server.shutdown().unwrap();
}
