//! GGUF metadata values: the type tags and the typed value enum.

/// The type tag of a metadata value; the discriminant is the id GGUF stores on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8` (0).
    U8 = 0,
    /// `int8` (1).
    I8 = 1,
    /// `uint16` (2).
    U16 = 2,
    /// `int16` (3).
    I16 = 3,
    /// `uint32` (4).
    U32 = 4,
    /// `int32` (5).
    I32 = 5,
    /// `float32` (6).
    F32 = 6,
    /// `bool` (7): one byte, 0 or 1.
    Bool = 7,
    /// `string` (8): u64 length + UTF-8 bytes.
    String = 8,
    /// `array` (9): element type + u64 count + elements.
    Array = 9,
    /// `uint64` (10).
    U64 = 10,
    /// `int64` (11).
    I64 = 11,
    /// `float64` (12).
    F64 = 12,
}

/// Every value type with its GGUF name, indexed by on-disk id.
const VALUE_TYPES: [(ValueType, &str); 13] = [
    (ValueType::U8, "uint8"),
    (ValueType::I8, "int8"),
    (ValueType::U16, "uint16"),
    (ValueType::I16, "int16"),
    (ValueType::U32, "uint32"),
    (ValueType::I32, "int32"),
    (ValueType::F32, "float32"),
    (ValueType::Bool, "bool"),
    (ValueType::String, "string"),
    (ValueType::Array, "array"),
    (ValueType::U64, "uint64"),
    (ValueType::I64, "int64"),
    (ValueType::F64, "float64"),
];

impl ValueType {
    /// The type for an on-disk id, if GGUF defines one.
    pub fn from_id(id: u32) -> Option<ValueType> {
        VALUE_TYPES.get(id as usize).map(|&(t, _)| t)
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The GGUF name of the type (`uint32`, `string`, ...).
    pub fn name(self) -> &'static str {
        VALUE_TYPES[self as usize].1
    }

    /// The fewest bytes one value of this type takes on disk (used to bound counts).
    pub(super) fn min_encoded_len(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A typed array: the element type is kept so that empty arrays round-trip.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// The type of every element.
    pub elem_type: ValueType,
    /// The elements; each has type `elem_type`.
    pub values: Vec<Value>,
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `array` (possibly of arrays).
    Array(Array),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed 128-bit integer, when it is an integer of any width.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an `f64`, when it is a float (`float32` or `float64`).
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, when the value is one.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and for arrays the element type.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.values.len(), a.elem_type.name()),
            v => v.value_type().name().to_string(),
        }
    }
}
