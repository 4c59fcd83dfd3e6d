//! Our GGML dequantizers (and the Q4_0 / Q4_1 / Q5_0 / Q8_0 quantizers) against the Python `gguf`
//! package, through the fixtures that `scripts/make_quant_fixture.py` wrote into
//! `tests/fixtures/quant/`. Exact equality is expected: both sides compute the same f32
//! expressions in the same order (`d * q + m`, `(d * sc) * q - dmin * m`, ...), so every value
//! must match bit for bit.

use std::path::PathBuf;

use onepass::quant::{dequantize, quantize};
use onepass::DType;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn assert_bits_equal(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: value count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: value {i}: ours {g}, gguf {w}"
        );
    }
}

fn check_dequantize(name: &str, dtype: DType) {
    let bytes = fixture(&format!("{name}.bin"));
    let want = f32s(&fixture(&format!("{name}.f32")));
    assert!(
        !want.is_empty() && want.iter().any(|v| *v != 0.0),
        "{name}: fixture is empty or all zero"
    );
    let got = dequantize(dtype, &bytes).unwrap();
    assert_bits_equal(&got, &want, name);
}

#[test]
fn dequantize_matches_gguf_for_every_format() {
    for (name, dtype) in [
        ("q4_0", DType::Q4_0),
        ("q4_1", DType::Q4_1),
        ("q5_0", DType::Q5_0),
        ("q8_0", DType::Q8_0),
        ("q4_k", DType::Q4K),
        ("q6_k", DType::Q6K),
    ] {
        check_dequantize(name, dtype);
    }
}

/// Real blocks of the default model (SmolLM2-135M-Instruct Q4_1): a Q4_1 FFN matrix and the Q8_0
/// token embedding.
#[test]
fn dequantize_matches_gguf_on_model_blocks() {
    check_dequantize("model_q4_1", DType::Q4_1);
    check_dequantize("model_q8_0", DType::Q8_0);
}

/// GGML's reference quantizers (as ported by the `gguf` package) and ours give the same bytes.
#[test]
fn quantize_matches_gguf_reference_quantizers() {
    for (name, dtype) in [
        ("q4_0", DType::Q4_0),
        ("q4_1", DType::Q4_1),
        ("q5_0", DType::Q5_0),
        ("q8_0", DType::Q8_0),
    ] {
        let src = f32s(&fixture(&format!("{name}.src.f32")));
        let want = fixture(&format!("{name}.bin"));
        let got = quantize(dtype, &src).unwrap();
        assert_eq!(got.len(), want.len(), "{name}: byte count");
        for (b, (g, w)) in got
            .chunks(dtype.block_bytes())
            .zip(want.chunks(dtype.block_bytes()))
            .enumerate()
        {
            assert_eq!(g, w, "{name}: block {b} differs");
        }
    }
}
