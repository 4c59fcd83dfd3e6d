//! Hostile GGUF files: thousands of mutated copies of a small valid file, each of which must be
//! rejected with an error or load correctly, with no panic and no outsized allocation.
//!
//! Every case is generated from its own seed (`SEED + case`), so a failure replays alone:
//! `GGUF_FUZZ_CASE=<case> cargo test --release --test gguf_fuzz` runs just that case (and
//! `GGUF_FUZZ_SEED=<seed>` changes the base seed, `GGUF_FUZZ_CASES=<n>` the number of cases).
//!
//! Allocation bound: while a file is parsed, no single allocation may exceed
//! `64 KiB + size_of::<Value>() * file_len` bytes. The parsed form keeps one [`Value`] per array
//! element, and the smallest element on disk is one byte (a `uint8` or `bool`), so a valid file that
//! is one big `uint8` array needs exactly `size_of::<Value>()` bytes per file byte in one `Vec`;
//! anything beyond that (a count or length taken from the file and trusted) is a bug. The 64 KiB
//! covers fixed-size bookkeeping (error messages, map nodes) for tiny files. The peak of live bytes
//! allocated during the parse is also bounded, by `64 KiB + 4 * size_of::<Value>() * file_len`.
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use onepass::model::gguf::{Array, GgmlType, GgufFile, Value, ValueType};
use onepass::model::gguf_write::GgufWriter;
use onepass::DType;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod gguf_mutate;
use gguf_mutate::{get, map_of, mutate, put, Kind, Map};

// ---------------------------------------------------------------------------------------------
// Counting allocator (per thread, so parallel tests do not disturb each other).

struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            LARGEST.with(|l| l.set(l.get().max(size)));
            LIVE.with(|live| {
                let now = live.get() + size as isize;
                live.set(now);
                PEAK.with(|p| p.set(p.get().max(now)));
            });
        }
    });
}

fn note_free(size: usize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            LIVE.with(|live| live.set(live.get() - size as isize));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping only touches
// const-initialised thread-local cells, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract (a non-zero size).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        // SAFETY: `ptr` came from this allocator, which is `System` underneath, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_free(layout.size());
        note_alloc(new_size);
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s contract on `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` with allocation tracking on; returns its result, the largest single allocation and
/// the peak of live bytes allocated inside `f`.
fn tracked<T>(f: impl FnOnce() -> T) -> (T, usize, isize) {
    LARGEST.with(|l| l.set(0));
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    TRACKING.with(|t| t.set(true));
    let out = f();
    TRACKING.with(|t| t.set(false));
    (out, LARGEST.with(Cell::get), PEAK.with(Cell::get))
}

fn largest_allowed(len: usize) -> usize {
    64 * 1024 + std::mem::size_of::<Value>() * len
}

fn peak_allowed(len: usize) -> isize {
    (64 * 1024 + 4 * std::mem::size_of::<Value>() * len) as isize
}

// ---------------------------------------------------------------------------------------------
// The valid base file and a map of its fields.

fn arr(elem_type: ValueType, values: Vec<Value>) -> Value {
    Value::Array(Array { elem_type, values })
}

/// A small valid GGUF: a key of every value type, arrays (nested, empty), and tensors of several
/// dtypes.
fn base_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let kvs: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.alignment", Value::U32(32)),
        ("t.u8", Value::U8(7)),
        ("t.i8", Value::I8(-7)),
        ("t.u16", Value::U16(700)),
        ("t.i16", Value::I16(-700)),
        ("t.u32", Value::U32(70_000)),
        ("t.i32", Value::I32(-70_000)),
        ("t.f32", Value::F32(1.5)),
        ("t.bool", Value::Bool(true)),
        ("t.u64", Value::U64(1 << 40)),
        ("t.i64", Value::I64(-(1 << 40))),
        ("t.f64", Value::F64(-2.25)),
        (
            "t.strs",
            arr(
                ValueType::String,
                ["a", "bc", "", "déf"]
                    .iter()
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            ),
        ),
        (
            "t.bytes",
            arr(ValueType::U8, (0..9).map(Value::U8).collect()),
        ),
        (
            "t.f32s",
            arr(ValueType::F32, vec![Value::F32(0.5), Value::F32(-3.0)]),
        ),
        ("t.empty", arr(ValueType::I64, vec![])),
        (
            "t.nested",
            arr(
                ValueType::Array,
                vec![
                    arr(ValueType::I32, vec![Value::I32(1), Value::I32(-2)]),
                    arr(ValueType::I32, vec![]),
                    arr(
                        ValueType::Array,
                        vec![arr(ValueType::Bool, vec![Value::Bool(false)])],
                    ),
                ],
            ),
        ),
    ];
    for (k, v) in kvs {
        w.add(k, v).unwrap();
    }
    let f32s: Vec<u8> = (0..32)
        .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
        .collect();
    w.add_tensor("w.f32", &[4, 8], DType::F32, f32s).unwrap();
    let f16s: Vec<u8> = (0..64u16).flat_map(|i| (i * 3).to_le_bytes()).collect();
    w.add_tensor("w.f16", &[2, 32], DType::F16, f16s).unwrap();
    let q8: Vec<u8> = (0..2 * 34).map(|i| (i * 5 % 251) as u8).collect();
    w.add_tensor("w.q8_0", &[2, 32], DType::Q8_0, q8).unwrap();
    let q4: Vec<u8> = (0..2 * 18).map(|i| (i * 11 % 251) as u8).collect();
    w.add_tensor("w.q4_0", &[64], DType::Q4_0, q4).unwrap();
    let ids: Vec<u8> = (0..3i32).flat_map(|i| (i - 1).to_le_bytes()).collect();
    w.add_tensor("ids", &[3], DType::I32, ids).unwrap();
    let q5: Vec<u8> = (0..24).map(|i| i as u8).collect();
    w.add_tensor_ggml("w.q5_1", &[32], GgmlType(7), q5).unwrap();
    w.add_tensor("w.bf16", &[1, 1, 2, 2], DType::BF16, vec![1u8; 8])
        .unwrap();
    w.to_bytes().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Loading and checking one file.

