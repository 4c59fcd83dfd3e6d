//! GGUF reader: a memory-mapped model file with typed metadata and zero-copy tensor slices.
//!
//! Versions 2 and 3 (little-endian) are read. Everything in the header is checked against the
//! file's size before anything is allocated, so a damaged or hostile file gives an
//! [`Error::Model`] naming the problem (and the key or tensor it concerns) and never a panic or a
//! huge allocation.
//!
//! Tensor types: a tensor whose ggml type id is one that ggml defines (see [`GgmlType`]) loads even
//! when onepass has no [`DType`] for it (its byte size is known, so its extent is validated); asking
//! for its dtype ([`TensorInfo::dtype`]) is then the error. A type id ggml does not define makes
//! the whole file fail to open, because the tensor's byte size and hence the file's layout cannot
//! be checked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::backend::DType;
use crate::error::{Error, Result};

#[path = "gguf_value.rs"]
mod value;
pub use value::{Array, Value, ValueType};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the data-section alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// The deepest nesting of arrays inside arrays that the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// A ggml tensor type id, with the block layout of every type ggml defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// `F32`.
    pub const F32: GgmlType = GgmlType(0);
    /// `F16`.
    pub const F16: GgmlType = GgmlType(1);
    /// `Q4_0`.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// `Q4_1`.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// `Q5_0`.
    pub const Q5_0: GgmlType = GgmlType(6);
    /// `Q8_0`.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// `Q4_K`.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// `Q6_K`.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// `BF16`.
    pub const BF16: GgmlType = GgmlType(30);

    /// `(name, values per block, bytes per block)` for the ids ggml defines; `None` otherwise
    /// (including the retired ids 4, 5, 31-33 and 36-38).
    pub fn layout(self) -> Option<(&'static str, usize, usize)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 36),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            16 => ("IQ2_XXS", 256, 66),
            17 => ("IQ2_XS", 256, 74),
            18 => ("IQ3_XXS", 256, 98),
            19 => ("IQ1_S", 256, 50),
            20 => ("IQ4_NL", 32, 18),
            21 => ("IQ3_S", 256, 110),
            22 => ("IQ2_S", 256, 82),
            23 => ("IQ4_XS", 256, 136),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            29 => ("IQ1_M", 256, 56),
            30 => ("BF16", 1, 2),
            34 => ("TQ1_0", 256, 54),
            35 => ("TQ2_0", 256, 66),
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }

    /// The ggml name (`Q4_1`), or `type <id>` for an id ggml does not define.
    pub fn name(self) -> String {
        match self.layout() {
            Some((name, _, _)) => name.to_string(),
            None => format!("type {}", self.0),
        }
    }

    /// The onepass dtype for this ggml type, if onepass supports it.
    pub fn dtype(self) -> Option<DType> {
        Some(match self.0 {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            8 => DType::Q8_0,
            12 => DType::Q4K,
            14 => DType::Q6K,
            26 => DType::I32,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The ggml type that stores a onepass dtype, if there is one (`U32` and `U8` have none).
    pub fn from_dtype(dtype: DType) -> Option<GgmlType> {
        Some(match dtype {
            DType::F32 => GgmlType::F32,
            DType::F16 => GgmlType::F16,
            DType::BF16 => GgmlType::BF16,
            DType::I32 => GgmlType(26),
            DType::Q4_0 => GgmlType::Q4_0,
            DType::Q4_1 => GgmlType::Q4_1,
            DType::Q5_0 => GgmlType::Q5_0,
            DType::Q8_0 => GgmlType::Q8_0,
            DType::Q4K => GgmlType::Q4_K,
            DType::Q6K => GgmlType::Q6_K,
            DType::U32 | DType::U8 => return None,
        })
    }

    /// Bytes for `elems` values, or `None` for an unknown type, a partial block or an overflow.
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        let (_, block_elems, block_bytes) = self.layout()?;
        let (block_elems, block_bytes) = (block_elems as u64, block_bytes as u64);
        if !elems.is_multiple_of(block_elems) {
            return None;
        }
        (elems / block_elems).checked_mul(block_bytes)
    }
}

/// One tensor's entry in the file: name, shape, type and where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The dimensions in GGUF order: `ne[0]` first, the contiguous one.
    pub ne: Vec<u64>,
    /// The ggml type id.
    pub ggml_type: GgmlType,
    /// The offset of the data relative to the start of the data section, as stored.
    pub offset: u64,
    /// The absolute offset of the data in the file.
    pub file_offset: usize,
    /// The number of elements (product of the dimensions).
    pub n_elems: usize,
    /// The number of bytes of data.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// The onepass dtype of the tensor; an error for a ggml type onepass does not support.
    pub fn dtype(&self) -> Result<DType> {
        self.ggml_type.dtype().ok_or_else(|| {
            Error::Unsupported(format!(
                "tensor `{}` has ggml type {} ({}), which onepass does not support",
                printable(&self.name),
                self.ggml_type.name(),
                self.ggml_type.0
            ))
        })
    }

    /// The dimensions in row-major order (outermost first, the contiguous dimension last): the
    /// reverse of the GGUF order. A matrix stored as `ne = [in, out]` gives `[out, in]`.
    pub fn dims_row_major(&self) -> Vec<usize> {
        // Every dimension was checked at load to fit in usize (its product does).
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file: parsed metadata and tensor infos over a shared read-only memory map.
#[derive(Debug, Clone)]
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    version: u32,
    alignment: u64,
    data_offset: usize,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl GgufFile {
    /// Opens and validates a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len < 24 {
            return Err(model_err(
                path,
                format!("file is {len} bytes, shorter than a GGUF header (24)"),
            ));
        }
        // SAFETY: the map is read-only. As with every memory-mapped file, another process that
        // truncates or rewrites the file while it is mapped can change what we read (or make a read
        // fault); model files are not expected to change while in use.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::from_map(path.to_path_buf(), Arc::new(map))
    }

    /// Parses a GGUF image held in memory (copied into an anonymous map). `name` is used in
    /// error messages in place of a path. Useful for tests and fuzzing.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<GgufFile> {
        let path = PathBuf::from(name);
        if bytes.len() < 24 {
            return Err(model_err(
                &path,
                format!(
                    "file is {} bytes, shorter than a GGUF header (24)",
                    bytes.len()
                ),
            ));
        }
        let mut anon = memmap2::MmapMut::map_anon(bytes.len()).map_err(|e| Error::io(&path, e))?;
        anon.copy_from_slice(bytes);
        let map = anon.make_read_only().map_err(|e| Error::io(&path, e))?;
        Self::from_map(path, Arc::new(map))
    }

    fn from_map(path: PathBuf, map: Arc<Mmap>) -> Result<GgufFile> {
        let parsed = parse(&map).map_err(|msg| model_err(&path, msg))?;
        Ok(GgufFile {
            path,
            map,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            by_name: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: parsed.tensors,
        })
    }

    /// The file's path (or the name given to [`GgufFile::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data-section alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The absolute file offset where the data section starts.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The shared memory map of the whole file, for zero-copy device allocations.
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// One metadata value, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor's info by name; an error naming the tensor when there is none.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| self.err(format!("no tensor named `{name}`")))
    }

    /// Whether a tensor of that name exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The tensor's bytes: a slice of the mapped file, no copy.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        info.file_offset
            .checked_add(info.n_bytes)
            .and_then(|end| self.map.get(info.file_offset..end))
            .ok_or_else(|| self.err(format!("tensor `{}` lies outside this file", info.name)))
    }

    /// The error type for this file, with a message.
    pub fn err(&self, msg: impl Into<String>) -> Error {
        model_err(&self.path, msg.into())
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.err(format!("metadata key `{key}` is missing")))
    }

    fn wrong_type(&self, key: &str, want: &str, got: &Value) -> Error {
        self.err(format!(
            "metadata key `{key}` is {}, expected {want}",
            got.describe()
        ))
    }

    fn int_as<T: TryFrom<i128>>(&self, key: &str, v: &Value, want: &str) -> Result<T> {
        let i = v
            .as_integer()
            .ok_or_else(|| self.wrong_type(key, want, v))?;
        T::try_from(i)
            .map_err(|_| self.err(format!("metadata key `{key}` = {i} does not fit in {want}")))
    }

    /// An integer key as `u32` (any integer type whose value fits is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.int_as(key, self.require(key)?, "u32")
    }

    /// An integer key as `u64` (any integer type whose value fits is accepted).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.int_as(key, self.require(key)?, "u64")
    }

    /// An integer key as `i64` (any integer type whose value fits is accepted).
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.int_as(key, self.require(key)?, "i64")
    }

    /// A float key as `f32` (`float32`, or `float64` rounded).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_float()
            .map(|f| f as f32)
            .ok_or_else(|| self.wrong_type(key, "a float", v))
    }

    /// A boolean key.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, "string", v))
    }

    /// `Ok(None)` when the key is missing, else the same as [`GgufFile::get_u32`].
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|_| self.get_u32(key)).transpose()
    }

    /// `Ok(None)` when the key is missing, else the same as [`GgufFile::get_f32`].
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key).map(|_| self.get_f32(key)).transpose()
    }

    /// `Ok(None)` when the key is missing, else the same as [`GgufFile::get_bool`].
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    /// `Ok(None)` when the key is missing, else the same as [`GgufFile::get_str`].
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    fn get_array(&self, key: &str, want: &str) -> Result<&Array> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong_type(key, want, v))
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let want = "an array of strings";
        let a = self.get_array(key, want)?;
        a.values
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong_type(key, want, &Value::Array(a.clone())))
            })
            .collect()
    }

    /// An array of integers as `i32` (any integer element type whose values fit).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let a = self.get_array(key, "an array of integers")?;
        a.values
            .iter()
            .map(|v| self.int_as(key, v, "i32"))
            .collect()
    }

    /// An array of integers as `u32` (any integer element type whose values fit).
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        let a = self.get_array(key, "an array of integers")?;
        a.values
            .iter()
            .map(|v| self.int_as(key, v, "u32"))
            .collect()
    }

    /// An array of floats as `f32` (`float32` or `float64` elements).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let a = self.get_array(key, "an array of floats")?;
        a.values
            .iter()
            .map(|v| {
                v.as_float().map(|f| f as f32).ok_or_else(|| {
                    self.err(format!(
                        "metadata key `{key}` is an array of {}, expected floats",
                        a.elem_type.name()
                    ))
                })
            })
            .collect()
    }
}

