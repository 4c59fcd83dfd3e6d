//! A small GGUF version 3 writer: metadata of every type and aligned tensor data.
//!
//! Tensor data is either given as bytes or produced by a closure at write time, one tensor at a
//! time, so a large synthetic model never has to be held in memory whole. [`GgufWriter::write_to`]
//! writes a temporary file next to the target and renames it into place.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use crate::backend::DType;
use crate::error::{Error, Result};
use crate::model::gguf::{
    Array, GgmlType, Value, ValueType, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS,
};

/// Fills one tensor's bytes (the slice has exactly the tensor's byte size) at write time.
pub type TensorProducer<'a> = Box<dyn FnMut(&mut [u8]) -> Result<()> + 'a>;

enum TensorData<'a> {
    Bytes(Cow<'a, [u8]>),
    Producer(TensorProducer<'a>),
}

struct PendingTensor<'a> {
    name: String,
    ne: Vec<u64>,
    ggml_type: GgmlType,
    n_bytes: usize,
    data: TensorData<'a>,
}

/// Builds a GGUF v3 file: add metadata and tensors, then write.
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor<'a>>,
    alignment: u64,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty writer with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            metadata: Vec::new(),
            tensors: Vec::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    /// Adds (or replaces) a metadata value. Setting `general.alignment` (a power-of-two `U32`)
    /// changes the data alignment.
    pub fn add(&mut self, key: &str, value: Value) -> Result<&mut Self> {
        check_value(key, &value, 0)?;
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = u64::from(a),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "`{ALIGNMENT_KEY}` must be a power-of-two uint32, got {value:?}"
                    )))
                }
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        Ok(self)
    }

    /// Adds a `uint32` value.
    pub fn add_u32(&mut self, key: &str, value: u32) -> Result<&mut Self> {
        self.add(key, Value::U32(value))
    }

    /// Adds an `int32` value.
    pub fn add_i32(&mut self, key: &str, value: i32) -> Result<&mut Self> {
        self.add(key, Value::I32(value))
    }

    /// Adds a `float32` value.
    pub fn add_f32(&mut self, key: &str, value: f32) -> Result<&mut Self> {
        self.add(key, Value::F32(value))
    }

    /// Adds a `bool` value.
    pub fn add_bool(&mut self, key: &str, value: bool) -> Result<&mut Self> {
        self.add(key, Value::Bool(value))
    }

    /// Adds a `string` value.
    pub fn add_str(&mut self, key: &str, value: &str) -> Result<&mut Self> {
        self.add(key, Value::String(value.to_string()))
    }

    /// Adds an array of strings.
    pub fn add_str_array<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> Result<&mut Self> {
        let values = values
            .iter()
            .map(|s| Value::String(s.as_ref().to_string()))
            .collect();
        self.add(
            key,
            Value::Array(Array {
                elem_type: ValueType::String,
                values,
            }),
        )
    }

    /// Adds an array of `int32`.
    pub fn add_i32_array(&mut self, key: &str, values: &[i32]) -> Result<&mut Self> {
        let values = values.iter().map(|&v| Value::I32(v)).collect();
        self.add(
            key,
            Value::Array(Array {
                elem_type: ValueType::I32,
                values,
            }),
        )
    }

    /// Adds an array of `float32`.
    pub fn add_f32_array(&mut self, key: &str, values: &[f32]) -> Result<&mut Self> {
        let values = values.iter().map(|&v| Value::F32(v)).collect();
        self.add(
            key,
            Value::Array(Array {
                elem_type: ValueType::F32,
                values,
            }),
        )
    }

    /// The metadata added so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    fn check_tensor(
        &self,
        name: &str,
        dims_row_major: &[usize],
        ggml_type: GgmlType,
    ) -> Result<(Vec<u64>, usize)> {
        let bad =
            |msg: String| Error::InvalidArgument(format!("gguf writer: tensor `{name}`: {msg}"));
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("added twice".into()));
        }
        if dims_row_major.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions (at most {MAX_DIMS})",
                dims_row_major.len()
            )));
        }
        let (_, block_elems, _) = ggml_type
            .layout()
            .ok_or_else(|| bad(format!("unknown ggml type {}", ggml_type.0)))?;
        let ne: Vec<u64> = dims_row_major.iter().rev().map(|&d| d as u64).collect();
        if ne.first().is_some_and(|&d| d % block_elems as u64 != 0) {
            return Err(bad(format!(
                "row length {} is not a multiple of the block size {block_elems}",
                ne[0]
            )));
        }
        let n_bytes = ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| ggml_type.bytes_for(n))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| bad(format!("shape {dims_row_major:?} overflows")))?;
        Ok((ne, n_bytes))
    }

    /// Adds a tensor of a onepass dtype; `dims_row_major` lists the outermost dimension first
    /// (a `[out, in]` matrix is stored as GGUF `ne = [in, out]`). `bytes` must be exactly the size.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims_row_major: &[usize],
        dtype: DType,
        bytes: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self> {
        let ggml_type = GgmlType::from_dtype(dtype).ok_or_else(|| {
            Error::InvalidArgument(format!("gguf writer: dtype {dtype} has no ggml type"))
        })?;
        self.add_tensor_ggml(name, dims_row_major, ggml_type, bytes)
    }

    /// Adds a tensor of any ggml type ggml defines (for tests of types onepass cannot compute with).
    pub fn add_tensor_ggml(
        &mut self,
        name: &str,
        dims_row_major: &[usize],
        ggml_type: GgmlType,
        bytes: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self> {
        let (ne, n_bytes) = self.check_tensor(name, dims_row_major, ggml_type)?;
        let bytes = bytes.into();
        if bytes.len() != n_bytes {
            return Err(Error::InvalidArgument(format!(
                "gguf writer: tensor `{name}` of shape {dims_row_major:?} {} needs {n_bytes} bytes, got {}",
                ggml_type.name(),
                bytes.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ne,
            ggml_type,
            n_bytes,
            data: TensorData::Bytes(bytes),
        });
        Ok(self)
    }

    /// Adds a tensor whose bytes `producer` fills when the file is written.
    pub fn add_tensor_with(
        &mut self,
        name: &str,
        dims_row_major: &[usize],
        dtype: DType,
        producer: TensorProducer<'a>,
    ) -> Result<&mut Self> {
        let ggml_type = GgmlType::from_dtype(dtype).ok_or_else(|| {
            Error::InvalidArgument(format!("gguf writer: dtype {dtype} has no ggml type"))
        })?;
        let (ne, n_bytes) = self.check_tensor(name, dims_row_major, ggml_type)?;
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ne,
            ggml_type,
            n_bytes,
            data: TensorData::Producer(producer),
        });
        Ok(self)
    }

    /// The total size of the file that will be written.
    pub fn file_size(&self) -> u64 {
        let (header, offsets) = self.layout();
        offsets
            .last()
            .map_or(header, |&(off, len)| header + off + len as u64)
    }

    /// Header size rounded up to the alignment, and each tensor's (data offset, byte length).
    fn layout(&self) -> (u64, Vec<(u64, usize)>) {
        let mut header = 4 + 4 + 8 + 8u64;
        for (k, v) in &self.metadata {
            header += 8 + k.len() as u64 + 4 + encoded_len(v);
        }
        for t in &self.tensors {
            header += 8 + t.name.len() as u64 + 4 + 8 * t.ne.len() as u64 + 4 + 8;
        }
        let header = header.div_ceil(self.alignment) * self.alignment;
        let mut off = 0u64;
        let offsets = self
            .tensors
            .iter()
            .map(|t| {
                let here = off;
                off = (off + t.n_bytes as u64).div_ceil(self.alignment) * self.alignment;
                (here, t.n_bytes)
            })
            .collect();
        (header, offsets)
    }

    /// Writes the file to `out`; `progress(done, total)` is called after each tensor.
    pub fn write(mut self, out: &mut dyn Write, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let io = |e| Error::io("<gguf output>", e);
        let total = self.file_size();
        let (header_len, offsets) = self.layout();
        let mut head = Vec::with_capacity(header_len as usize);
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut head, v);
        }
        for (t, &(off, _)) in self.tensors.iter().zip(&offsets) {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ggml_type.0.to_le_bytes());
            head.extend_from_slice(&off.to_le_bytes());
        }
        head.resize(header_len as usize, 0);
        out.write_all(&head).map_err(io)?;
        let mut written = header_len;
        let mut scratch = Vec::new();
        for (t, &(off, len)) in self.tensors.iter_mut().zip(&offsets) {
            let pad = header_len + off - written;
            out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
            match &mut t.data {
                TensorData::Bytes(b) => out.write_all(b).map_err(io)?,
                TensorData::Producer(f) => {
                    scratch.clear();
                    scratch.resize(len, 0);
                    f(&mut scratch)?;
                    out.write_all(&scratch).map_err(io)?;
                }
            }
            written = header_len + off + len as u64;
            progress(written, total);
        }
        Ok(())
    }

    /// Writes the file into memory.
    pub fn to_bytes(self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.file_size() as usize);
        self.write(&mut out, &mut |_, _| {})?;
        Ok(out)
    }

    /// Writes the file to `path` atomically: a temporary file in the same directory, then a rename.
    /// Errors name `path`, the file the caller asked for, not the temporary one.
    pub fn write_to(self, path: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let tmp = temp_path_for(path);
        let io = |e| Error::io(path, e);
        let result = (|| {
            let file = std::fs::File::create(&tmp).map_err(io)?;
            let mut buf = std::io::BufWriter::with_capacity(1 << 20, file);
            self.write(&mut buf, progress).map_err(|e| match e {
                Error::Io { cause, .. } => io(cause),
                e => e,
            })?;
            let file = buf.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&tmp, path).map_err(io)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// A temporary sibling path for atomic writes, unique per process and call:
/// `.<name>.tmp.<pid>.<n>`.
pub fn temp_path_for(path: &Path) -> std::path::PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "gguf".into());
    path.with_file_name(format!(".{name}.tmp.{}.{n}", std::process::id()))
}

