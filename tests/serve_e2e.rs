//! `onepass serve` end to end: the real binary on the CPU with the real SmolLM2 model, driven by
//! the real `openai` Python client over 127.0.0.1 (`tests/serve/client.py`). Every load loop is
//! bounded in count and time.

#[path = "serve/support.rs"]
mod support;

use serde_json::{json, Value};
use support::{generate_greedy, scenario, scenario_command, Server};

/// The context of every slot in these tests.
const CTX: usize = 512;
/// Prompt tokens per prefill chunk: small, so every prompt takes several chunks, interleaved with
/// the decode steps of the others.
const BATCH: usize = 4;

/// A server of 8 slots of CTX tokens, prompts prefilled in passes of BATCH, and `extra` flags.
fn eight_slot_server(extra: &[&str]) -> Server {
    let (ctx, batch) = (CTX.to_string(), BATCH.to_string());
    let mut args = vec!["--parallel", "8", "--ctx", &ctx, "--batch", &batch];
    args.extend_from_slice(extra);
    Server::start(&args)
}

#[test]
fn the_openai_client_gets_answers_streams_errors_and_batch_invariant_greedy_tokens() {
    let server = eight_slot_server(&["--queue", "16"]);
    let url = server.url.clone();

    let basic = scenario("basic", &url, json!({}));
    assert_eq!(basic["model"], "smollm2");
    let chat = &basic["chat"];
    assert_eq!(chat["object"], "chat.completion");
    assert!(!chat["text"].as_str().unwrap().is_empty(), "{basic}");
    let stream = &basic["chat_stream"];
    assert_eq!(
        stream["text"], chat["text"],
        "streamed and whole chat answers agree"
    );
    assert_eq!(stream["roles"], json!(["assistant"]));
    assert_eq!(stream["finish_reasons"], json!([chat["finish_reason"]]));
    assert_eq!(stream["usage"], chat["usage"]);
    let completion = &basic["completion"];
    assert_eq!(completion["finish_reason"], "length");
    assert_eq!(completion["usage"]["completion_tokens"], 10);
    assert_eq!(basic["completion_stream"]["text"], completion["text"]);
    assert_eq!(
        basic["completion_stream"]["finish_reasons"],
        json!(["length"])
    );
    if let Some(stop) = basic.get("stop") {
        let full = completion["text"].as_str().unwrap();
        let s = stop["stop"].as_str().unwrap();
        assert_eq!(
            stop["text"].as_str().unwrap(),
            &full[..full.find(s).unwrap()]
        );
        assert_eq!(stop["finish_reason"], "stop");
    }
    let samples = basic["seeded_samples"].as_array().unwrap();
    assert_eq!(samples[0], samples[1], "one seed, one sample");

    let bad = scenario("bad", &url, json!({"ctx": CTX}));
    for (case, param) in [
        ("temperature", "temperature"),
        ("n", "n"),
        ("max_tokens", "max_tokens"),
        ("too_many", "max_tokens"),
        ("context", "max_tokens"),
        ("unknown_field", "bogus"),
        ("messages", "messages"),
        ("role", "messages[0].role"),
    ] {
        assert_eq!(bad[case]["status"], 400, "{case}: {bad}");
        assert_eq!(bad[case]["param"], param, "{case}: {bad}");
        assert_eq!(bad[case]["type"], "invalid_request_error", "{case}");
    }
    assert_eq!(bad["context"]["code"], "context_length_exceeded");
    assert_eq!(bad["model"]["status"], 404);
    assert_eq!(bad["malformed"][0], 400);
    assert!(bad["malformed"][1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("JSON"));
    assert_eq!(bad["not_object"][0], 400);
    assert_eq!(bad["too_large"][0], 413);
    assert_eq!(bad["token_range"][0], 400);

    // Eight concurrent greedy clients get what `generate` gives each prompt alone, their prompts
    // (at most the mix limit, 4 x 8 tokens) fed as rows of the others' decode steps.
    concurrent_greedy_equals_generate(&url);

    // A stream closed by its client frees its slot.
    let cancel = scenario("cancel", &url, json!({}));
    assert_eq!(cancel["chunks"], 3);
    assert!(cancel["busy_before"].as_f64().unwrap() >= 1.0, "{cancel}");
    assert_eq!(cancel["freed"], true, "{cancel}");
}

/// Eight concurrent greedy clients against `onepass generate --temperature 0` for each prompt.
fn concurrent_greedy_equals_generate(url: &str) {
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "Once upon a time, in a small village,",
        "The three primary colors are",
        "def fibonacci(n):",
        "Les chats sont",
        "In 1969, the first person to walk on the moon was",
        "A haiku about autumn:",
    ];
    let max_tokens = 12;
    let got = scenario(
        "concurrent",
        url,
        json!({"prompts": prompts, "max_tokens": max_tokens}),
    );
    let results = got["results"].as_array().unwrap();
    assert_eq!(results.len(), prompts.len());
    for (prompt, result) in prompts.iter().zip(results) {
        let want = generate_greedy(prompt, max_tokens, CTX, BATCH);
        assert_eq!(
            result["token_ids"], want["generated_ids"],
            "prompt {prompt:?}: server {result} vs generate {want}"
        );
        assert_eq!(result["text"], want["text"], "prompt {prompt:?}");
    }
}

#[test]
fn prompts_prefilled_in_passes_between_steps_give_generates_tokens() {
    // Every prompt in passes of BATCH tokens between the decode steps of the others: the bits of
    // `generate`'s prefill, chunk for chunk.
    let server = eight_slot_server(&["--mix-prompt-tokens", "0"]);
    concurrent_greedy_equals_generate(&server.url);
}

#[test]
fn keys_a_full_queue_and_sigterm_are_handled_cleanly() {
    let mut server = Server::start(&[
        "--parallel",
        "1",
        "--queue",
        "1",
        "--ctx",
        "256",
        "--api-key",
        "sesame",
        "--shutdown-grace",
        "60",
    ]);
    let url = server.url.clone();
    let auth = scenario("auth", &url, json!({"key": "sesame", "model": "smollm2"}));
    assert_eq!(auth["missing"]["status"], 401, "{auth}");
    assert_eq!(auth["missing"]["type"], "authentication_error");
    assert_eq!(auth["wrong"]["status"], 401);
    assert_eq!(auth["right"]["status"], 200);
    assert_eq!(auth["health"], 200);

    let full = scenario("queue_full", &url, json!({"key": "sesame"}));
    assert_eq!(full["queued"], 1.0, "{full}");
    assert_eq!(full["third"]["status"], 429, "{full}");

    // SIGTERM while a stream runs: the stream ends normally, the server exits 0.
    let mut client = scenario_command("long_stream", &url, &json!({"key": "sesame", "n": 40}))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    let stdout = client.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.next().expect("a line from the client").unwrap();
    assert_eq!(first, "streaming");
    let status = server.terminate();
    assert!(status.success(), "exit {status}:\n{}", server.log());
    let last: Value = serde_json::from_str(&lines.last().expect("a result").unwrap()).unwrap();
    assert!(client.wait().unwrap().success());
    assert_eq!(last["finish_reasons"], json!(["length"]), "{last}");
    assert!(!last["text"].as_str().unwrap().is_empty());
}
