//! The Hopper form of the f16-activation prompt products (`matmul_wgmma.cuh`: `wgmma` from shared
//! memory, sm_90a) against the `mma.sync` forms of the same kernels on the same GPU, for every
//! block format it takes (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K). A launch takes the Hopper form
//! only when it is given that form's shared memory (`MMW_SMEM`), so each product runs twice, once
//! with it and once with the other forms' (`MMH_SMEM`), and the outputs must be the same bits:
//! both multiply the same f16 values and add the tensor cores' 16-product sums into f32
//! accumulators in the same order of k (measured equal on an H100; the `mma.sync` forms are
//! checked against the CPU in `cuda_matmul_mma.rs` and `cuda_narrow.rs`). Every kernel that takes
//! the form: the plain product, the product added into an accumulator, three products in one
//! launch, and the gate/up pair with its SwiGLU (fused in the Hopper run; in the other run the two
//! f16 products and `swiglu_f32_to_f16`, as the `mma.sync` fused form has no Q8_0, Q4_K or Q6_K
//! tiles). Rows 64, 100, 129, 511 and 513 (partial 128-row tiles), k of one to 64 steps of 64 values
//! (whole super-blocks for the K formats; Q6_K rows of an odd count of 210-byte super-blocks are
//! not word-aligned, so there both runs take the other forms), outputs of one to eight tiles, and
//! widths the form does not take (not whole tiles). Seeded random inputs, never zeros. Needs a
//! GPU of compute capability 9.0: ignored by default; on another GPU both runs take the
//! `mma.sync` forms and the test only checks that they agree.

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use onepass::graph::{Arg, Dispatch, Grid, KernelId};
use onepass::kernels::{elementwise as ew, matmul as mm, WEIGHT_FORMATS};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// Dynamic shared memory of the `mma.sync` f16-activation form (`MMH_SMEM`, `matmul_mma_h.cuh`).
const MMH_SMEM: u32 = 3 * (128 * 72 * 2 + 128 * 44) + 2 * 128 * 72 * 2;
/// The Hopper form's (`MMW_SMEM`, `matmul_wgmma.cuh`): four slots of two 128 x 64 f16 tiles and
/// 1 KiB to align them.
const MMW_SMEM: u32 = 4 * 256 * 128 + 1024;

fn weights(dev: &Device, dtype: DType, n: usize, k: usize, seed: u64) -> Buffer {
    let bytes = onepass::quant::quantize(dtype, &random_f32(n * k, 1.0, seed)).unwrap();
    dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
}

