//! Every kernel declared once: its name, its op kind and its parameter list (each buffer's access
//! and accepted dtypes, each scalar's type), one file per op family.
//!
//! A [`KernelId`] points at one [`KernelSig`]. The op builders pick a declared kernel and
//! [`Dispatch::new`](crate::graph::Dispatch::new) checks the arguments against it, so a
//! dispatch whose arguments do not fit its kernel is an error naming kernel and argument, never a
//! launch. The CPU backend registers its functions against these declarations, the CUDA registry
//! checks that every declared kernel is a function of its sources, and fusion rules find
//! operands by parameter name.

pub mod attention;
pub mod batch;
pub mod elementwise;
mod fusion;
pub mod matmul;
pub mod misc;
pub mod norm;
mod op;

pub use fusion::{Fusion, FusionUse};
pub use op::{Access, OpKind, Scalar};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A set of dtypes a buffer parameter accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DTypes(u16);

impl DTypes {
    /// No dtype.
    pub const NONE: DTypes = DTypes(0);

    /// Exactly one dtype.
    pub const fn one(d: DType) -> DTypes {
        DTypes(1 << d as u16)
    }

    /// The dtypes of `list`.
    pub const fn of(list: &[DType]) -> DTypes {
        let mut bits = 0u16;
        let mut i = 0;
        while i < list.len() {
            bits |= 1 << list[i] as u16;
            i += 1;
        }
        DTypes(bits)
    }

    /// Whether `d` is in the set.
    #[inline]
    pub const fn contains(self, d: DType) -> bool {
        self.0 & (1 << d as u16) != 0
    }

    /// The dtypes of the set, in declaration order of [`DType`].
    pub fn list(self) -> Vec<DType> {
        ALL_DTYPES
            .iter()
            .copied()
            .filter(|&d| self.contains(d))
            .collect()
    }
}

impl std::fmt::Debug for DTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.list().into_iter().map(DType::name).collect();
        write!(f, "{}", names.join("|"))
    }
}

const ALL_DTYPES: [DType; 12] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U32,
    DType::U8,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
];

/// The type of a scalar parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarKind {
    /// Unsigned 32-bit.
    U32,
    /// Signed 32-bit.
    I32,
    /// 32-bit float.
    F32,
}

impl ScalarKind {
    /// The kind of a scalar value.
    #[inline]
    pub fn of(s: Scalar) -> ScalarKind {
        match s {
            Scalar::U32(_) => ScalarKind::U32,
            Scalar::I32(_) => ScalarKind::I32,
            Scalar::F32(_) => ScalarKind::F32,
        }
    }
}

/// What one parameter of a kernel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A buffer the kernel uses with this access, of one of these dtypes.
    Buffer(Access, DTypes),
    /// A scalar of this type.
    Scalar(ScalarKind),
}

impl ParamKind {
    /// Whether an argument of this shape fits the parameter.
    #[inline]
    pub fn accepts(self, arg: ArgShape) -> bool {
        match (self, arg) {
            (ParamKind::Buffer(want, dtypes), ArgShape::Buffer(access, dtype)) => {
                want == access && dtypes.contains(dtype)
            }
            (ParamKind::Scalar(want), ArgShape::Scalar(kind)) => want == kind,
            _ => false,
        }
    }
}

/// One named parameter of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name (what errors and fusion rules use).
    pub name: &'static str,
    /// What it is.
    pub kind: ParamKind,
}

impl Param {
    /// A buffer the kernel reads.
    pub const fn read(name: &'static str, dtypes: DTypes) -> Param {
        Param {
            name,
            kind: ParamKind::Buffer(Access::Read, dtypes),
        }
    }

    /// A buffer the kernel writes.
    pub const fn write(name: &'static str, dtypes: DTypes) -> Param {
        Param {
            name,
            kind: ParamKind::Buffer(Access::Write, dtypes),
        }
    }

    /// A buffer the kernel reads and writes in place.
    pub const fn read_write(name: &'static str, dtypes: DTypes) -> Param {
        Param {
            name,
            kind: ParamKind::Buffer(Access::ReadWrite, dtypes),
        }
    }

