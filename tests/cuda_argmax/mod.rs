//! `argmax_advance` (the greedy token of one row kept in a ring on the device, and the step's
//! inputs advanced) on CUDA against the CPU backend, on the same seeded random inputs. Part of
//! `cuda_ops.rs` (whose harness it uses); every test needs a GPU.

use super::*;

#[test]
#[ignore = "needs a CUDA GPU"]
fn argmax_advance_family() {
    let dev = cuda_device();
    // (n, R, B, s): a vocabulary of 128,256 (Llama 3's), odd rows (1000 + 3 leaves a scalar tail
    // after the four-value loads), a row shorter than the block; s before, at and past the ring's
    // end (its slot wraps), and a large s.
    let cases = [
        (128_256usize, 8usize, 1usize, 0i32),
        (128_256, 8, 4, 8),
        (128_256, 3, 1, 1_000_001),
        (1000 + 3, 4, 2, 2),
        (1000 + 3, 4, 2, 7),
        (49_152, 1, 16, 5),
        (7, 5, 3, 12),
    ];
    for (case, &(n, r, b, s)) in cases.iter().enumerate() {
        let seed = 900 + 10 * case as u64;
        let mut v = random_f32(n, 10.0, seed);
        // A tie at the maximum (the first index must win), one a thread sees in the same
        // four-value load, and a NaN (skipped).
        v[n / 2] = 20.0;
        v[n - 1] = 20.0;
        v[n / 2 + 1] = 20.0;
        if n > 3 {
            v[1] = f32::NAN;
        }
        // The last case: an infinity, so the ring gets -1 and the next token is 0.
        if case == cases.len() - 1 {
            v[3] = f32::INFINITY;
        }
        let mut g = rng(seed + 1);
        let ring: Vec<i32> = (0..r).map(|_| g.random_range(1..=1_000_000)).collect();
        let mut inputs: Vec<i32> = (0..1 + 2 * b)
            .map(|_| g.random_range(1..=1_000_000))
            .collect();
        inputs[0] = s;
        let dims: &[usize] = if case % 2 == 0 { &[n] } else { &[1, n] };
        // The ring and the inputs are compared as inputs: the one slot and the three words the
        // op writes, and every other value it must leave as it was.
        compare(
            &format!("argmax_advance n {n}, R {r}, B {b}, s {s}"),
            &dev,
            &[
                float_tensor(&v, DType::F32, dims),
                i32_tensor(&ring, &[r]),
                i32_tensor(&inputs, &[1 + 2 * b]),
            ],
            &[],
            0.0,
            0.0,
            &|s, i, _| s.argmax_advance(&i[0], &i[1], &i[2]),
        );
    }
}