fn model_err(path: &Path, msg: String) -> Error {
    Error::Model {
        path: path.display().to_string(),
        msg: printable(&msg),
    }
}

/// The longest message [`printable`] keeps, in characters.
const MAX_MESSAGE_CHARS: usize = 2000;

/// `msg` made safe to print as one line: names read from a file can hold newlines, terminal
/// escapes or megabytes of text, so control characters are escaped and the length is capped.
fn printable(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(MAX_MESSAGE_CHARS + 8));
    for (i, c) in msg.chars().enumerate() {
        if i == MAX_MESSAGE_CHARS {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What [`parse`] finds in a file.
struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: usize,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
}

/// A bounds-checked little-endian cursor over the file's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!(
                "truncated: {} needs {n} bytes at offset {}, but only {} remain",
                what(),
                self.pos,
                self.left()
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], String> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, String> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > self.left() {
            return Err(format!(
                "{} has length {len}, but only {} bytes remain in the file",
                what(),
                self.left()
            ));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{} is not valid UTF-8", what()))
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, String> {
        let what = || format!("the value of `{key}`");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(format!(
                        "metadata key `{key}`: bool value is {b}, not 0 or 1"
                    ))
                }
            },
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "metadata key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let type_id = self.u32(&|| format!("the element type of `{key}`"))?;
                let elem_type = ValueType::from_id(type_id).ok_or_else(|| {
                    format!("metadata key `{key}`: unknown array element type id {type_id}")
                })?;
                let count = self.u64(&|| format!("the element count of `{key}`"))?;
                let need = count.checked_mul(elem_type.min_encoded_len());
                if need.is_none_or(|n| n > self.left()) {
                    return Err(format!(
                        "metadata key `{key}`: array of {count} {} cannot fit in the {} bytes left",
                        elem_type.name(),
                        self.left()
                    ));
                }
                // `count` is now bounded by the file size, so this allocation is too.
                let mut values = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    values.push(self.value(elem_type, key, depth + 1)?);
                }
                Value::Array(Array { elem_type, values })
            }
        })
    }
}

fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut r = Reader { bytes, pos: 0 };
    let magic = r.array::<4>(&|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(format!(
            "not a GGUF file (magic bytes {magic:02x?}, expected \"GGUF\")"
        ));
    }
    let version = r.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => return Err("GGUF version 1 is not supported (only 2 and 3)".into()),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err("big-endian GGUF files are not supported".into());
        }
        v => return Err(format!("unsupported GGUF version {v} (only 2 and 3)")),
    }
    let n_tensors = r.u64(&|| "the tensor count".into())?;
    let n_kv = r.u64(&|| "the metadata count".into())?;
    // Each key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info
    // at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
    if n_kv.checked_mul(13).is_none_or(|n| n > r.left()) {
        return Err(format!(
            "metadata count {n_kv} cannot fit in the {} bytes left",
            r.left()
        ));
    }
    if n_tensors.checked_mul(24).is_none_or(|n| n > r.left()) {
        return Err(format!(
            "tensor count {n_tensors} cannot fit in the {} bytes left",
            r.left()
        ));
    }

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.string(&|| format!("metadata key #{i}"))?;
        let type_id = r.u32(&|| format!("the type of `{key}`"))?;
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| format!("metadata key `{key}`: unknown value type id {type_id}"))?;
        let value = r.value(ty, &key, 0)?;
        if metadata.contains_key(&key) {
            return Err(format!("metadata key `{key}` appears twice"));
        }
        metadata.insert(key, value);
    }

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(Value::U32(a)) => {
            return Err(format!("`{ALIGNMENT_KEY}` = {a} is not a power of two"))
        }
        Some(v) => {
            return Err(format!(
                "`{ALIGNMENT_KEY}` is {}, expected uint32",
                v.describe()
            ))
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = BTreeMap::new();
    for i in 0..n_tensors {
        let name = r.string(&|| format!("the name of tensor #{i}"))?;
        let n_dims = r.u32(&|| format!("the dimension count of tensor `{name}`"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(format!(
                "tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})"
            ));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            ne.push(r.u64(&|| format!("dimension {d} of tensor `{name}`"))?);
        }
        let ggml_type = GgmlType(r.u32(&|| format!("the type of tensor `{name}`"))?);
        let offset = r.u64(&|| format!("the offset of tensor `{name}`"))?;
        let (_, block_elems, _) = ggml_type
            .layout()
            .ok_or_else(|| format!("tensor `{name}` has unknown ggml type id {}", ggml_type.0))?;
        let n_elems = ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(|| {
                format!("tensor `{name}`: the element count of shape {ne:?} overflows")
            })?;
        let n_bytes = ggml_type.bytes_for(n_elems).ok_or_else(|| {
            format!(
                "tensor `{name}`: {n_elems} elements are not a whole number of {}-element {} blocks",
                block_elems,
                ggml_type.name()
            )
        })?;
        if ne.first().is_some_and(|&d| d % block_elems as u64 != 0) {
            return Err(format!(
                "tensor `{name}`: the row length {} is not a multiple of the {} block size {block_elems}",
                ne[0],
                ggml_type.name()
            ));
        }
        if offset % alignment != 0 {
            return Err(format!(
                "tensor `{name}`: offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        if names.insert(name.clone(), i).is_some() {
            return Err(format!("tensor `{name}` appears twice"));
        }
        tensors.push(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
            file_offset: 0,
            n_elems: n_elems as usize,
            n_bytes: usize::try_from(n_bytes)
                .map_err(|_| format!("tensor #{i}: byte size overflows"))?,
        });
    }

    let header_end = r.pos as u64;
    let data_offset = header_end
        .div_ceil(alignment)
        .checked_mul(alignment)
        .ok_or("data offset overflows")?;
    let file_len = bytes.len() as u64;
    if data_offset > file_len && !tensors.is_empty() {
        return Err(format!("the data section would start at {data_offset}, past the end of the {file_len}-byte file"));
    }
    let data_len = file_len.saturating_sub(data_offset);
    for t in &mut tensors {
        let end = t.offset.checked_add(t.n_bytes as u64);
        if end.is_none_or(|e| e > data_len) {
            return Err(format!(
                "tensor `{}`: data at {}+{} bytes runs past the end of the data section ({data_len} bytes)",
                t.name, t.offset, t.n_bytes
            ));
        }
        t.file_offset = (data_offset + t.offset) as usize;
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes as u64 > b.offset {
            return Err(format!("tensors `{}` and `{}` overlap", a.name, b.name));
        }
    }
    Ok(Parsed {
        version,
        alignment,
        data_offset: data_offset.min(file_len) as usize,
        metadata,
        tensors,
    })
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