    /// An unsigned scalar.
    pub const fn u32(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::Scalar(ScalarKind::U32),
        }
    }

    /// A signed scalar.
    pub const fn i32(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::Scalar(ScalarKind::I32),
        }
    }

    /// A float scalar.
    pub const fn f32(name: &'static str) -> Param {
        Param {
            name,
            kind: ParamKind::Scalar(ScalarKind::F32),
        }
    }
}

/// The shape of one argument as the signature check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgShape {
    /// A buffer of this dtype with this access.
    Buffer(Access, DType),
    /// A scalar of this type.
    Scalar(ScalarKind),
}

/// A kernel's declaration: name (the CPU registry key and the CUDA function's name), op kind and
/// parameters.
#[derive(Debug)]
pub struct KernelSig {
    name: &'static str,
    op: OpKind,
    params: Option<&'static [Param]>,
}

impl KernelSig {
    /// A kernel named `name` of kind `op` taking `params`, in order.
    pub const fn new(name: &'static str, op: OpKind, params: &'static [Param]) -> KernelSig {
        KernelSig {
            name,
            op,
            params: Some(params),
        }
    }

    /// A kernel with no declared parameters: it accepts any argument list, and no backend runs
    /// it (both registries refuse it). For graphs the optimizer studies without running them
    /// (synthetic benchmarks, pass tests).
    pub const fn untyped(name: &'static str, op: OpKind) -> KernelSig {
        KernelSig {
            name,
            op,
            params: None,
        }
    }

    /// The name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The op kind.
    pub const fn op(&self) -> OpKind {
        self.op
    }

    /// The parameters, in order; `None` for an [`untyped`](Self::untyped) kernel.
    pub const fn params(&self) -> Option<&'static [Param]> {
        self.params
    }

    /// The index of the parameter called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.params?.iter().position(|p| p.name == name)
    }

    /// Checks an argument list against the parameters: as many arguments, each a buffer or a
    /// scalar as declared, buffers with the declared access and one of the declared dtypes. The
    /// error names the kernel and the argument.
    #[inline]
    pub fn check(&self, args: impl ExactSizeIterator<Item = ArgShape>) -> Result<()> {
        let Some(params) = self.params else {
            return Ok(());
        };
        if args.len() != params.len() {
            return Err(self.count_error(args.len()));
        }
        for (i, (p, a)) in params.iter().zip(args).enumerate() {
            if !p.kind.accepts(a) {
                return Err(self.arg_error(i, p, a));
            }
        }
        Ok(())
    }

    #[cold]
    fn count_error(&self, got: usize) -> Error {
        let names: Vec<&str> = self.params.unwrap_or(&[]).iter().map(|p| p.name).collect();
        Error::InvalidArgument(format!(
            "kernel {}: {got} arguments, it takes {} ({})",
            self.name,
            names.len(),
            names.join(", ")
        ))
    }

    #[cold]
    fn arg_error(&self, i: usize, p: &Param, a: ArgShape) -> Error {
        let want = match p.kind {
            ParamKind::Buffer(access, dtypes) => format!("a {access:?} buffer of {dtypes:?}"),
            ParamKind::Scalar(kind) => format!("a {kind:?} scalar"),
        };
        let got = match a {
            ArgShape::Buffer(access, dtype) => format!("a {access:?} buffer of {dtype}"),
            ArgShape::Scalar(kind) => format!("a {kind:?} scalar"),
        };
        Error::InvalidArgument(format!(
            "kernel {}: argument {i} `{}` must be {want}, got {got}",
            self.name, p.name
        ))
    }
}

