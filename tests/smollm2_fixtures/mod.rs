//! The SmolLM2-135M-Instruct reference outputs in `tests/fixtures/smollm2/` (see its README):
//! reading them, with the full path in every failure.

use std::path::PathBuf;

use serde_json::Value;

/// The folder of the reference outputs inside this repository.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2")
}

/// The bytes of one fixture file; panics naming the full path when it cannot be read.
pub fn read(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// The parsed `smollm2_public.json`; panics naming the full path when it is missing or bad.
pub fn json() -> Value {
    let path = dir().join("smollm2_public.json");
    let bytes = read("smollm2_public.json");
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// A little-endian float32 fixture file as numbers.
#[allow(dead_code)] // Not every test file that includes this module reads a float array.
pub fn f32s(name: &str) -> Vec<f32> {
    read(name)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
