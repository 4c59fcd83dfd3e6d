//! The attention input's norm and three products in one dispatch, without the RoPE
//! ([`norm_qkv`]): what a block whose q and k take a per-head norm between the products and the
//! rotation (Qwen 3, Gemma 3) can fuse, where [`norm_qkv_rope`](super::fused_block::norm_qkv_rope)
//! cannot. The norm and the products are `norm_qkv_rope`'s (the same kernels with the rotation
//! and the cache writes left out), so the floats are as that module says: on the CPU the separate
//! ops' bits, on CUDA within f32 rounding (a one-row pass of the int8 formats rounds the
//! normalized row to int8 once per block).
//!
//! On CUDA a decode step of Qwen 3 0.6B ran the norm, then the three products (three kernels side
//! by side), then the per-head norms: one kernel and one level of the step's chain fewer a layer.

use super::fused_block::{
    check_weight, check_x_norm, fused_launch, qkv_warps, require_one_device, to_u32, v_format,
};
use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{ArgRef, Dispatch, DispatchSpec, KernelId};
use crate::kernels::matmul as mm;
use crate::ops::matmul::for_weight;
use crate::ops::Check;

const OP: &str = "norm_qkv";

/// The arguments of [`norm_qkv`].
#[derive(Debug, Clone, Copy)]
pub struct Qkv<'a> {
    /// The residual stream, f32 `[rows, dim]`.
    pub x: &'a Buffer,
    /// The norm's weight, f32 `[dim]`.
    pub norm: &'a Buffer,
    /// The norm's epsilon.
    pub eps: f32,
    /// Query weight `[n_q, dim]`, `n_q` even.
    pub wq: &'a Buffer,
    /// Key weight `[n_kv, dim]` of `wq`'s dtype, `n_kv` even.
    pub wk: &'a Buffer,
    /// Value weight `[n_kv, dim]`: `wq`'s dtype, or the v format beside it in
    /// [`QKV_MIXED_FORMATS`](mm::QKV_MIXED_FORMATS).
    pub wv: &'a Buffer,
    /// Output queries, f32 `[rows, n_q]`.
    pub q: &'a Buffer,
    /// Output keys, f32 `[rows, n_kv]`.
    pub k: &'a Buffer,
    /// Output values, f32 `[rows, n_kv]`.
    pub v: &'a Buffer,
}

/// `q = norm(x) Wq`, `k = norm(x) Wk`, `v = norm(x) Wv` in one dispatch, `norm` the RMS norm
/// with `p.norm` as `rms_norm` computes it.
pub fn norm_qkv(p: &Qkv<'_>) -> Result<Dispatch> {
    qkv_spec(p)?.to_dispatch()
}

