//! The `argmax` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! [`argmax`] writes, for each row of `x`, the index of its largest value (greedy sampling on the
//! device). Ties go to the first index; NaN values are skipped; a row whose largest value is not
//! finite (an infinity, or only NaN) gives -1, so a greedy step that reads back only the index
//! learns that the logits are broken without reading them.
//!
//! [`argmax_advance`] does the same for one row and keeps the result on the device for a replayed
//! decode step: the index goes to a small ring of tokens at the step's position, and the step's
//! inputs (`[step, tokens[B], positions[B]]`) are advanced to the next greedy step's, so the same
//! recorded step can run again without the host writing them.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::misc::{ARGMAX, ARGMAX_ADVANCE};
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::Check;

/// `out[r] = argmax_i x[r, i]`; `x` f32 `[rows, n]` (or `[n]`, one row), `out` i32 `[rows]`.
pub fn argmax(x: &Buffer, out: &Buffer) -> Result<Dispatch> {
    let check = Check::op("argmax");
    check.dtype("x", x, &[DType::F32])?;
    check.dtype("out", out, &[DType::I32])?;
    let n = x.shape().last();
    check.require("x", x.elems() > 0 && n <= i32::MAX as usize, || {
        format!(
            "has shape {:?}; rows must be non-empty and index as i32",
            x.dims()
        )
    })?;
    let rows = x.shape().rows();
    check.elems("out", out, rows)?;
    check_disjoint(&check, "out", out, &[("x", x)])?;
    let args = vec![
        Arg::read(x),
        Arg::write(out),
        Arg::u32(u32_size(&check, "x", n)?),
    ];
    let grid = Grid::new(rows.min(u32::MAX as usize) as u32, 1024);
    Dispatch::new(KernelId::of(&ARGMAX), args, grid)
}

/// The greedy token of one row, kept on the device: with `id = argmax x` (as [`argmax`]) and
/// `s = inputs[0]`, writes `ring[s % R] = id` and advances `inputs` to the next step:
/// `inputs[0] = s + 1`, `inputs[1] = id` (0 when `id` is -1, so the next step stays in range; the
/// host sees the -1 in the ring) and `inputs[1 + B] = s + 1`. `x` f32 `[n]` or `[1, n]`, `ring`
/// i32 `[R]` (R >= 1), `inputs` i32 `[1 + 2B]` (B >= 1: the step's position, B tokens, B
/// positions). A negative `s` (or `i32::MAX`, whose successor is not an i32) is a kernel error.
pub fn argmax_advance(x: &Buffer, ring: &Buffer, inputs: &Buffer) -> Result<Dispatch> {
    let check = Check::op("argmax_advance");
    check.dtype("x", x, &[DType::F32])?;
    check.dtype("ring", ring, &[DType::I32])?;
    check.dtype("inputs", inputs, &[DType::I32])?;
    let n = x.shape().last();
    check.require(
        "x",
        x.elems() > 0 && x.shape().rows() == 1 && n <= i32::MAX as usize,
        || {
            format!(
                "has shape {:?}; it must be one non-empty row that indexes as i32",
                x.dims()
            )
        },
    )?;
    check_ring_and_inputs(&check, ring, inputs)?;
    check_disjoint(&check, "ring", ring, &[("x", x), ("inputs", inputs)])?;
    check_disjoint(&check, "inputs", inputs, &[("x", x)])?;
    let args = vec![
        Arg::read(x),
        Arg::read_write(ring),
        Arg::read_write(inputs),
        Arg::u32(u32_size(&check, "x", n)?),
    ];
    Dispatch::new(KernelId::of(&ARGMAX_ADVANCE), args, Grid::new(1, 1024))
}

/// The checks of an op that keeps a step's token in `ring` and advances the step's `inputs`:
/// a ring of at least one token, inputs of `1 + 2B` values (B >= 1).
pub(crate) fn check_ring_and_inputs(check: &Check, ring: &Buffer, inputs: &Buffer) -> Result<()> {
    check.require("ring", ring.elems() > 0, || {
        format!(
            "has shape {:?}; it must hold at least one token",
            ring.dims()
        )
    })?;
    let len = inputs.elems();
    check.require("inputs", len >= 3 && !len.is_multiple_of(2), || {
        format!("has {len} elements; it must hold 1 + 2B (B >= 1): the step, B tokens, B positions")
    })
}

#[cfg(test)]
mod tests {
    use rand::RngExt;

