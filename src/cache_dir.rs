//! Where onepass keeps what it fetches and compiles: one root for the model files and the
//! compiled CUDA kernels alike, `$ONEPASS_CACHE_DIR` when set and non-empty, else the platform's
//! user cache directory + `onepass`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The environment variable that moves the cache.
pub const CACHE_DIR_ENV: &str = "ONEPASS_CACHE_DIR";

/// The cache root, from the environment (read once by the caller and passed down).
pub fn cache_root() -> Result<PathBuf> {
    cache_root_from(std::env::var_os(CACHE_DIR_ENV), dirs::cache_dir())
}

/// The cache root given the value of [`CACHE_DIR_ENV`] and the platform's user cache directory.
pub fn cache_root_from(env: Option<OsString>, user_cache: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(dir) = env.filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    user_cache
        .map(|d| d.join("onepass"))
        .ok_or_else(no_cache_root)
}

/// The error for a cache root that is needed where none is known.
pub fn no_cache_root() -> Error {
    Error::InvalidArgument(format!(
        "no user cache directory is known on this system; set {CACHE_DIR_ENV} or pass --model PATH"
    ))
}

/// Where compiled CUDA kernels are cached under the cache root `root`.
pub fn kernel_cache_dir(root: &Path) -> PathBuf {
    root.join("kernels")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_the_variable_when_set_should_win_and_when_empty_should_not() {
        let user = Some(PathBuf::from("/home/u/.cache"));
        let set = cache_root_from(Some("/elsewhere".into()), user.clone()).unwrap();
        assert_eq!(set, PathBuf::from("/elsewhere"));
        let empty = cache_root_from(Some("".into()), user.clone()).unwrap();
        assert_eq!(empty, PathBuf::from("/home/u/.cache/onepass"));
        let unset = cache_root_from(None, user).unwrap();
        assert_eq!(unset, PathBuf::from("/home/u/.cache/onepass"));
        let err = cache_root_from(None, None).unwrap_err().to_string();
        assert!(err.contains(CACHE_DIR_ENV), "{err}");
    }
}
