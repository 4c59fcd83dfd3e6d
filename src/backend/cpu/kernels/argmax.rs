//! CPU kernels of the `argmax` op family.

use crate::backend::cpu::CpuRegistry;

/// Registers this family's kernels.
pub(super) fn register(registry: &mut CpuRegistry) {
    let _ = registry;
}