/// The four kernels on f16 `x` (`rows` x `k`) and `dtype` weights of `n` outputs, launched with
/// `smem` bytes of shared memory: the plain product, the product added into a random
/// accumulator, three products in one launch, and the SwiGLU pair (f16; `fused`: the fused
/// kernel, else two products and `swiglu_f32_to_f16`), each as raw bits.
fn run(
    dev: &Device,
    dtype: DType,
    (rows, k, n): (usize, usize, usize),
    smem: u32,
    fused: bool,
) -> Vec<Vec<u32>> {
    let f = WEIGHT_FORMATS.iter().position(|&d| d == dtype).unwrap();
    let xs: Vec<half::f16> = random_f32(rows * k, 2.0, 11)
        .iter()
        .map(|&v| half::f16::from_f32(v))
        .collect();
    let x = dev.upload(&xs, &[rows, k]).unwrap();
    let w: Vec<Buffer> = (0..3).map(|i| weights(dev, dtype, n, k, 12 + i)).collect();
    let f32s = |seed: u64| {
        dev.upload(&random_f32(rows * n, 1.0, seed), &[rows, n])
            .unwrap()
    };
    let outs: Vec<Buffer> = (0..4).map(|i| f32s(20 + i)).collect();
    let (gate, up) = (f32s(40), f32s(41));
    let acc = f32s(30);
    let hidden = dev.alloc(DType::F16, &[rows, n]).unwrap();
    let sizes = [
        Arg::u32(rows as u32),
        Arg::u32(k as u32),
        Arg::u32(n as u32),
    ];
    let grid = |tile: usize| {
        Grid::new(n.div_ceil(tile) as u32, 256)
            .with_y(rows.div_ceil(128) as u32)
            .with_shared(smem)
    };
    let with_sizes = |mut args: Vec<Arg>| {
        args.extend(sizes.iter().cloned());
        args
    };
    let mut triple = vec![Arg::read(&x)];
    triple.extend(w.iter().map(Arg::read));
    triple.extend(outs[1..].iter().map(Arg::write));
    triple.extend([rows, k, n, n, n].map(|v| Arg::u32(v as u32)));
    let dispatches = [
        Dispatch::new(
            KernelId::of(&mm::MATMUL_MMA_H[f]),
            with_sizes(vec![Arg::read(&x), Arg::read(&w[0]), Arg::write(&outs[0])]),
            grid(128),
        ),
        Dispatch::new(
            KernelId::of(&mm::MATMUL_ADD_MMA_H[f]),
            with_sizes(vec![Arg::read(&x), Arg::read(&w[1]), Arg::read_write(&acc)]),
            grid(128),
        ),
        Dispatch::new(KernelId::of(&mm::MATMUL3_MMA_H[f]), triple, {
            let g = grid(128);
            Grid::new(3 * n.div_ceil(128) as u32, 256)
                .with_y(g.blocks[1])
                .with_shared(smem)
        }),
    ];
    let product = |w: &Buffer, out: &Buffer| {
        let args = with_sizes(vec![Arg::read(&x), Arg::read(w), Arg::write(out)]);
        Dispatch::new(KernelId::of(&mm::MATMUL_MMA_H[f]), args, grid(128))
    };
    let swiglu = if fused {
        vec![Dispatch::new(
            KernelId::of(&mm::MATMUL_SWIGLU_MMA_H[f]),
            with_sizes(vec![
                Arg::read(&x),
                Arg::read(&w[0]),
                Arg::read(&w[1]),
                Arg::write(&hidden),
            ]),
            grid(64),
        )]
    } else {
        vec![
            product(&w[0], &gate),
            product(&w[1], &up),
            Dispatch::new(
                KernelId::of(&ew::SWIGLU_TO_F16),
                vec![Arg::read(&gate), Arg::read(&up), Arg::write(&hidden)],
                Grid::cover(rows * n, 256),
            ),
        ]
    };
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    for d in dispatches.into_iter().chain(swiglu) {
        s.push(d.unwrap()).unwrap();
    }
    s.finish(&Plan::SEQUENTIAL).unwrap();
    let bits = |b: &Buffer| -> Vec<u32> {
        dev.download::<f32>(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let mut all: Vec<Vec<u32>> = outs.iter().map(bits).collect();
    all.push(bits(&acc));
    let h = dev.download::<half::f16>(&hidden).unwrap();
    all.push(h.iter().map(|v| u32::from(v.to_bits())).collect());
    all
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_hopper_form_gives_the_mma_forms_bits() {
    let dev = cuda_device();
    let names = [
        "matmul",
        "matmul3 0",
        "matmul3 1",
        "matmul3 2",
        "matmul_add",
        "swiglu",
    ];
    // (rows, k, n): partial row tiles, one to 64 steps, one to eight output tiles; 192 outputs
    // are whole SwiGLU tiles (64) but not product tiles (128); 200 neither. The K formats take the
    // cases of whole 256-value super-blocks.
    let cases = [
        (64usize, 64usize, 128usize),
        (100, 192, 384),
        (64, 512, 128),
        (100, 1024, 384),
        (129, 4096, 1024),
        (513, 192, 192),
        (513, 256, 200),
        (513, 512, 192),
        (511, 512, 256),
        (513, 4096, 256),
    ];
    let formats = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
    ];
    for dtype in formats {
        for shape in cases {
            let (rows, k, n) = shape;
            if k % dtype.block_elems() != 0 {
                continue;
            }
            // The fused SwiGLU kernel has an `mma.sync` form for Q4_0, Q4_1 and Q5_0 only: the
            // others fuse only in the Hopper form's shapes (whole 64-output tiles, rows a whole
            // number of words, 16 bytes for Q4_K).
            let row_bytes = k / dtype.block_elems() * dtype.block_bytes();
            let align = if dtype == DType::Q4K { 16 } else { 4 };
            let small = matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q5_0);
            let fused = small || (n % 64 == 0 && row_bytes % align == 0);
            let hopper = run(&dev, dtype, shape, MMW_SMEM, fused);
            let mma = run(&dev, dtype, shape, MMH_SMEM, false);
            for ((h, m), name) in hopper.iter().zip(&mma).zip(names) {
                let what = format!("{dtype} rows {rows} k {k} n {n}: {name}");
                let differ = h.iter().zip(m).position(|(a, b)| a != b);
                assert_eq!(differ, None, "{what}: the Hopper and mma.sync forms differ");
                let finite = h.iter().all(|&b| {
                    if name == "swiglu" {
                        half::f16::from_bits(b as u16).is_finite()
                    } else {
                        f32::from_bits(b).is_finite()
                    }
                });
                assert!(finite, "{what}: not every output written");
            }
        }
    }
}