/// [`norm_qkv`] as a spec borrowing its buffers (what the fusion rule builds).
pub(crate) fn qkv_spec<'a>(p: &Qkv<'a>) -> Result<DispatchSpec<'a>> {
    let check = Check::op(OP);
    require_one_device(
        &check,
        p.x,
        &[
            ("norm", p.norm),
            ("wq", p.wq),
            ("wk", p.wk),
            ("wv", p.wv),
            ("q", p.q),
            ("k", p.k),
            ("v", p.v),
        ],
    )?;
    let (rows, dim) = check_x_norm(&check, p.x, p.norm, p.eps)?;
    check.require("wq", p.wq.shape().rank() == 2, || {
        format!("has shape {:?}, expected [n_q, dim]", p.wq.dims())
    })?;
    check.require("wk", p.wk.shape().rank() == 2, || {
        format!("has shape {:?}, expected [n_kv, dim]", p.wk.dims())
    })?;
    let (n_q, n_kv) = (p.wq.dims()[0], p.wk.dims()[0]);
    // The kernels take the outputs two at a time (a warp a pair of weight rows).
    check.require("wq", n_q >= 2 && n_q % 2 == 0, || {
        format!("has {n_q} rows: the fused kernel takes an even count")
    })?;
    check.require("wk", n_kv >= 2 && n_kv % 2 == 0, || {
        format!("has {n_kv} rows: the fused kernel takes an even count")
    })?;
    check_weight(&check, "wq", p.wq, n_q, dim)?;
    check.dtype("wk", p.wk, &[p.wq.dtype()])?;
    check.dims("wk", p.wk, &[n_kv, dim])?;
    let mixed = v_format(&check, p.wq, p.wv)?;
    check.dims("wv", p.wv, &[n_kv, dim])?;
    for (name, out, n) in [("q", p.q, n_q), ("k", p.k, n_kv), ("v", p.v, n_kv)] {
        check.dtype(name, out, &[DType::F32])?;
        check.dims(name, out, &[rows, n])?;
    }
    let args = [
        ArgRef::read(p.x),
        ArgRef::read(p.norm),
        ArgRef::read(p.wq),
        ArgRef::read(p.wk),
        ArgRef::read(p.wv),
        ArgRef::write(p.q),
        ArgRef::write(p.k),
        ArgRef::write(p.v),
        ArgRef::f32(p.eps),
        ArgRef::u32(to_u32(OP, "x", dim)?),
        ArgRef::u32(to_u32(OP, "wq", n_q)?),
        ArgRef::u32(to_u32(OP, "wk", n_kv)?),
    ];
    let pairs = (n_q + 2 * n_kv) / 2;
    let (shared, grid) = if rows == 1 {
        fused_launch(qkv_warps(pairs, dim), rows, dim, p.wq.dtype(), 0)
    } else {
        fused_launch(pairs, rows, dim, p.wq.dtype(), 0)
    };
    let kernel = match mixed {
        Some(i) => KernelId::of(&mm::NORM_QKV_MIXED[2 * i + usize::from(shared)]),
        None if shared => for_weight(OP, &mm::NORM_QKV_SHARED, p.wq)?,
        None => for_weight(OP, &mm::NORM_QKV, p.wq)?,
    };
    DispatchSpec::new(kernel, &args, grid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;

    fn alloc(dev: &Device, dtype: DType, dims: &[usize]) -> Buffer {
        dev.alloc(dtype, dims).unwrap()
    }

    #[test]
    fn given_a_q6_k_v_beside_q4_k_when_building_should_pick_the_mixed_kernel() {
        let dev = Device::cpu(1).unwrap();
        let (x, norm) = (
            alloc(&dev, DType::F32, &[1, 256]),
            alloc(&dev, DType::F32, &[256]),
        );
        let (wq, wk) = (
            alloc(&dev, DType::Q4K, &[8, 256]),
            alloc(&dev, DType::Q4K, &[4, 256]),
        );
        let wv = alloc(&dev, DType::Q6K, &[4, 256]);
        let (q, k, v) = (
            alloc(&dev, DType::F32, &[1, 8]),
            alloc(&dev, DType::F32, &[1, 4]),
            alloc(&dev, DType::F32, &[1, 4]),
        );
        let mut p = Qkv {
            x: &x,
            norm: &norm,
            eps: 1e-6,
            wq: &wq,
            wk: &wk,
            wv: &wv,
            q: &q,
            k: &k,
            v: &v,
        };
        assert_eq!(
            norm_qkv(&p).unwrap().kernel().name(),
            "norm_qkv_q4_k_v_q6_k"
        );
        p.wv = &wk;
        assert_eq!(norm_qkv(&p).unwrap().kernel().name(), "norm_qkv_q4_k");
        let w8 = alloc(&dev, DType::Q8_0, &[4, 256]);
        p.wv = &w8;
        let err = norm_qkv(&p).unwrap_err().to_string();
        assert!(err.contains("norm_qkv") && err.contains("wv"), "{err}");
    }

    #[test]
    fn given_odd_or_mismatched_widths_when_building_should_name_the_argument() {
        let dev = Device::cpu(1).unwrap();
        let (x, norm) = (
            alloc(&dev, DType::F32, &[2, 64]),
            alloc(&dev, DType::F32, &[64]),
        );
        let (wq, wk, w_odd) = (
            alloc(&dev, DType::F32, &[6, 64]),
            alloc(&dev, DType::F32, &[4, 64]),
            alloc(&dev, DType::F32, &[3, 64]),
        );
        let (q, k, v, k_short) = (
            alloc(&dev, DType::F32, &[2, 6]),
            alloc(&dev, DType::F32, &[2, 4]),
            alloc(&dev, DType::F32, &[2, 4]),
            alloc(&dev, DType::F32, &[1, 4]),
        );
        let p = Qkv {
            x: &x,
            norm: &norm,
            eps: 1e-6,
            wq: &wq,
            wk: &wk,
            wv: &wk,
            q: &q,
            k: &k,
            v: &v,
        };
        assert_eq!(norm_qkv(&p).unwrap().kernel().name(), "norm_qkv_f32");
        let odd = Qkv { wk: &w_odd, ..p };
        let err = norm_qkv(&odd).unwrap_err().to_string();
        assert!(err.contains("wk") && err.contains("even"), "{err}");
        let short = Qkv { v: &k_short, ..p };
        let err = norm_qkv(&short).unwrap_err().to_string();
        assert!(err.contains("norm_qkv") && err.contains('v'), "{err}");
    }
}