/// Names one declared kernel. Two ids are equal when they point at the same declaration, or at
/// declarations of the same name, op kind and parameters.
#[derive(Clone, Copy)]
pub struct KernelId(&'static KernelSig);

impl KernelId {
    /// The id of a declared kernel.
    pub const fn of(sig: &'static KernelSig) -> KernelId {
        KernelId(sig)
    }

    /// The kernel's name.
    #[inline]
    pub const fn name(self) -> &'static str {
        self.0.name
    }

    /// The kernel's declaration.
    #[inline]
    pub const fn sig(self) -> &'static KernelSig {
        self.0
    }

    /// The kernel's op kind.
    #[inline]
    pub const fn op(self) -> OpKind {
        self.0.op
    }

    /// Whether this is one of `family`'s kernels.
    pub fn is_in(self, family: &'static [KernelSig]) -> bool {
        family.iter().any(|k| KernelId::of(k) == self)
    }

    /// The index of this kernel in `family`.
    pub fn index_in(self, family: &'static [KernelSig]) -> Option<usize> {
        family.iter().position(|k| KernelId::of(k) == self)
    }
}

impl PartialEq for KernelId {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
            || (self.0.name == other.0.name
                && self.0.op == other.0.op
                && self.0.params == other.0.params)
    }
}

impl Eq for KernelId {}

impl std::hash::Hash for KernelId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl PartialOrd for KernelId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KernelId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.name.cmp(other.0.name)
    }
}

impl std::fmt::Debug for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KernelId({})", self.0.name)
    }
}

impl std::fmt::Display for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

/// The float dtypes, one at a time, in the order the per-float families list their kernels.
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The weight formats of the matrix families, in the order they list their kernels.
pub const WEIGHT_FORMATS: [DType; 9] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
];

/// One dtype as a set (shorthand for the declarations).
pub(crate) const fn one(d: DType) -> DTypes {
    DTypes::one(d)
}

/// The kernel of `family` for `dtype`, where the family lists one kernel per dtype of `order`;
/// an error naming the op when there is none.
pub(crate) fn pick(
    op: &'static str,
    family: &'static [KernelSig],
    order: &[DType],
    dtype: DType,
) -> Result<KernelId> {
    match order.iter().position(|&d| d == dtype) {
        Some(i) if i < family.len() => Ok(KernelId::of(&family[i])),
        _ => Err(Error::Unsupported(format!(
            "{op} has no kernel for dtype {dtype}"
        ))),
    }
}

/// Declares one kernel per float dtype (f32, f16, bf16): `per_float!(op; "a_f32", "a_f16",
/// "a_bf16"; |T| [params using T])`, where `T` is the [`DTypes`] of that float.
macro_rules! per_float {
    ($op:expr; $f32:literal, $f16:literal, $bf16:literal; |$t:ident| $params:expr) => {
        [
            {
                const $t: $crate::kernels::DTypes = $crate::kernels::DTypes::one(DType::F32);
                $crate::kernels::KernelSig::new($f32, $op, &$params)
            },
            {
                const $t: $crate::kernels::DTypes = $crate::kernels::DTypes::one(DType::F16);
                $crate::kernels::KernelSig::new($f16, $op, &$params)
            },
            {
                const $t: $crate::kernels::DTypes = $crate::kernels::DTypes::one(DType::BF16);
                $crate::kernels::KernelSig::new($bf16, $op, &$params)
            },
        ]
    };
}
pub(crate) use per_float;

/// Declares one kernel per weight format, in the order of [`WEIGHT_FORMATS`]:
/// `per_format!(op; "prefix"; |W| [params using W])`, named `prefix_f32`, ..., `prefix_q6_k`.
macro_rules! per_format {
    ($op:expr; $prefix:literal; |$w:ident| $params:expr) => {
        [
            $crate::kernels::per_format!(@one $op, $prefix, "f32", F32, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "f16", F16, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "bf16", BF16, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "q4_0", Q4_0, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "q4_1", Q4_1, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "q5_0", Q5_0, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "q8_0", Q8_0, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "q4_k", Q4K, $w, $params),
            $crate::kernels::per_format!(@one $op, $prefix, "q6_k", Q6K, $w, $params),
        ]
    };
    (@one $op:expr, $prefix:literal, $suffix:literal, $dtype:ident, $w:ident, $params:expr) => {{
        const $w: $crate::kernels::DTypes = $crate::kernels::DTypes::one(DType::$dtype);
        $crate::kernels::KernelSig::new(concat!($prefix, "_", $suffix), $op, &$params)
    }};
}

pub(crate) use per_format;

