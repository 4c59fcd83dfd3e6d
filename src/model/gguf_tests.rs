//! Unit tests of the GGUF reader: round trips through the writer, and hand-made bytes for every
//! validation error path.

use super::*;
use crate::model::gguf_write::GgufWriter;
use rand::{RngExt, SeedableRng};

/// Hand-made GGUF bytes, independent of the writer.
struct Raw {
    version: u32,
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    alignment: usize,
    data: Vec<u8>,
}

impl Raw {
    fn new() -> Raw {
        Raw {
            version: 3,
            kvs: vec![],
            n_kv: 0,
            infos: vec![],
            n_tensors: 0,
            alignment: 32,
            data: vec![],
        }
    }

    fn kv(mut self, key: &str, type_id: u32, payload: &[u8]) -> Raw {
        self.kvs.extend_from_slice(&str_bytes(key));
        self.kvs.extend_from_slice(&type_id.to_le_bytes());
        self.kvs.extend_from_slice(payload);
        self.n_kv += 1;
        self
    }

    fn tensor(mut self, name: &str, ne: &[u64], ggml_type: u32, offset: u64) -> Raw {
        self.infos.extend_from_slice(&str_bytes(name));
        self.infos
            .extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&ggml_type.to_le_bytes());
        self.infos.extend_from_slice(&offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    fn data(mut self, n: usize) -> Raw {
        self.data = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kvs);
        out.extend_from_slice(&self.infos);
        while !out.len().is_multiple_of(self.alignment) {
            out.push(0);
        }
        out.extend_from_slice(&self.data);
        out
    }
}

fn str_bytes(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

fn open(bytes: &[u8]) -> Result<GgufFile> {
    GgufFile::from_bytes(bytes, "test.gguf")
}

/// Asserts the bytes are rejected with a model error whose message contains `needle`.
fn rejects(bytes: &[u8], needle: &str) {
    match open(bytes) {
        Ok(_) => panic!("accepted a file that should fail with `{needle}`"),
        Err(Error::Model { path, msg }) => {
            assert_eq!(path, "test.gguf");
            assert!(
                msg.contains(needle),
                "error `{msg}` does not mention `{needle}`"
            );
        }
        Err(e) => panic!("wrong error kind: {e}"),
    }
}

fn every_value() -> Vec<(&'static str, Value)> {
    let arr = |elem_type, values| Value::Array(Array { elem_type, values });
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo <|im_start|>\n".into())),
        ("t.u64", Value::U64(u64::MAX - 3)),
        ("t.i64", Value::I64(i64::MIN + 5)),
        ("t.f64", Value::F64(-2.25e300)),
        ("t.empty", arr(ValueType::F32, vec![])),
        (
            "t.strs",
            arr(
                ValueType::String,
                vec![Value::String("a b".into()), Value::String("".into())],
            ),
        ),
        (
            "t.i32s",
            arr(
                ValueType::I32,
                vec![Value::I32(1), Value::I32(-3), Value::I32(3)],
            ),
        ),
        (
            "t.nested",
            arr(
                ValueType::Array,
                vec![
                    arr(ValueType::U8, vec![Value::U8(1), Value::U8(2)]),
                    arr(ValueType::Bool, vec![Value::Bool(false)]),
                ],
            ),
        ),
    ]
}

