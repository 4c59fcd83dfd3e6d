//! The `rope` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! Rotary position embedding of `x` (`[rows, n_heads * head_dim]` or `[rows, n_heads, head_dim]`,
//! f32, f16 or bf16), one position per row read from an i32 device buffer, so a recorded graph
//! serves every decode step. Pair `i < rotary_dim / 2` of each head turns by
//! `theta_i = pos * base^(-2i / rotary_dim) / freq_factor_i`:
//! - [`RopeMode::Normal`] rotates adjacent pairs `(x[2i], x[2i + 1])` (the GGUF llama layout);
//! - [`RopeMode::NeoX`] rotates halves `(x[i], x[i + rotary_dim / 2])`.
//!
//! Values past `rotary_dim` pass through unchanged. `out` may be `x` itself (in place).

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid};
use crate::kernels::misc as km;
use crate::ops::elementwise::{check_disjoint, float_kernel, same_view, u32_size, FLOAT_DTYPES};
use crate::ops::Check;

/// The largest `rotary_dim` the kernels support (the CPU kernel keeps a per-row table of
/// `rotary_dim / 2` angles on its stack).
pub const MAX_ROTARY_DIM: usize = 1024;

/// Which values of a head form the rotated pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i + 1])`: the GGUF llama layout.
    Normal,
    /// Halves `(x[i], x[i + rotary_dim / 2])`: the GPT-NeoX layout.
    NeoX,
}

/// The parameters of a RoPE dispatch.
#[derive(Debug, Clone, Copy)]
pub struct RopeParams<'a> {
    /// Pair layout.
    pub mode: RopeMode,
    /// Values per head.
    pub head_dim: usize,
    /// Leading values of each head that rotate: even, `2..=head_dim` (at most 1024).
    pub rotary_dim: usize,
    /// Frequency base (10000 for llama, 100000 for SmolLM2).
    pub base: f32,
    /// Optional per-pair divisors of the angle, f32 `[rotary_dim / 2]`.
    pub freq_factors: Option<&'a Buffer>,
}

impl<'a> RopeParams<'a> {
    /// Full-head rotation in `mode` with `base`, no frequency factors.
    pub fn new(mode: RopeMode, head_dim: usize, base: f32) -> Self {
        RopeParams {
            mode,
            head_dim,
            rotary_dim: head_dim,
            base,
            freq_factors: None,
        }
    }
}

/// Checks the geometry of a rotation of rows `row_len` long: `head_dim` divides the row,
/// `rotary_dim` is even, at least 2, at most `head_dim` and the supported maximum, `base` finite
/// and positive. Shared by `rope` and the fused `rms_norm_rope`.
pub(crate) fn check_rotation(
    check: &Check,
    row_len: usize,
    head_dim: usize,
    rotary_dim: usize,
    base: f32,
) -> Result<()> {
    check.require(
        "head_dim",
        head_dim > 0 && row_len.is_multiple_of(head_dim),
        || format!("{head_dim} does not divide the row length {row_len}"),
    )?;
    check.require(
        "rotary_dim",
        rotary_dim >= 2 && rotary_dim.is_multiple_of(2) && rotary_dim <= head_dim,
        || format!("{rotary_dim} is not even and in 2..={head_dim}"),
    )?;
    check.require("rotary_dim", rotary_dim <= MAX_ROTARY_DIM, || {
        format!("{rotary_dim} exceeds the supported {MAX_ROTARY_DIM}")
    })?;
    check.require("base", base.is_finite() && base > 0.0, || {
        format!("{base} is not finite and positive")
    })?;
    Ok(())
}

