//! CPU kernels of the `copy` op family: dtype-converting copies among f32, f16 and bf16.
//!
//! Also home of [`Float`], the load/store conversion every float kernel of this backend uses:
//! f16 and bf16 values are widened to f32, computed on, and rounded back (round to nearest even).

use half::{bf16, f16};
use rayon::prelude::*;

use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::COPY;

/// A float element that kernels load as f32 and store from f32.
pub(crate) trait Float: bytemuck::Pod + Send + Sync {
    /// Widens to f32 (exact for every implementor).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(v: f32) -> Self;
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Elements per parallel task of a flat elementwise loop.
pub(crate) const FLAT_CHUNK: usize = 1 << 14;

/// Copies `src` (dtype `S`) into `dst` (dtype `D`), converting each element.
/// Arguments: 0 = src (read), 1 = dst (write).
fn copy_convert<S: Float, D: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let src = args.input::<S>(0)?;
    let dst = args.output::<D>(1)?;
    if src.len() != dst.len() {
        return Err(crate::error::Error::Kernel {
            kernel: args.kernel().name(),
            msg: format!("src has {} elements, dst {}", src.len(), dst.len()),
        });
    }
    dst.par_chunks_mut(FLAT_CHUNK)
        .zip(src.par_chunks(FLAT_CHUNK))
        .for_each(|(d, s)| {
            for (o, &i) in d.iter_mut().zip(s) {
                *o = D::from_f32(i.to_f32());
            }
        });
    Ok(())
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(
        &COPY,
        [
            copy_convert::<f32, f32>,
            copy_convert::<f32, f16>,
            copy_convert::<f32, bf16>,
            copy_convert::<f16, f32>,
            copy_convert::<f16, f16>,
            copy_convert::<f16, bf16>,
            copy_convert::<bf16, f32>,
            copy_convert::<bf16, f16>,
            copy_convert::<bf16, bf16>,
        ],
    );
}