#[test]
fn round_trip_metadata_and_tensors() {
    for alignment in [None, Some(64u32), Some(8)] {
        let mut w = GgufWriter::new();
        for (k, v) in every_value() {
            w.add(k, v).unwrap();
        }
        if let Some(a) = alignment {
            w.add_u32(ALIGNMENT_KEY, a).unwrap();
        }
        let f32s: Vec<u8> = crate::testutil::random_f32(6 * 5, 1.0, 3)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let q8: Vec<u8> = (0..3 * 34).map(|i| (i * 13 % 256) as u8).collect();
        let f16s: Vec<u8> = (0..7 * 2).map(|i| i as u8).collect();
        w.add_tensor("a", &[6, 5], DType::F32, f32s.clone())
            .unwrap();
        w.add_tensor("q", &[3, 32], DType::Q8_0, q8.clone())
            .unwrap();
        w.add_tensor("h", &[7], DType::F16, f16s.clone()).unwrap();
        let expect_size = w.file_size();
        let bytes = w.to_bytes().unwrap();
        assert_eq!(bytes.len() as u64, expect_size);
        let f = open(&bytes).unwrap();
        assert_eq!(f.version(), 3);
        let align = u64::from(alignment.unwrap_or(32));
        assert_eq!(f.alignment(), align);
        for (k, v) in every_value() {
            assert_eq!(f.get(k), Some(&v), "key {k}");
        }
        assert_eq!(
            f.metadata().len(),
            every_value().len() + usize::from(alignment.is_some())
        );
        let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "q", "h"]);
        for (name, dims, dtype, data) in [
            ("a", vec![6, 5], DType::F32, &f32s),
            ("q", vec![3, 32], DType::Q8_0, &q8),
            ("h", vec![7], DType::F16, &f16s),
        ] {
            let t = f.tensor(name).unwrap();
            assert_eq!(t.dims_row_major(), dims);
            assert_eq!(t.dtype().unwrap(), dtype);
            assert_eq!(t.file_offset as u64 % align, 0);
            assert_eq!(f.tensor_bytes(t).unwrap(), &data[..]);
        }
        assert_eq!(f.tensor("q").unwrap().ne, vec![32, 3]);
    }
}