/// The declared built-in kernel called `name` (the CUDA self-test kernels included).
pub fn builtin(name: &str) -> Option<KernelId> {
    static BY_NAME: std::sync::OnceLock<std::collections::HashMap<&'static str, KernelId>> =
        std::sync::OnceLock::new();
    BY_NAME
        .get_or_init(|| {
            all()
                .into_iter()
                .chain(&misc::CUDA_SELFTEST)
                .map(|k| (k.name(), KernelId::of(k)))
                .collect()
        })
        .get(name)
        .copied()
}

/// Every built-in kernel's declaration (the CUDA self-test kernels aside).
pub fn all() -> Vec<&'static KernelSig> {
    let families: [&'static [KernelSig]; _] = [
        &attention::ATTENTION,
        &attention::ATTENTION_MMA,
        &attention::ATTENTION_MMA_TO_F16,
        &attention::DECODE,
        &attention::DECODE_PARTIAL,
        std::slice::from_ref(&attention::DECODE_COMBINE),
        &batch::MATMUL_ROWS,
        &batch::KV_WRITE_SLOTS,
        &batch::ATTENTION_SLOTS,
        &elementwise::ADD,
        &elementwise::ADD_INPLACE,
        &elementwise::MUL,
        &elementwise::MUL_INPLACE,
        &elementwise::SWIGLU,
        &elementwise::SWIGLU_INPLACE,
        std::slice::from_ref(&elementwise::SWIGLU_TO_F16),
        &elementwise::GEGLU,
        &elementwise::GEGLU_INPLACE,
        &elementwise::SCALE,
        &elementwise::SCALE_INPLACE,
        &elementwise::SOFTCAP,
        &elementwise::SOFTCAP_INPLACE,
        &elementwise::GELU_TANH,
        &elementwise::GELU_TANH_INPLACE,
        &elementwise::GELU_ERF,
        &elementwise::GELU_ERF_INPLACE,
        &elementwise::SILU,
        &elementwise::SILU_INPLACE,
        &matmul::MATMUL,
        &matmul::MATMUL_ADD,
        &matmul::MATMUL_MMA,
        &matmul::MATMUL_ADD_MMA,
        &matmul::MATMUL3_MMA,
        &matmul::MATMUL_MMA_H,
        &matmul::MATMUL3_MMA_H,
        &matmul::MATMUL_ADD_MMA_H,
        &matmul::MATMUL_SWIGLU_MMA_H,
        &matmul::MATMUL_ID,
        &matmul::MATMUL_AFFINE,
        &matmul::NORM_QKV_ROPE,
        &matmul::NORM_QKV_ROPE_SHARED,
        &matmul::NORM_QKV_ROPE_MIXED,
        &matmul::NORM_QKV_ROPE_FF,
        &matmul::NORM_QKV_ROPE_FF_SHARED,
        &matmul::NORM_QKV_ROPE_FF_MIXED,
        &matmul::NORM_QKV,
        &matmul::NORM_QKV_SHARED,
        &matmul::NORM_QKV_MIXED,
        &matmul::NORM_GATE_UP,
        &matmul::NORM_GATE_UP_SHARED,
        std::slice::from_ref(&misc::ARGMAX),
        std::slice::from_ref(&misc::ARGMAX_ADVANCE),
        std::slice::from_ref(&misc::DRAW_ADVANCE),
        std::slice::from_ref(&misc::DRAW_ROWS),
        &misc::COPY,
        &misc::EMBEDDING,
        &misc::KV_WRITE,
        &misc::ROPE,
        &misc::ROPE_FF,
        &misc::ROPE_INPLACE,
        &misc::ROPE_FF_INPLACE,
        &misc::ROPE_KV,
        &misc::SOFTMAX,
        &norm::RMS_NORM,
        &norm::RMS_NORM_NO_SCALE,
        &norm::RMS_NORM_MUL,
        &norm::RMS_NORM_NO_SCALE_MUL,
        &norm::RMS_NORM_ADD,
        &norm::RMS_NORM_ROPE,
        &norm::RMS_NORM_ROPE_KV,
        std::slice::from_ref(&norm::RMS_NORM_TO_F16),
    ];
    families.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests;