    use crate::backend::{Buffer, DType, Device};
    use crate::error::Error;
    use crate::ops::copy::float_io::run_direct;
    use crate::testutil::{random_f32, rng};
    use crate::{Executor, Mode, Plan};

    /// First index of the maximum, skipping NaN (-1 when the maximum is not finite or the row
    /// has no value but NaN).
    fn reference(row: &[f32]) -> i32 {
        let mut best: Option<(f64, usize)> = None;
        for (i, &v) in row.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|(b, _)| (v as f64) > b) {
                best = Some((v as f64, i));
            }
        }
        match best {
            Some((v, i)) if v.is_finite() => i as i32,
            _ => -1,
        }
    }

    #[test]
    fn argmax_matches_reference_with_ties_and_nan() {
        let dev = Device::cpu(2).unwrap();
        for (case, &(rows, n)) in [(1, 49_152), (3, 577), (17, 64), (2, 100_003), (4, 1)]
            .iter()
            .enumerate()
        {
            let mut xv = random_f32(rows * n, 10.0, 200 + case as u64);
            if n > 8 {
                // A tie for the maximum in row 0 at a late and an early index; NaN before both.
                let peak = 100.0;
                xv[n - 2] = peak;
                xv[n / 3] = peak;
                xv[1] = f32::NAN;
            }
            let x = dev.upload(&xv, &[rows, n]).unwrap();
            let out = dev.alloc(DType::I32, &[rows]).unwrap();
            run_direct(&dev, |s| s.argmax(&x, &out));
            let want: Vec<i32> = xv.chunks(n).map(reference).collect();
            assert_eq!(
                dev.download::<i32>(&out).unwrap(),
                want,
                "argmax [{rows}, {n}]"
            );
            if n > 8 {
                assert_eq!(want[0], (n / 3) as i32, "the tie goes to the first index");
            }
        }
        let nan_row = dev
            .upload(
                &[
                    f32::NAN,
                    f32::NAN,
                    f32::NEG_INFINITY,
                    f32::NEG_INFINITY,
                    1.0,
                    f32::INFINITY,
                    2.0,
                    f32::NAN,
                ],
                &[4, 2],
            )
            .unwrap();
        let out = dev.alloc(DType::I32, &[4]).unwrap();
        run_direct(&dev, |s| s.argmax(&nan_row, &out));
        assert_eq!(dev.download::<i32>(&out).unwrap(), vec![-1, -1, -1, 0]);
    }

    #[test]
    fn argmax_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let x = dev.alloc(DType::F32, &[3, 10]).unwrap();
        let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
            Err(Error::DType {
                op: "argmax",
                arg: a,
                ..
            })
            | Err(Error::Shape {
                op: "argmax",
                arg: a,
                ..
            }) if a == arg => {}
            other => panic!("expected an error naming argmax and `{arg}`, got {other:?}"),
        };
        expect(
            super::argmax(
                &dev.alloc(DType::F16, &[3, 10]).unwrap(),
                &dev.alloc(DType::I32, &[3]).unwrap(),
            ),
            "x",
        );
        expect(
            super::argmax(&x, &dev.alloc(DType::F32, &[3]).unwrap()),
            "out",
        );
        expect(
            super::argmax(&x, &dev.alloc(DType::I32, &[2]).unwrap()),
            "out",
        );
    }

    /// `count` seeded random i32 values in `1..=1_000_000` (never zero).
    fn random_i32(count: usize, seed: u64) -> Vec<i32> {
        let mut r = rng(seed);
        (0..count).map(|_| r.random_range(1..=1_000_000)).collect()
    }

    /// What `argmax_advance` leaves in a ring and the inputs `[step, tokens[B], positions[B]]`
    /// for the row `row`: the index at the slot of `inputs[0]`, the inputs advanced.
    fn advanced(row: &[f32], ring: &[i32], inputs: &[i32]) -> (Vec<i32>, Vec<i32>) {
        let id = reference(row);
        let s = inputs[0];
        let (mut ring, mut inputs) = (ring.to_vec(), inputs.to_vec());
        let slot = s as usize % ring.len();
        ring[slot] = id;
        let b = inputs.len() / 2;
        inputs[0] = s + 1;
        inputs[1] = if id < 0 { 0 } else { id };
        inputs[1 + b] = s + 1;
        (ring, inputs)
    }

    /// Runs `argmax_advance` once on the CPU over `row` (shape `dims`) with the ring and inputs
    /// given, and checks both against [`advanced`].
    fn check_advance(dev: &Device, row: &[f32], dims: &[usize], ring: &[i32], inputs: &[i32]) {
        let x = dev.upload(row, dims).unwrap();
        let rb = dev.upload(ring, &[ring.len()]).unwrap();
        let ib = dev.upload(inputs, &[inputs.len()]).unwrap();
        run_direct(dev, |s| s.argmax_advance(&x, &rb, &ib));
        let (want_ring, want_inputs) = advanced(row, ring, inputs);
        let what = format!(
            "argmax_advance {dims:?}, R = {}, inputs {inputs:?}",
            ring.len()
        );
        assert_eq!(dev.download::<i32>(&rb).unwrap(), want_ring, "{what}: ring");
        assert_eq!(
            dev.download::<i32>(&ib).unwrap(),
            want_inputs,
            "{what}: inputs"
        );
    }

    #[test]
    fn argmax_advance_keeps_the_token_and_advances_the_inputs() {
        let dev = Device::cpu(2).unwrap();
        // (n, R, B, s): a long row scanned in parallel chunks, an odd one, s at, past and far
        // past the ring's end (its slot wraps), a ring of one slot, a one-value row.
        let cases = [
            (100_003, 4, 1, 2),
            (1003, 4, 3, 4),
            (577, 8, 2, 13),
            (49_152, 5, 16, 1_000_001),
            (64, 1, 1, 7),
            (1, 3, 2, 0),
        ];
        for (case, &(n, r, b, s)) in cases.iter().enumerate() {
            let seed = 300 + 10 * case as u64;
            let mut row = random_f32(n, 10.0, seed);
            if n > 8 {
                // A tie for the maximum at a late and an early index; NaN before both.
                row[n - 3] = 50.0;
                row[n / 4] = 50.0;
                row[2] = f32::NAN;
            }
            let ring = random_i32(r, seed + 1);
            let mut inputs = random_i32(1 + 2 * b, seed + 2);
            inputs[0] = s;
            let dims: &[usize] = if case % 2 == 0 { &[n] } else { &[1, n] };
            check_advance(&dev, &row, dims, &ring, &inputs);
            if n > 8 {
                assert_eq!(
                    reference(&row),
                    (n / 4) as i32,
                    "the tie goes to the first index"
                );
            }
        }
        // Rows whose largest value is not finite, or that hold only NaN: -1 in the ring, token 0.
        let broken: [&[f32]; 4] = [
            &[1.0, f32::INFINITY, f32::NAN, 2.0],
            &[f32::NAN, f32::NAN, f32::NAN],
            &[f32::NEG_INFINITY, f32::NEG_INFINITY],
            &[f32::NAN, 3.0, f32::NAN, -1.0],
        ];
        for (k, row) in broken.iter().enumerate() {
            let ring = random_i32(3, 400 + k as u64);
            let mut inputs = random_i32(5, 410 + k as u64);
            inputs[0] = 4 + k as i32;
            check_advance(&dev, row, &[row.len()], &ring, &inputs);
            let want = if k == 3 { 1 } else { -1 };
            assert_eq!(reference(row), want, "broken row {k}");
        }
    }

    #[test]
    fn argmax_advance_replays_as_a_greedy_decode_step() {
        // One recorded step run again and again with only x rewritten: each run keeps its token
        // in the ring at its step's slot and leaves the inputs for the next.
        let dev = Device::cpu(2).unwrap();
        let (n, r, b) = (1000, 4, 2);
        let x = dev.alloc(DType::F32, &[1, n]).unwrap();
        let mut ring = random_i32(r, 500);
        let mut inputs = random_i32(1 + 2 * b, 501);
        inputs[0] = 2;
        let rb = dev.upload(&ring, &[r]).unwrap();
        let ib = dev.upload(&inputs, &[inputs.len()]).unwrap();
        let executor = Executor::new(dev.clone());
        let mut s = executor.begin(Mode::Recorded);
        s.argmax_advance(&x, &rb, &ib).unwrap();
        let mut graph = s.into_graph().unwrap();
        Executor::optimize(&mut graph, &Plan::SEQUENTIAL, dev.capabilities());
        for step in 0..7u64 {
            let mut row = random_f32(n, 5.0, 510 + step);
            if step == 3 {
                row[17] = f32::INFINITY;
            }
            dev.write(&x, &row).unwrap();
            executor.run(&graph, false).unwrap();
            (ring, inputs) = advanced(&row, &ring, &inputs);
            assert_eq!(dev.download::<i32>(&rb).unwrap(), ring, "step {step}: ring");
            assert_eq!(
                dev.download::<i32>(&ib).unwrap(),
                inputs,
                "step {step}: inputs"
            );
        }
        assert_eq!(inputs[0], 9, "seven steps from position 2");
        assert_eq!(ring[(2 + 3) % r], -1, "the step with an infinity kept -1");
        // A step position that is negative, or whose successor is not an i32: a kernel error
        // naming the kernel and the value, and neither the ring nor the inputs written.
        for bad in [-1, i32::MIN, i32::MAX] {
            let mut bad_inputs = inputs.clone();
            bad_inputs[0] = bad;
            dev.write(&ib, &bad_inputs).unwrap();
            match executor.run(&graph, false) {
                Err(Error::Kernel {
                    kernel: "argmax_advance_f32",
                    msg,
                }) => assert!(msg.contains(&format!("inputs[0] = {bad}")), "{msg}"),
                other => panic!("step {bad}: expected a kernel error, got {other:?}"),
            }
            assert_eq!(dev.download::<i32>(&rb).unwrap(), ring, "step {bad}: ring");
            assert_eq!(
                dev.download::<i32>(&ib).unwrap(),
                bad_inputs,
                "step {bad}: inputs"
            );
        }
    }

    #[test]
    fn argmax_advance_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let alloc = |dt: DType, dims: &[usize]| dev.alloc(dt, dims).unwrap();
        let x = alloc(DType::F32, &[1, 10]);
        let ring = alloc(DType::I32, &[4]);
        let inputs = alloc(DType::I32, &[5]);
        let expect =
            |r: crate::error::Result<crate::graph::Dispatch>, arg: &str, says: &str| match r {
                Err(
                    e @ Error::DType {
                        op: "argmax_advance",
                        arg: a,
                        ..
                    },
                )
                | Err(
                    e @ Error::Shape {
                        op: "argmax_advance",
                        arg: a,
                        ..
                    },
                ) if a == arg => {
                    let msg = e.to_string();
                    assert!(msg.contains(says), "`{arg}`: {msg} does not say {says:?}");
                }
                other => {
                    panic!("expected an error naming argmax_advance and `{arg}`, got {other:?}")
                }
            };
        assert!(super::argmax_advance(&x, &ring, &inputs).is_ok());
        assert!(super::argmax_advance(&alloc(DType::F32, &[10]), &ring, &inputs).is_ok());
        let advance = super::argmax_advance;
        expect(
            advance(&alloc(DType::F16, &[1, 10]), &ring, &inputs),
            "x",
            "f32",
        );
        expect(
            advance(&x, &alloc(DType::F32, &[4]), &inputs),
            "ring",
            "i32",
        );
        expect(
            advance(&x, &ring, &alloc(DType::U32, &[5])),
            "inputs",
            "i32",
        );
        expect(
            advance(&alloc(DType::F32, &[2, 10]), &ring, &inputs),
            "x",
            "one non-empty row",
        );
        expect(
            advance(&alloc(DType::F32, &[1, 0]), &ring, &inputs),
            "x",
            "one non-empty row",
        );
        expect(
            advance(&x, &alloc(DType::I32, &[0]), &inputs),
            "ring",
            "at least one token",
        );
        for len in [4, 2, 1, 0] {
            expect(
                advance(&x, &ring, &alloc(DType::I32, &[len])),
                "inputs",
                "1 + 2B",
            );
        }
        // Views of one allocation that share bytes, and one that does not.
        let words = alloc(DType::I32, &[16]);
        let view = |offset: usize, len: usize| words.view(4 * offset, DType::I32, &[len]).unwrap();
        expect(
            advance(&x, &view(0, 4), &view(3, 5)),
            "ring",
            "overlaps argument `inputs`",
        );
        assert!(advance(&x, &view(0, 4), &view(4, 5)).is_ok());
        let floats: Buffer = alloc(DType::F32, &[16]);
        let row = floats.view(0, DType::F32, &[1, 10]).unwrap();
        let ring_in_x = floats.view(4 * 8, DType::I32, &[4]).unwrap();
        expect(
            advance(&row, &ring_in_x, &inputs),
            "ring",
            "overlaps argument `x`",
        );
        let inputs_in_x = floats.view(4 * 9, DType::I32, &[5]).unwrap();
        expect(
            advance(&row, &ring, &inputs_in_x),
            "inputs",
            "overlaps argument `x`",
        );
    }
}