#[test]
fn typed_accessors() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    let f = open(&w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i64("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX - 3);
    assert_eq!(f.get_f32("t.f32").unwrap(), 1.5e-5);
    assert!(f.get_bool("t.bool").unwrap());
    assert_eq!(f.get_str("t.string").unwrap(), "héllo <|im_start|>\n");
    assert_eq!(f.get_str_array("t.strs").unwrap(), ["a b", ""]);
    assert_eq!(f.get_i32_array("t.i32s").unwrap(), [1, -3, 3]);
    assert!(f
        .get_u32_array("t.i32s")
        .unwrap_err()
        .to_string()
        .contains("t.i32s"));
    assert_eq!(f.get_f32_array("t.empty").unwrap(), Vec::<f32>::new());
    assert_eq!(f.opt_u32("nope").unwrap(), None);
    assert_eq!(f.opt_str("t.string").unwrap(), Some("héllo <|im_start|>\n"));
    for (key, err) in [
        ("missing.key", f.get_u32("missing.key").unwrap_err()),
        ("t.i32", f.get_u32("t.i32").unwrap_err()),
        ("t.string", f.get_u32("t.string").unwrap_err()),
        ("t.u32", f.get_str("t.u32").unwrap_err()),
        ("t.u32", f.get_f32("t.u32").unwrap_err()),
        ("t.u8", f.get_bool("t.u8").unwrap_err()),
        ("t.i32s", f.get_str_array("t.i32s").unwrap_err()),
        ("t.strs", f.get_f32_array("t.strs").unwrap_err()),
        ("t.u64", f.opt_bool("t.u64").unwrap_err()),
    ] {
        assert!(matches!(err, Error::Model { .. }), "{err}");
        assert!(
            err.to_string().contains(key),
            "`{err}` does not name `{key}`"
        );
    }
    assert!(f.tensor("nope").unwrap_err().to_string().contains("nope"));
}

#[test]
fn version_2_and_hand_made_layout_read() {
    for version in [2, 3] {
        let mut raw = Raw::new()
            .kv("general.architecture", 8, &str_bytes("llama"))
            .tensor("w", &[32, 2], 3, 0)
            .tensor("n", &[3], 0, 64)
            .data(64 + 12);
        raw.version = version;
        let f = open(&raw.bytes()).unwrap();
        assert_eq!(f.version(), version);
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        let w = f.tensor("w").unwrap();
        assert_eq!(
            (w.dtype().unwrap(), w.n_elems, w.n_bytes),
            (DType::Q4_1, 64, 40)
        );
        assert_eq!(w.dims_row_major(), [2, 32]);
        assert_eq!(
            f.tensor_bytes(f.tensor("n").unwrap()).unwrap(),
            &raw.data[64..76]
        );
        assert_eq!(f.data_offset() % 32, 0);
    }
}

#[test]
fn rejects_bad_headers() {
    let good = Raw::new().bytes();
    assert!(open(&good).is_ok());
    let mut bad = good.clone();
    bad[0] = b'X';
    rejects(&bad, "not a GGUF file");
    for (version, needle) in [
        (1u32, "version 1"),
        (4, "version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut raw = Raw::new();
        raw.version = version;
        rejects(&raw.bytes(), needle);
    }
    for n in [u64::MAX, u64::MAX / 13, 1 << 40, 5] {
        let mut raw = Raw::new();
        raw.n_kv = n;
        rejects(&raw.bytes(), "metadata count");
        let mut raw = Raw::new();
        raw.n_tensors = n;
        rejects(&raw.bytes(), "tensor count");
    }
    rejects(b"GGUF", "shorter than a GGUF header");
    rejects(&[], "shorter than a GGUF header");
}

#[test]
fn rejects_bad_metadata() {
    let huge = u64::MAX.to_le_bytes();
    rejects(
        &Raw::new().kv("k", 13, &[0; 8]).bytes(),
        "unknown value type id 13",
    );
    rejects(&Raw::new().kv("k", 7, &[2]).bytes(), "bool value is 2");
    rejects(&Raw::new().kv("k", 8, &huge).bytes(), "has length");
    let mut arr = 9u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&huge);
    rejects(&Raw::new().kv("k", 9, &arr).bytes(), "array of");
    let mut arr = 99u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&0u64.to_le_bytes());
    rejects(&Raw::new().kv("k", 9, &arr).bytes(), "element type id 99");
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 60).to_le_bytes());
    rejects(
        &Raw::new().kv("k", 9, &arr).bytes(),
        "array of 1152921504606846976 string",
    );
    // Arrays nested deeper than the limit.
    let mut nested = Vec::new();
    for _ in 0..MAX_ARRAY_DEPTH + 1 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&0u32.to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    rejects(
        &Raw::new()
            .kv(
                "deep",
                9,
                &[
                    9u32.to_le_bytes().to_vec(),
                    1u64.to_le_bytes().to_vec(),
                    nested,
                ]
                .concat(),
            )
            .bytes(),
        "nested",
    );
    rejects(
        &Raw::new().kv("k", 4, &[1; 4]).kv("k", 4, &[1; 4]).bytes(),
        "appears twice",
    );
    let mut bad_key = 2u64.to_le_bytes().to_vec();
    bad_key.extend_from_slice(&[0xff, 0xfe]);
    bad_key.extend_from_slice(&4u32.to_le_bytes());
    bad_key.extend_from_slice(&[0; 4]);
    let mut raw = Raw::new();
    raw.kvs = bad_key;
    raw.n_kv = 1;
    rejects(&raw.bytes(), "not valid UTF-8");
    rejects(
        &Raw::new()
            .kv(ALIGNMENT_KEY, 4, &48u32.to_le_bytes())
            .bytes(),
        "not a power of two",
    );
    rejects(
        &Raw::new().kv(ALIGNMENT_KEY, 4, &0u32.to_le_bytes()).bytes(),
        "not a power of two",
    );
    rejects(
        &Raw::new()
            .kv(ALIGNMENT_KEY, 10, &32u64.to_le_bytes())
            .bytes(),
        "expected uint32",
    );
}

#[test]
fn rejects_bad_tensor_infos() {
    let one = |ne: &[u64], ty: u32, off: u64, data: usize| {
        Raw::new().tensor("t", ne, ty, off).data(data).bytes()
    };
    rejects(&one(&[4], 4, 0, 64), "unknown ggml type id 4");
    rejects(&one(&[4], 1000, 0, 64), "unknown ggml type id 1000");
    rejects(&one(&[1, 2, 3, 4, 5], 0, 0, 480), "5 dimensions");
    rejects(&one(&[u64::MAX, 2], 0, 0, 64), "overflows");
    rejects(&one(&[1 << 32, 1 << 32], 0, 0, 64), "overflows");
    rejects(&one(&[33], 2, 0, 64), "whole number");
    rejects(&one(&[16, 2], 2, 0, 64), "row length 16");
    rejects(&one(&[4], 0, 8, 64), "not a multiple of the alignment");
    rejects(&one(&[4], 0, 64, 64), "runs past the end");
    rejects(&one(&[4], 0, u64::MAX - 31, 64), "runs past the end");
    rejects(&one(&[16], 0, 0, 63), "runs past the end");
    let two = Raw::new()
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[4], 0, 32)
        .data(96)
        .bytes();
    rejects(&two, "overlap");
    let dup = Raw::new()
        .tensor("a", &[4], 0, 0)
        .tensor("a", &[4], 0, 32)
        .data(64)
        .bytes();
    rejects(&dup, "appears twice");
    let mut long_name = Raw::new();
    long_name.infos = u64::MAX.to_le_bytes().to_vec();
    long_name.n_tensors = 1;
    rejects(&long_name.data(64).bytes(), "the name of tensor #0");
}

