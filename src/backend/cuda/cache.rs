//! The on-disk cubin cache.
//!
//! A cubin is stored under a key that hashes everything that shapes it: the source, the NVRTC
//! options (architecture and include path among them) and the NVRTC version. Each file is a small
//! header (magic, SHA-256 of the payload) followed by the payload; it is written to a temporary
//! file and renamed into place, so a reader never sees half a file, and verified on every read, so
//! a damaged file is recompiled instead of loaded.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"ONEPCUB1";
const HEADER: usize = 8 + 32;

/// A directory of cached cubins.
#[derive(Debug, Clone)]
pub struct CubinCache {
    dir: PathBuf,
}

/// The default cache directory: `kernels` under the cache root
/// ([`crate::cache_dir::cache_root`]: `$ONEPASS_CACHE_DIR`, else the user's cache directory), when
/// there is one.
pub fn default_cache_dir() -> Option<PathBuf> {
    crate::cache_dir::cache_root()
        .ok()
        .map(|d| crate::cache_dir::kernel_cache_dir(&d))
}

/// The cache key of one compilation, as 64 hex digits.
pub fn cache_key(source: &str, options: &[String], nvrtc_version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(b"onepass cubin v1\0");
    h.update((source.len() as u64).to_le_bytes());
    h.update(source.as_bytes());
    for o in options {
        h.update((o.len() as u64).to_le_bytes());
        h.update(o.as_bytes());
    }
    h.update(nvrtc_version.0.to_le_bytes());
    h.update(nvrtc_version.1.to_le_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl CubinCache {
    /// A cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CubinCache { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str, key: &str) -> PathBuf {
        self.dir.join(format!("{name}-{key}.cubin"))
    }

    /// Whether an entry for `key` exists (not verified: [`CubinCache::load`] checks it).
    pub fn contains(&self, name: &str, key: &str) -> bool {
        self.path(name, key).is_file()
    }

    /// The cached cubin for `key`, if a file exists and its checksum holds. A damaged file is
    /// removed (best effort) and reported as absent.
    pub fn load(&self, name: &str, key: &str) -> Option<Vec<u8>> {
        let path = self.path(name, key);
        let bytes = std::fs::read(&path).ok()?;
        match verify(&bytes) {
            Some(payload) => Some(payload.to_vec()),
            None => {
                tracing::warn!(path = %path.display(), "damaged cubin cache entry; recompiling");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores a cubin atomically (temporary file, then rename).
    pub fn store(&self, name: &str, key: &str, cubin: &[u8]) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let path = self.path(name, key);
        let tmp = self.dir.join(format!(
            ".{name}-{key}.{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&Sha256::digest(cubin))?;
            f.write_all(cubin)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(&path, e)
        })
    }
}

/// The payload of a cache file when its header and checksum are right.
fn verify(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() <= HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let payload = &bytes[HEADER..];
    (Sha256::digest(payload).as_slice() == &bytes[8..HEADER]).then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("onepass-cubin-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn key_changes_with_every_input() {
        let opts = vec!["--gpu-architecture=sm_90".to_string()];
        let k = cache_key("a", &opts, (13, 0));
        assert_eq!(k.len(), 64);
        assert_eq!(k, cache_key("a", &opts, (13, 0)));
        assert_ne!(k, cache_key("b", &opts, (13, 0)));
        assert_ne!(
            k,
            cache_key("a", &["--gpu-architecture=sm_80".to_string()], (13, 0))
        );
        assert_ne!(k, cache_key("a", &opts, (13, 1)));
    }

    #[test]
    fn store_load_roundtrip_and_damage_is_detected() {
        let dir = temp_dir("roundtrip");
        let cache = CubinCache::new(&dir);
        assert!(cache.load("norm", "k1").is_none());
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        cache.store("norm", "k1", &payload).unwrap();
        assert_eq!(cache.load("norm", "k1").as_deref(), Some(&payload[..]));
        // No temporary file is left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        // Flip one payload byte: the entry is rejected and removed.
        let path = cache.path("norm", "k1");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert!(cache.load("norm", "k1").is_none());
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