fn touch_value(v: &Value, acc: &mut u64) {
    *acc = acc.wrapping_add(v.describe().len() as u64);
    if let Some(i) = v.as_integer() {
        *acc = acc.wrapping_add(i as u64);
    }
    if let Some(f) = v.as_float() {
        *acc = acc.wrapping_add(f.to_bits());
    }
    if let Some(s) = v.as_str() {
        *acc = acc.wrapping_add(s.len() as u64);
    }
    if let Some(a) = v.as_array() {
        for e in &a.values {
            assert_eq!(
                e.value_type(),
                a.elem_type,
                "array element of the wrong type"
            );
            touch_value(e, acc);
        }
    }
}

/// Checks a file that loaded: every tensor lies inside the file, aligned, with the byte size its
/// type and shape give, no two overlap, and every accessor answers without panicking.
fn check_loaded(f: &GgufFile, len: usize) -> u64 {
    let mut acc = 0u64;
    assert!(f.version() == 2 || f.version() == 3);
    assert!(f.alignment().is_power_of_two());
    for (key, v) in f.metadata() {
        touch_value(v, &mut acc);
        // Typed accessors must answer (Ok or Err), whatever the value's type.
        let _ = f.get_u32(key);
        let _ = f.get_u64(key);
        let _ = f.get_i64(key);
        let _ = f.get_f32(key);
        let _ = f.get_bool(key);
        let _ = f.get_str(key);
        let _ = f.get_str_array(key);
        let _ = f.get_i32_array(key);
        let _ = f.get_u32_array(key);
        let _ = f.get_f32_array(key);
    }
    let mut spans = vec![];
    for t in f.tensors() {
        let bytes = f
            .tensor_bytes(t)
            .expect("a loaded tensor's bytes are in the file");
        assert_eq!(bytes.len(), t.n_bytes);
        assert!(t.file_offset + t.n_bytes <= len);
        assert_eq!(
            t.file_offset as u64 % f.alignment(),
            0,
            "tensor `{}` unaligned",
            t.name
        );
        assert!(t.ne.len() <= 4);
        let elems =
            t.ne.iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .unwrap();
        assert_eq!(elems, t.n_elems as u64);
        assert_eq!(t.ggml_type.bytes_for(elems), Some(t.n_bytes as u64));
        acc = bytes
            .iter()
            .fold(acc, |a, &x| a.wrapping_mul(31).wrapping_add(x as u64));
        match t.dtype() {
            Ok(d) => acc = acc.wrapping_add(d.name().len() as u64),
            Err(e) => assert!(
                !e.to_string().contains('\n'),
                "dtype error is not one line: {e}"
            ),
        }
        acc = acc.wrapping_add(t.dims_row_major().len() as u64);
        assert_eq!(f.tensor(&t.name).unwrap().name, t.name);
        if t.n_bytes > 0 {
            spans.push((t.file_offset, t.file_offset + t.n_bytes, t.name.clone()));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "tensors `{}` and `{}` overlap",
            w[0].2,
            w[1].2
        );
    }
    acc
}