#[test]
fn known_but_unsupported_ggml_types_load() {
    // Q5_1 (type 7): its size is known, so the file loads; only asking for its dtype fails.
    let f = open(&Raw::new().tensor("q5", &[64], 7, 0).data(48).bytes()).unwrap();
    let t = f.tensor("q5").unwrap();
    assert_eq!(t.n_bytes, 48);
    let err = t.dtype().unwrap_err().to_string();
    assert!(err.contains("q5") && err.contains("Q5_1"), "{err}");
}

#[test]
fn q5_0_tensors_read_as_q5_0_and_write_as_type_6() {
    // Hand-made: type 6, 2 rows of 32 values in 2 blocks of 22 bytes.
    let f = open(&Raw::new().tensor("h", &[32, 2], 6, 0).data(44).bytes()).unwrap();
    let t = f.tensor("h").unwrap();
    assert_eq!((t.dtype().unwrap(), t.n_bytes), (DType::Q5_0, 44));
    assert_eq!(t.ggml_type, GgmlType::Q5_0);
    // Written by the writer and read back: the same type id and bytes.
    let mut w = GgufWriter::new();
    let blocks: Vec<u8> = (0..3 * 22).map(|i| (i * 29 % 251) as u8).collect();
    w.add_tensor("w", &[3, 32], DType::Q5_0, blocks.clone())
        .unwrap();
    let f = open(&w.to_bytes().unwrap()).unwrap();
    let t = f.tensor("w").unwrap();
    assert_eq!(
        (t.ggml_type, t.dtype().unwrap()),
        (GgmlType(6), DType::Q5_0)
    );
    assert_eq!(t.dims_row_major(), [3, 32]);
    assert_eq!(f.tensor_bytes(t).unwrap(), &blocks[..]);
    assert_eq!(GgmlType::from_dtype(DType::Q5_0), Some(GgmlType::Q5_0));
    assert_eq!(GgmlType::Q5_0.layout(), Some(("Q5_0", 32, 22)));
}

#[test]
fn every_truncation_is_an_error() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    w.add_tensor("a", &[2, 32], DType::Q4_0, vec![7u8; 36])
        .unwrap();
    w.add_tensor("b", &[3], DType::F32, vec![1u8; 12]).unwrap();
    let bytes = w.to_bytes().unwrap();
    assert!(open(&bytes).is_ok());
    for len in 0..bytes.len() {
        assert!(
            open(&bytes[..len]).is_err(),
            "a file cut to {len} of {} bytes was accepted",
            bytes.len()
        );
    }
}

#[test]
fn random_mutations_never_panic() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    w.add_tensor("a", &[2, 32], DType::Q8_0, vec![3u8; 68])
        .unwrap();
    w.add_tensor("b", &[4, 4], DType::F16, vec![1u8; 32])
        .unwrap();
    let bytes = w.to_bytes().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..3000 {
        let mut m = bytes.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..m.len());
            match rng.random_range(0..3) {
                0 => m[i] = rng.random::<u8>(),
                1 => m[i] = [0x00, 0xff, 0x7f, 0x80][rng.random_range(0..4)],
                _ => m.truncate(i.max(1)),
            }
        }
        match open(&m) {
            Ok(f) => {
                accepted += 1;
                for t in f.tensors() {
                    assert_eq!(f.tensor_bytes(t).unwrap().len(), t.n_bytes);
                }
            }
            Err(Error::Model { .. }) => rejected += 1,
            Err(e) => panic!("unexpected error kind {e}"),
        }
    }
    assert!(
        accepted > 0 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}
