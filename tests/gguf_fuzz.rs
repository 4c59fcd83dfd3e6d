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

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use onepass::model::gguf::{Array, GgmlType, GgufFile, Value, ValueType};
use onepass::model::gguf_write::GgufWriter;
use onepass::DType;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_free(layout.size());
        note_alloc(new_size);
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
    let q5: Vec<u8> = (0..22).map(|i| i as u8).collect();
    w.add_tensor_ggml("w.q5_0", &[32], GgmlType(6), q5).unwrap();
    w.add_tensor("w.bf16", &[1, 1, 2, 2], DType::BF16, vec![1u8; 8])
        .unwrap();
    w.to_bytes().unwrap()
}

/// What a header field is, for targeted mutations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Version,
    TensorCount,
    KvCount,
    StrLen,
    ValueType,
    ArrayType,
    ArrayCount,
    NDims,
    Dim,
    GgmlType,
    Offset,
    Alignment,
}

#[derive(Debug, Clone, Copy)]
struct Field {
    pos: usize,
    width: usize,
    kind: Kind,
}

/// Fields of the base file and its section boundaries (offsets where a section ends).
struct Map {
    fields: Vec<Field>,
    boundaries: Vec<usize>,
    data_offset: usize,
}

struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    map: Map,
}

impl Walker<'_> {
    fn field(&mut self, width: usize, kind: Kind) -> u64 {
        self.map.fields.push(Field {
            pos: self.pos,
            width,
            kind,
        });
        let mut v = [0u8; 8];
        v[..width].copy_from_slice(&self.b[self.pos..self.pos + width]);
        self.pos += width;
        u64::from_le_bytes(v)
    }

    fn string(&mut self) -> String {
        let n = self.field(8, Kind::StrLen) as usize;
        let s = String::from_utf8(self.b[self.pos..self.pos + n].to_vec()).unwrap();
        self.pos += n;
        s
    }

    fn value(&mut self, ty: u64, key: &str) {
        match ty {
            0 | 1 | 7 => self.pos += 1,
            2 | 3 => self.pos += 2,
            4..=6 => {
                if key == "general.alignment" {
                    self.field(4, Kind::Alignment);
                } else {
                    self.pos += 4;
                }
            }
            10..=12 => self.pos += 8,
            8 => {
                self.string();
            }
            9 => {
                let et = self.field(4, Kind::ArrayType);
                let n = self.field(8, Kind::ArrayCount);
                for _ in 0..n {
                    self.value(et, key);
                }
            }
            _ => unreachable!("the base file is valid"),
        }
    }
}

fn map_of(b: &[u8]) -> Map {
    let mut w = Walker {
        b,
        pos: 4,
        map: Map {
            fields: vec![],
            boundaries: vec![4],
            data_offset: 0,
        },
    };
    w.field(4, Kind::Version);
    w.map.boundaries.push(w.pos);
    let n_tensors = w.field(8, Kind::TensorCount);
    w.map.boundaries.push(w.pos);
    let n_kv = w.field(8, Kind::KvCount);
    w.map.boundaries.push(w.pos);
    for _ in 0..n_kv {
        let key = w.string();
        w.map.boundaries.push(w.pos);
        let ty = w.field(4, Kind::ValueType);
        w.value(ty, &key);
        w.map.boundaries.push(w.pos);
    }
    for _ in 0..n_tensors {
        w.string();
        w.map.boundaries.push(w.pos);
        let n = w.field(4, Kind::NDims);
        for _ in 0..n {
            w.field(8, Kind::Dim);
        }
        w.field(4, Kind::GgmlType);
        w.field(8, Kind::Offset);
        w.map.boundaries.push(w.pos);
    }
    let data_offset = w.pos.div_ceil(32) * 32;
    w.map.data_offset = data_offset;
    w.map.boundaries.push(data_offset);
    // Inside the data section: every 16 bytes, and the last byte.
    let mut p = data_offset + 16;
    while p < b.len() {
        w.map.boundaries.push(p);
        p += 16;
    }
    w.map.boundaries.push(b.len() - 1);
    w.map
}

// ---------------------------------------------------------------------------------------------
// Mutations.

const INTERESTING_U64: [u64; 14] = [
    0,
    1,
    2,
    5,
    31,
    0x7f,
    0xff,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 62,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX - 1,
    u64::MAX / 24 + 1,
];