/// Loads one image: returns whether it loaded, after checking the allocation bounds.
fn load_one(bytes: &[u8], what: &str) -> std::result::Result<bool, String> {
    let (res, largest, peak) = tracked(|| GgufFile::from_bytes(bytes, "fuzz.gguf"));
    if largest > largest_allowed(bytes.len()) {
        return Err(format!(
            "{what}: an allocation of {largest} bytes while parsing a {}-byte file (bound {})",
            bytes.len(),
            largest_allowed(bytes.len())
        ));
    }
    if peak > peak_allowed(bytes.len()) {
        return Err(format!(
            "{what}: {peak} live bytes while parsing a {}-byte file (bound {})",
            bytes.len(),
            peak_allowed(bytes.len())
        ));
    }
    match res {
        Ok(f) => {
            check_loaded(&f, bytes.len());
            Ok(true)
        }
        Err(e) => {
            let msg = e.to_string();
            if msg.is_empty() || msg.contains('\n') {
                return Err(format!("{what}: error message is not one line: {msg:?}"));
            }
            Ok(false)
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

const DEFAULT_SEED: u64 = 0x6767_7566_2024;
const DEFAULT_CASES: u64 = 12_000;

/// The mutated image of case `case`.
fn case_bytes(seed: u64, case: u64, base: &[u8], map: &Map) -> (Vec<u8>, Vec<String>) {
    let mut r = ChaCha8Rng::seed_from_u64(seed.wrapping_add(case));
    let mut b = base.to_vec();
    let n_mut = [1, 1, 1, 2, 3][r.random_range(0..5)];
    let mut what = vec![];
    for _ in 0..n_mut {
        if b.is_empty() {
            break;
        }
        what.push(mutate(&mut r, &mut b, map, base.len()));
    }
    (b, what)
}

#[test]
fn mutated_files_are_rejected_or_load_correctly() {
    let base = base_file();
    let map = map_of(&base);
    // The base itself loads, with every tensor.
    let f = GgufFile::from_bytes(&base, "base.gguf").unwrap();
    assert_eq!(f.tensors().len(), 7);
    assert_eq!(load_one(&base, "base"), Ok(true));

    let seed = env_u64("GGUF_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases: Vec<u64> = match env_u64("GGUF_FUZZ_CASE") {
        Some(c) => vec![c],
        None => (0..env_u64("GGUF_FUZZ_CASES").unwrap_or(DEFAULT_CASES)).collect(),
    };
    let dir = std::env::temp_dir().join(format!("onepass-gguf-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut loaded, mut rejected, mut failures) = (0u64, 0u64, vec![]);
    for &case in &cases {
        let (bytes, what) = case_bytes(seed, case, &base, &map);
        let id = format!("seed {seed:#x} case {case} ({})", what.join("; "));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mem = load_one(&bytes, &id)?;
            // A sample also goes through the file path; it must agree with the in-memory parse.
            if case % 50 == 0 {
                let path = dir.join(format!("case{case}.gguf"));
                std::fs::write(&path, &bytes).unwrap();
                let disk = GgufFile::open(&path);
                std::fs::remove_file(&path).unwrap();
                if disk.is_ok() != mem {
                    return Err(format!(
                        "{id}: open gives {disk:?}, from_bytes loaded={mem}"
                    ));
                }
                if let Ok(f) = disk {
                    check_loaded(&f, bytes.len());
                }
            }
            Ok(mem)
        }));
        match outcome {
            Ok(Ok(true)) => loaded += 1,
            Ok(Ok(false)) => rejected += 1,
            Ok(Err(msg)) => failures.push(msg),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{id}: PANIC {msg}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "gguf fuzz: seed {seed:#x}, {} cases: {loaded} loaded, {rejected} rejected, {} failures",
        cases.len(),
        failures.len()
    );
    for f in failures.iter().take(20) {
        eprintln!("  {f}");
    }
    assert!(
        failures.is_empty(),
        "{} failing cases; first: {}",
        failures.len(),
        failures[0]
    );
    if cases.len() > 1000 {
        // The generator must exercise both outcomes, or it is not testing anything.
        assert!(
            loaded > 100 && rejected > 1000,
            "{loaded} loaded, {rejected} rejected"
        );
    }
}

#[test]
fn every_prefix_is_rejected() {
    let base = base_file();
    let map = map_of(&base);
    for cut in 0..base.len() {
        let res = catch_unwind(|| load_one(&base[..cut], &format!("prefix {cut}")));
        match res {
            Ok(Ok(false)) => {}
            Ok(Ok(true)) => {
                // Only a cut inside the trailing padding of the last tensor could load; the base
                // ends exactly at its last tensor's data, so no proper prefix may load.
                panic!("prefix of {cut} bytes loaded");
            }
            Ok(Err(msg)) => panic!("{msg}"),
            Err(_) => panic!("prefix of {cut} bytes panicked"),
        }
    }
    // The section boundaries the generator uses are all inside the file.
    assert!(map.boundaries.iter().all(|&b| b < base.len()));
    assert!(map.boundaries.len() > 40);
}

fn with_field(kind: Kind, nth: usize, v: u64) -> std::result::Result<GgufFile, String> {
    let mut b = base_file();
    let map = map_of(&b);
    let f = *map
        .fields
        .iter()
        .filter(|f| f.kind == kind)
        .nth(nth)
        .unwrap();
    put(&mut b, f.pos, f.width, v);
    let ok = load_one(&b, &format!("{kind:?} #{nth} = {v}"))?;
    let res = GgufFile::from_bytes(&b, "t.gguf");
    assert_eq!(res.is_ok(), ok);
    res.map_err(|e| e.to_string())
}

fn rejected(kind: Kind, nth: usize, v: u64, needle: &str) {
    match with_field(kind, nth, v) {
        Ok(_) => panic!("{kind:?} #{nth} = {v:#x} loaded"),
        Err(msg) => assert!(
            msg.contains(needle),
            "{kind:?} #{nth} = {v:#x}: error `{msg}` does not mention `{needle}`"
        ),
    }
}

#[test]
fn targeted_corruptions_give_specific_errors() {
    rejected(Kind::TensorCount, 0, u64::MAX, "tensor count");
    rejected(Kind::KvCount, 0, 1 << 40, "metadata count");
    rejected(Kind::StrLen, 0, u64::MAX, "length");
    rejected(Kind::ArrayCount, 0, u64::MAX / 8 + 1, "cannot fit");
    rejected(Kind::ValueType, 0, 13, "unknown value type");
    rejected(
        Kind::ArrayType,
        0,
        0xffff_ffff,
        "unknown array element type",
    );
    rejected(Kind::Alignment, 0, 0, "power of two");
    rejected(Kind::Alignment, 0, 24, "power of two");
    rejected(Kind::Alignment, 0, 1 << 31, "alignment");
    rejected(Kind::NDims, 0, 5, "dimensions");
    rejected(Kind::NDims, 0, 0xffff_ffff, "dimensions");
    rejected(Kind::Dim, 0, 1 << 62, "overflows");
    rejected(Kind::Dim, 1, u64::MAX, "overflows");
    rejected(Kind::GgmlType, 0, 4, "unknown ggml type");
    rejected(Kind::GgmlType, 0, 1000, "unknown ggml type");
    rejected(Kind::Offset, 0, 1 << 40, "past the end");
    rejected(Kind::Offset, 0, 1, "alignment");
    rejected(Kind::Version, 0, 1, "version 1");
    rejected(Kind::Version, 0, 0x0300_0000, "big-endian");
    // Tensor 1 moved onto tensor 0's bytes: an overlap.
    let first = base_file();
    let map = map_of(&first);
    let off0 = get(
        &first,
        map.fields
            .iter()
            .find(|f| f.kind == Kind::Offset)
            .unwrap()
            .pos,
        8,
    );
    rejected(Kind::Offset, 1, off0, "overlap");
    // Valid changes still load: a larger alignment that the layout already satisfies is not one,
    // but alignment 1 and 16 divide every offset (all multiples of 32) — except that the data
    // section then starts earlier, moving every tensor; so they are rejected or load consistently.
    for a in [1u64, 16, 64] {
        if let Ok(f) = with_field(Kind::Alignment, 0, a) {
            assert_eq!(f.alignment(), a);
        }
    }
    // A different but known ggml type of the same byte size loads with that type.
    let f = with_field(Kind::GgmlType, 3, 20).unwrap(); // Q4_0 -> IQ4_NL (32 values, 18 bytes)
    assert_eq!(f.tensors()[3].ggml_type, GgmlType(20));
    assert!(f.tensors()[3].dtype().is_err());
}

#[test]
fn largest_valid_amplification_stays_within_the_bound() {
    // One big uint8 array: the worst valid case for parsed size per file byte.
    let mut w = GgufWriter::new();
    w.add(
        "big",
        arr(
            ValueType::U8,
            (0..200_000u32).map(|i| Value::U8(i as u8)).collect(),
        ),
    )
    .unwrap();
    let bytes = w.to_bytes().unwrap();
    assert_eq!(load_one(&bytes, "big uint8 array"), Ok(true));
    // The same file with the count raised past what is there is rejected before allocating.
    let map = map_of(&bytes);
    let f = map
        .fields
        .iter()
        .find(|f| f.kind == Kind::ArrayCount)
        .unwrap();
    let mut bad = bytes.clone();
    put(&mut bad, f.pos, 8, bytes.len() as u64);
    let (res, largest, _) = tracked(|| GgufFile::from_bytes(&bad, "t"));
    assert!(res.is_err());
    assert!(
        largest < 64 * 1024,
        "rejected file still allocated {largest} bytes"
    );
}

#[test]
fn names_from_the_file_never_break_an_error_line() {
    // A key with a newline and a terminal escape, whose value type is unknown.
    let mut w = GgufWriter::new();
    w.add("bad\nkey\u{1b}[2J", Value::U8(1)).unwrap();
    let mut b = w.to_bytes().unwrap();
    let map = map_of(&b);
    let ty = map
        .fields
        .iter()
        .find(|f| f.kind == Kind::ValueType)
        .unwrap();
    put(&mut b, ty.pos, 4, 99);
    let e = GgufFile::from_bytes(&b, "t.gguf").unwrap_err().to_string();
    assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e:?}");
    assert!(e.contains("bad\\nkey"), "{e:?}");
    // A tensor name with a newline, of a type onepass cannot compute with: the file loads, and
    // asking for the dtype is a one-line error.
    let mut w = GgufWriter::new();
    w.add_tensor_ggml("t\nq5", &[32], GgmlType(7), vec![0u8; 24])
        .unwrap();
    let f = GgufFile::from_bytes(&w.to_bytes().unwrap(), "t.gguf").unwrap();
    let e = f.tensors()[0].dtype().unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e:?}");
    // A megabyte-long key in an error is cut short.
    let mut w = GgufWriter::new();
    w.add(&"k".repeat(1 << 20), Value::U8(1)).unwrap();
    let mut b = w.to_bytes().unwrap();
    let map = map_of(&b);
    let ty = map
        .fields
        .iter()
        .find(|f| f.kind == Kind::ValueType)
        .unwrap();
    put(&mut b, ty.pos, 4, 99);
    let e = GgufFile::from_bytes(&b, "t.gguf").unwrap_err().to_string();
    assert!(e.len() < 4096, "error of {} bytes", e.len());
}