fn check_value(key: &str, v: &Value, depth: usize) -> Result<()> {
    if let Value::Array(a) = v {
        if depth >= crate::model::gguf::MAX_ARRAY_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "gguf writer: `{key}`: arrays nested too deep"
            )));
        }
        for e in &a.values {
            if e.value_type() != a.elem_type {
                return Err(Error::InvalidArgument(format!(
                    "gguf writer: `{key}`: array of {} holds a {}",
                    a.elem_type.name(),
                    e.value_type().name()
                )));
            }
            check_value(key, e, depth + 1)?;
        }
    }
    Ok(())
}

fn encoded_len(v: &Value) -> u64 {
    match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(s) => 8 + s.len() as u64,
        Value::Array(a) => 12 + a.values.iter().map(encoded_len).sum::<u64>(),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => {
            out.extend_from_slice(&a.elem_type.id().to_le_bytes());
            out.extend_from_slice(&(a.values.len() as u64).to_le_bytes());
            for e in &a.values {
                put_value(out, e);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;

    fn scratch_dir(tag: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("onepass-gguf-write-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn write_to_is_atomic_and_producers_fill_tensors() {
        let dir = scratch_dir("ok");
        let path = dir.join("m.gguf");
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "llama")
            .unwrap()
            .add_u32(ALIGNMENT_KEY, 64)
            .unwrap();
        w.add_tensor_with(
            "p",
            &[2, 3],
            DType::F32,
            Box::new(|out: &mut [u8]| {
                for (i, c) in out.chunks_exact_mut(4).enumerate() {
                    c.copy_from_slice(&(i as f32 + 0.5).to_le_bytes());
                }
                Ok(())
            }),
        )
        .unwrap();
        w.add_tensor("b", &[5], DType::BF16, vec![9u8; 10]).unwrap();
        let total = w.file_size();
        let mut last = (0, 0);
        w.write_to(&path, &mut |done, all| last = (done, all))
            .unwrap();
        assert_eq!(last, (total, total));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["m.gguf"], "no temporary file may be left behind");
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), total);
        let p: Vec<f32> = f
            .tensor_bytes(f.tensor("p").unwrap())
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(p, [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]);
        assert_eq!(f.tensor("b").unwrap().file_offset % 64, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_producer_leaves_nothing_behind() {
        let dir = scratch_dir("fail");
        let path = dir.join("m.gguf");
        let mut w = GgufWriter::new();
        w.add_tensor_with(
            "p",
            &[4],
            DType::F32,
            Box::new(|_| Err(Error::InvalidArgument("boom".into()))),
        )
        .unwrap();
        let err = w.write_to(&path, &mut |_, _| {}).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_input_is_rejected_naming_the_key_or_tensor() {
        let mut w = GgufWriter::new();
        w.add_tensor("t", &[2], DType::F32, vec![0u8; 8]).unwrap();
        let bad_array = Value::Array(Array {
            elem_type: ValueType::U8,
            values: vec![Value::I8(1)],
        });
        let errors = [
            ("t", w.add_tensor("t", &[2], DType::F32, vec![0u8; 8]).err()),
            ("u", w.add_tensor("u", &[3], DType::F32, vec![0u8; 8]).err()),
            (
                "v",
                w.add_tensor("v", &[2, 16], DType::Q4_0, vec![0u8; 18])
                    .err(),
            ),
            (
                "x",
                w.add_tensor("x", &[1, 1, 1, 1, 1], DType::F32, vec![0u8; 4])
                    .err(),
            ),
            (
                "y",
                w.add_tensor("y", &[usize::MAX, 4], DType::F32, vec![])
                    .err(),
            ),
            (
                "u32",
                w.add_tensor("z", &[1], DType::U32, vec![0u8; 4]).err(),
            ),
            (ALIGNMENT_KEY, w.add_u32(ALIGNMENT_KEY, 24).err()),
            (ALIGNMENT_KEY, w.add_str(ALIGNMENT_KEY, "32").err()),
            ("arr", w.add("arr", bad_array).err()),
        ];
        for (needle, err) in errors {
            let err = err
                .unwrap_or_else(|| panic!("accepted bad input for `{needle}`"))
                .to_string();
            assert!(err.contains(needle), "`{err}` does not mention `{needle}`");
        }
        // Adding a key twice replaces the value.
        w.add_u32("k", 1).unwrap().add_u32("k", 2).unwrap();
        assert_eq!(w.metadata().iter().filter(|(k, _)| k == "k").count(), 1);
        let f = GgufFile::from_bytes(&w.to_bytes().unwrap(), "w.gguf").unwrap();
        assert_eq!(f.get_u32("k").unwrap(), 2);
    }
}