/// Rotates `x` into `out` (see the module documentation); `positions` is i32 `[rows]`.
pub fn rope(
    x: &Buffer,
    positions: &Buffer,
    out: &Buffer,
    params: &RopeParams<'_>,
) -> Result<Dispatch> {
    let check = Check::op("rope");
    let RopeParams {
        mode,
        head_dim,
        rotary_dim,
        base,
        freq_factors,
    } = *params;
    check.dtype("x", x, &FLOAT_DTYPES)?;
    check.require("x", x.shape().rank() >= 2 && x.elems() > 0, || {
        format!(
            "has shape {:?}, expected [rows, n_heads * head_dim]",
            x.dims()
        )
    })?;
    let rows = x.dims()[0];
    let row_len = x.elems() / rows;
    check_rotation(&check, row_len, head_dim, rotary_dim, base)?;
    check.dtype("positions", positions, &[DType::I32])?;
    check.elems("positions", positions, rows)?;
    if let Some(ff) = freq_factors {
        check.dtype("freq_factors", ff, &[DType::F32])?;
        check.elems("freq_factors", ff, rotary_dim / 2)?;
    }
    check.dtype("out", out, &[x.dtype()])?;
    check.dims("out", out, x.dims())?;
    let scalars = [
        Arg::u32(u32_size(&check, "head_dim", head_dim)?),
        Arg::u32(u32_size(&check, "rotary_dim", rotary_dim)?),
        Arg::f32(base),
        Arg::u32(match mode {
            RopeMode::Normal => 0,
            RopeMode::NeoX => 1,
        }),
    ];
    let in_place = same_view(out, x);
    let mut inputs = vec![("positions", positions)];
    inputs.extend(freq_factors.map(|f| ("freq_factors", f)));
    let mut args = vec![
        if in_place {
            Arg::read_write(x)
        } else {
            Arg::read(x)
        },
        Arg::read(positions),
    ];
    args.extend(freq_factors.map(Arg::read));
    if !in_place {
        inputs.push(("x", x));
        args.push(Arg::write(out));
    }
    check_disjoint(&check, if in_place { "x" } else { "out" }, out, &inputs)?;
    args.extend(scalars);
    let family = match (freq_factors.is_some(), in_place) {
        (false, false) => &km::ROPE,
        (true, false) => &km::ROPE_FF,
        (false, true) => &km::ROPE_INPLACE,
        (true, true) => &km::ROPE_FF_INPLACE,
    };
    let kernel = float_kernel("rope", x.dtype(), family)?;
    let grid = Grid::new(rows.min(u32::MAX as usize) as u32, 128);
    Dispatch::new(kernel, args, grid)
}

#[cfg(test)]
mod tests {
    use super::{RopeMode, RopeParams};
    use crate::backend::{DType, Device};
    use crate::error::Error;
    use crate::ops::copy::float_io::*;
    use crate::testutil::{assert_close, random_f32, rng};
    use crate::{Executor, Mode, Plan};
    use rand::RngExt;