/// Writes the low `width` bytes of `v` at `pos` (nothing when an earlier truncation removed it).
fn put(b: &mut [u8], pos: usize, width: usize, v: u64) {
    if pos + width > b.len() {
        return;
    }
    b[pos..pos + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

fn get(b: &[u8], pos: usize, width: usize) -> u64 {
    let mut v = [0u8; 8];
    if pos + width > b.len() {
        return 0;
    }
    v[..width].copy_from_slice(&b[pos..pos + width]);
    u64::from_le_bytes(v)
}

fn pick_field(r: &mut ChaCha8Rng, map: &Map, kinds: &[Kind]) -> Field {
    let fs: Vec<&Field> = map
        .fields
        .iter()
        .filter(|f| kinds.contains(&f.kind))
        .collect();
    *fs[r.random_range(0..fs.len())]
}

/// One mutation of `b`; returns a short description for failure reports.
fn mutate(r: &mut ChaCha8Rng, b: &mut Vec<u8>, map: &Map, len0: usize) -> String {
    let n = b.len();
    match r.random_range(0..12u32) {
        0 => {
            let flips = r.random_range(1..9);
            for _ in 0..flips {
                let p = r.random_range(0..n);
                b[p] ^= 1 << r.random_range(0..8);
            }
            format!("{flips} bit flips")
        }
        1 => {
            let p = r.random_range(0..n);
            let v = [0u8, 0xff, 0x7f, 0x80, 1, b'\n', 0x1b][r.random_range(0..7)];
            b[p] = v;
            format!("byte {p} = {v:#x}")
        }
        2 => {
            // An interesting u64 anywhere (header-heavy: most files are header).
            let v = INTERESTING_U64[r.random_range(0..INTERESTING_U64.len())];
            let w = n.min(8);
            let p = r.random_range(0..=n - w);
            put(b, p, w, v);
            format!("u64 at {p} = {v:#x}")
        }
        3 => {
            // A count or length field set to something huge or off by a little.
            let f = pick_field(
                r,
                map,
                &[
                    Kind::TensorCount,
                    Kind::KvCount,
                    Kind::StrLen,
                    Kind::ArrayCount,
                ],
            );
            let old = get(b, f.pos, f.width);
            let v = match r.random_range(0..4) {
                0 => INTERESTING_U64[r.random_range(0..INTERESTING_U64.len())],
                1 => old.wrapping_add(r.random_range(1..4)),
                2 => old.wrapping_sub(r.random_range(1..4)),
                _ => len0 as u64 + r.random_range(0..64),
            };
            put(b, f.pos, f.width, v);
            format!("{:?} at {} = {v:#x}", f.kind, f.pos)
        }
        4 => {
            let cut = if r.random_bool(0.7) {
                map.boundaries[r.random_range(0..map.boundaries.len())]
            } else {
                r.random_range(0..n)
            };
            b.truncate(cut.min(n));
            format!("truncated to {cut}")
        }
        5 => {
            // A tensor offset past the end, unaligned, or onto another tensor.
            let f = pick_field(r, map, &[Kind::Offset]);
            let other = pick_field(r, map, &[Kind::Offset]);
            let data_len = (len0 - map.data_offset) as u64;
            let v = match r.random_range(0..5) {
                0 => get(b, other.pos, 8),
                1 => data_len,
                2 => data_len - 32,
                3 => get(b, f.pos, 8) + r.random_range(1..40),
                _ => INTERESTING_U64[r.random_range(0..INTERESTING_U64.len())],
            };
            put(b, f.pos, 8, v);
            format!("offset at {} = {v:#x}", f.pos)
        }
        6 => {
            let f = pick_field(r, map, &[Kind::ValueType, Kind::ArrayType]);
            let v = [13u64, 14, 255, 0xffff_ffff, 9, 8, 0, 12][r.random_range(0..8)];
            put(b, f.pos, 4, v);
            format!("{:?} at {} = {v}", f.kind, f.pos)
        }
        7 => {
            let f = pick_field(r, map, &[Kind::GgmlType]);
            let v = [
                4u64,
                5,
                31,
                36,
                40,
                1000,
                0xffff_ffff,
                0,
                1,
                2,
                8,
                12,
                14,
                15,
                39,
                30,
            ][r.random_range(0..16)];
            put(b, f.pos, 4, v);
            format!("ggml type at {} = {v}", f.pos)
        }
        8 => {
            let f = pick_field(r, map, &[Kind::Alignment]);
            let v = [0u64, 1, 3, 8, 24, 64, 1 << 20, 1 << 31, 0xffff_ffff][r.random_range(0..9)];
            put(b, f.pos, 4, v);
            format!("alignment = {v}")
        }
        9 => {
            // Shapes whose product overflows, or zero, or a dims count past 4.
            if r.random_bool(0.3) {
                let f = pick_field(r, map, &[Kind::NDims]);
                let v = [0u64, 1, 2, 3, 4, 5, 8, 0xffff_ffff][r.random_range(0..8)];
                put(b, f.pos, 4, v);
                format!("n_dims at {} = {v}", f.pos)
            } else {
                let f = pick_field(r, map, &[Kind::Dim]);
                let v = [
                    0u64,
                    1 << 32,
                    1 << 33,
                    1 << 62,
                    u64::MAX,
                    u64::MAX / 2 + 1,
                    1 << 31,
                    64,
                    256,
                ][r.random_range(0..9)];
                put(b, f.pos, 8, v);
                format!("dim at {} = {v:#x}", f.pos)
            }
        }
        10 => {
            let f = pick_field(r, map, &[Kind::Version]);
            let v = [0u64, 1, 2, 4, 0x0200_0000, 0x0300_0000, 0xffff_ffff][r.random_range(0..7)];
            put(b, f.pos, 4, v);
            format!("version = {v:#x}")
        }
        _ => {
            // Bytes inserted or removed in the header (everything after shifts).
            let p = r.random_range(0..map.data_offset.min(n));
            if r.random_bool(0.5) {
                let k = r.random_range(1..9);
                for _ in 0..k {
                    b.insert(p, r.random());
                }
                format!("{k} bytes inserted at {p}")
            } else {
                let k = r.random_range(1..9).min(n - p);
                b.drain(p..p + k);
                format!("{k} bytes removed at {p}")
            }
        }
    }
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
    w.add_tensor_ggml("t\nq5", &[32], GgmlType(6), vec![0u8; 22])
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
