//! What the end-to-end tests of `onepass serve` share: the `openai` Python client (installed
//! with pip under the cache directory when `import openai` fails), a server process started on
//! a free port of 127.0.0.1 and stopped when the test ends, the client scenarios of
//! `client.py`, and `onepass generate` as the reference.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `openai` client version the tests install when none is importable (`.ci/run` pins the
/// same).
pub const OPENAI_VERSION: &str = "3.57.0";

/// How long a server may take to start (the first run fetches the model).
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one client scenario may run.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `python3` imports `openai` with `pythonpath` (if any) on its path.
fn imports_openai(pythonpath: Option<&Path>) -> bool {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", "import openai"]);
    if let Some(p) = pythonpath {
        cmd.env("PYTHONPATH", p);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The `PYTHONPATH` under which `import openai` works: none when it already does, else a folder
/// under the cache directory where pip installs the pinned version (once). Fails the test with
/// what to do when neither works.
pub fn openai_pythonpath() -> Option<PathBuf> {
    if imports_openai(None) {
        return None;
    }
    let root = onepass::cache_dir::cache_root().expect("a cache directory for the openai client");
    let dir = root.join("python").join(format!("openai-{OPENAI_VERSION}"));
    if imports_openai(Some(&dir)) {
        return Some(dir);
    }
    let staging = root
        .join("python")
        .join(format!(".openai-{OPENAI_VERSION}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(&staging)
        .arg(format!("openai=={OPENAI_VERSION}"))
        .status();
    assert!(
        status.as_ref().is_ok_and(|s| s.success()),
        "the openai Python client is not importable and `python3 -m pip install --target {} \
         openai=={OPENAI_VERSION}` failed ({status:?}); install it with `python3 -m pip install \
         openai=={OPENAI_VERSION}`",
        staging.display()
    );
    // Another test may have finished the same install first: either copy will do.
    if std::fs::rename(&staging, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert!(
        imports_openai(Some(&dir)),
        "pip installed openai into {} but python3 cannot import it",
        dir.display()
    );
    Some(dir)
}

/// A running `onepass serve`, stopped (killed if need be) when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Every line of its standard error so far.
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `onepass serve` on the CPU with the default model, on a free port of 127.0.0.1,
    /// with `extra` flags; waits for its `listening on` line.
    pub fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onepass"))
            .args([
                "serve",
                "--backend",
                "cpu",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start onepass serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel();
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                kept.lock().unwrap().push(line);
            }
        });
        let url = wait_for_listening(&rx, &mut child, &lines);
        Server {
            child,
            url,
            stderr: lines,
        }
    }

    /// Sends SIGTERM and waits (at most 60 s) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the server") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within 60 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's standard error so far, one string.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_listening(
    rx: &Receiver<String>,
    child: &mut Child,
    lines: &Arc<Mutex<Vec<String>>>,
) -> String {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(url) = line.strip_prefix("listening on ") {
                    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
                    return url.trim().to_owned();
                }
            }
            Err(_) => {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "onepass serve exited ({status}) before listening:\n{}",
                        lines.lock().unwrap().join("\n")
                    );
                }
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("onepass serve did not listen within {START_TIMEOUT:?}");
        }
    }
}

/// A `client.py` process for scenario `name` against `url`.
pub fn scenario_command(name: &str, url: &str, args: &serde_json::Value) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(manifest().join("tests/serve/client.py"))
        .args([name, url, &args.to_string()])
        .stdin(Stdio::null());
    if let Some(path) = openai_pythonpath() {
        cmd.env("PYTHONPATH", path);
    }
    cmd
}

/// Runs scenario `name` of `client.py` to its end (at most [`SCENARIO_TIMEOUT`]) and gives the
/// JSON object it prints last.
pub fn scenario(name: &str, url: &str, args: serde_json::Value) -> serde_json::Value {
    let mut child = scenario_command(name, url, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    while child.try_wait().expect("wait for python3").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("client scenario {name} ran past {SCENARIO_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("python3 output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client scenario {name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("scenario {name} printed {last:?}: {e}"))
}

/// `onepass generate --temperature 0 --json` on the CPU: the reference a server's greedy answer
/// must equal.
pub fn generate_greedy(
    prompt: &str,
    max_tokens: usize,
    ctx: usize,
    batch: usize,
) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .args([
            "generate",
            "--backend",
            "cpu",
            "--temperature",
            "0",
            "--json",
        ])
        .args(["-n", &max_tokens.to_string(), "--ctx", &ctx.to_string()])
        .args(["--batch", &batch.to_string()])
        .arg(prompt)
        .stdin(Stdio::null())
        .output()
        .expect("run onepass generate");
    assert!(
        out.status.success(),
        "onepass generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("generate --json output")
}