    /// f64 reference rotation of `x` (`rows` rows of `n_heads * head_dim`).
    fn reference(x: &[f32], positions: &[i32], p: &RopeParams<'_>, ff: Option<&[f32]>) -> Vec<f32> {
        let row_len = x.len() / positions.len();
        let pairs = p.rotary_dim / 2;
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for (r, &pos) in positions.iter().enumerate() {
            for h in 0..row_len / p.head_dim {
                let base_idx = r * row_len + h * p.head_dim;
                for i in 0..pairs {
                    let inv = (p.base as f64).powf(-2.0 * i as f64 / p.rotary_dim as f64);
                    let theta = pos as f64 * inv / ff.map_or(1.0, |f| f[i] as f64);
                    let (j0, j1) = match p.mode {
                        RopeMode::Normal => (2 * i, 2 * i + 1),
                        RopeMode::NeoX => (i, i + pairs),
                    };
                    let (a, b) = (x[base_idx + j0] as f64, x[base_idx + j1] as f64);
                    out[base_idx + j0] = a * theta.cos() - b * theta.sin();
                    out[base_idx + j1] = a * theta.sin() + b * theta.cos();
                }
            }
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    fn random_positions(rows: usize, seed: u64) -> Vec<i32> {
        let mut r = rng(seed);
        (0..rows).map(|_| r.random_range(0..40_000)).collect()
    }

    /// (rows, n_heads, head_dim, rotary_dim, mode, base, with freq factors)
    const CASES: [(usize, usize, usize, usize, RopeMode, f32, bool); 5] = [
        (1, 9, 64, 64, RopeMode::Normal, 100_000.0, false),
        (3, 3, 64, 64, RopeMode::NeoX, 10_000.0, false),
        (17, 2, 64, 32, RopeMode::NeoX, 10_000.0, true),
        (5, 4, 18, 10, RopeMode::Normal, 500_000.0, true),
        (2, 1, 128, 96, RopeMode::Normal, 10_000.0, false),
    ];

    #[test]
    fn rope_matches_reference() {
        let dev = Device::cpu(2).unwrap();
        for dt in FLOATS {
            // Rotation in f32 of values up to 2: a few ulps of the larger input, absolute.
            let (atol, rtol) = match dt {
                DType::F32 => (2e-6, 1e-5),
                other => tolerance(other),
            };
            for (case, &(rows, heads, head_dim, rotary_dim, mode, base, with_ff)) in
                CASES.iter().enumerate()
            {
                for in_place in [false, true] {
                    let seed = 40 + case as u64;
                    let xv = rounded(dt, &random_f32(rows * heads * head_dim, 2.0, seed));
                    let x = upload(&dev, dt, &xv, &[rows, heads * head_dim]);
                    let pos = random_positions(rows, seed + 1);
                    let positions = dev.upload(&pos, &[rows]).unwrap();
                    let ffv: Vec<f32> = random_f32(rotary_dim / 2, 1.0, seed + 2)
                        .iter()
                        .map(|v| 1.0 + v.abs() * 7.0)
                        .collect();
                    let ff = dev.upload(&ffv, &[rotary_dim / 2]).unwrap();
                    let params = RopeParams {
                        mode,
                        head_dim,
                        rotary_dim,
                        base,
                        freq_factors: with_ff.then_some(&ff),
                    };
                    let out = if in_place {
                        x.clone()
                    } else {
                        dev.alloc(dt, &[rows, heads * head_dim]).unwrap()
                    };
                    run_direct(&dev, |s| s.rope(&x, &positions, &out, &params));
                    let want = reference(&xv, &pos, &params, with_ff.then_some(&ffv[..]));
                    let what = format!("rope {dt} case {case} in place {in_place} seed {seed}");
                    assert_close(&download(&dev, &out), &want, atol, rtol, &what);
                }
            }
        }
    }

    #[test]
    fn recorded_rope_reads_positions_at_run_time() {
        let dev = Device::cpu(2).unwrap();
        let (rows, head_dim) = (2, 64);
        let xv = random_f32(rows * 3 * head_dim, 1.0, 77);
        let x = dev.upload(&xv, &[rows, 3 * head_dim]).unwrap();
        let positions = dev.upload(&[5i32, 6], &[rows]).unwrap();
        let out = dev.alloc(DType::F32, &[rows, 3 * head_dim]).unwrap();
        let params = RopeParams::new(RopeMode::Normal, head_dim, 100_000.0);
        let executor = Executor::new(dev.clone());
        let mut s = executor.begin(Mode::Recorded);
        s.rope(&x, &positions, &out, &params).unwrap();
        let mut graph = s.into_graph().unwrap();
        Executor::optimize(&mut graph, &Plan::SEQUENTIAL, dev.capabilities());
        for step in [[5i32, 6], [900, 901], [31_000, 31_001]] {
            dev.write(&positions, &step).unwrap();
            executor.run(&graph, false).unwrap();
            let want = reference(&xv, &step, &params, None);
            assert_close(
                &dev.download::<f32>(&out).unwrap(),
                &want,
                2e-6,
                1e-5,
                &format!("positions {step:?}"),
            );
        }
    }

    #[test]
    fn rope_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let x = dev.alloc(DType::F32, &[3, 128]).unwrap();
        let out = dev.alloc(DType::F32, &[3, 128]).unwrap();
        let pos = dev.alloc(DType::I32, &[3]).unwrap();
        let pos_f = dev.alloc(DType::F32, &[3]).unwrap();
        let pos_short = dev.alloc(DType::I32, &[2]).unwrap();
        let ff_short = dev.alloc(DType::F32, &[31]).unwrap();
        let good = RopeParams::new(RopeMode::NeoX, 64, 10_000.0);
        let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
            Err(Error::DType {
                op: "rope", arg: a, ..
            })
            | Err(Error::Shape {
                op: "rope", arg: a, ..
            }) if a == arg => {}
            other => panic!("expected an error naming rope and `{arg}`, got {other:?}"),
        };
        expect(super::rope(&x, &pos_f, &out, &good), "positions");
        expect(super::rope(&x, &pos_short, &out, &good), "positions");
        expect(
            super::rope(
                &x,
                &pos,
                &out,
                &RopeParams {
                    head_dim: 48,
                    ..good
                },
            ),
            "head_dim",
        );
        expect(
            super::rope(
                &x,
                &pos,
                &out,
                &RopeParams {
                    rotary_dim: 33,
                    ..good
                },
            ),
            "rotary_dim",
        );
        expect(
            super::rope(
                &x,
                &pos,
                &out,
                &RopeParams {
                    rotary_dim: 66,
                    ..good
                },
            ),
            "rotary_dim",
        );
        expect(
            super::rope(&x, &pos, &out, &RopeParams { base: -1.0, ..good }),
            "base",
        );
        expect(
            super::rope(
                &x,
                &pos,
                &out,
                &RopeParams {
                    freq_factors: Some(&ff_short),
                    ..good
                },
            ),
            "freq_factors",
        );
        expect(
            super::rope(&x, &pos, &dev.alloc(DType::F16, &[3, 128]).unwrap(), &good),
            "out",
        );
        expect(
            super::rope(
                &x.rows(0, 2).unwrap(),
                &pos_short,
                &x.rows(1, 2).unwrap(),
                &good,
            ),
            "out",
        );
    }
}
