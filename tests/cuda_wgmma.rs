//! The Hopper form of the f16-activation prompt products (`matmul_wgmma.cuh`: `wgmma` from shared
//! memory, Q4_0, sm_90a) against the `mma.sync` form of the same kernels on the same GPU. A launch
//! takes the Hopper form only when it is given that form's shared memory (`MMW_SMEM`), so each
//! dispatch runs twice, once with it and once with the other forms' (`MMH_SMEM`), and the outputs
//! must be the same bits: both multiply the same f16 values and add the tensor cores' 16-product
//! sums into f32 accumulators in the same order of k (measured equal on an H100; the `mma.sync`
//! form is checked against the CPU in `cuda_matmul_mma.rs` and `cuda_narrow.rs`). Every kernel that
//! takes the form: the plain product, the product added into an accumulator, three products in one
//! launch and the gate/up pair with its SwiGLU, at rows 64, 100, 129 and 513 (partial 128-row
//! tiles), k of one, three and 64 steps of 64 values, outputs of one to eight tiles, and widths
//! the form does not take (not whole tiles: both launches then run the other form). Seeded random
//! inputs, never zeros. Needs a GPU of compute capability 9.0: ignored by default; on another GPU
//! both launches run the `mma.sync` form and the test only checks that they agree.

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use onepass::graph::{Arg, Dispatch, Grid, KernelId};
use onepass::kernels::{matmul as mm, WEIGHT_FORMATS};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// Dynamic shared memory of the `mma.sync` f16-activation form (`MMH_SMEM`, `matmul_mma_h.cuh`).
const MMH_SMEM: u32 = 3 * (128 * 72 * 2 + 128 * 44) + 2 * 128 * 72 * 2;
/// The Hopper form's (`MMW_SMEM`, `matmul_wgmma.cuh`): four slots of two 128 x 64 f16 tiles and
/// 1 KiB to align them.
const MMW_SMEM: u32 = 4 * 256 * 128 + 1024;

fn weights(dev: &Device, n: usize, k: usize, seed: u64) -> Buffer {
    let bytes = onepass::quant::quantize(DType::Q4_0, &random_f32(n * k, 1.0, seed)).unwrap();
    dev.upload_bytes(&bytes, DType::Q4_0, &[n, k]).unwrap()
}

/// The four kernels on f16 `x` (`rows` x `k`) and Q4_0 weights of `n` outputs, launched with
/// `smem` bytes of shared memory: the plain product, the product added into a random
/// accumulator, three products in one launch, and the SwiGLU pair (f16), each as raw bits.
fn run(dev: &Device, rows: usize, k: usize, n: usize, smem: u32) -> Vec<Vec<u32>> {
    let f = WEIGHT_FORMATS
        .iter()
        .position(|&d| d == DType::Q4_0)
        .unwrap();
    let xs: Vec<half::f16> = random_f32(rows * k, 2.0, 11)
        .iter()
        .map(|&v| half::f16::from_f32(v))
        .collect();
    let x = dev.upload(&xs, &[rows, k]).unwrap();
    let w: Vec<Buffer> = (0..3).map(|i| weights(dev, n, k, 12 + i)).collect();
    let f32s = |seed: u64| {
        dev.upload(&random_f32(rows * n, 1.0, seed), &[rows, n])
            .unwrap()
    };
    let outs: Vec<Buffer> = (0..4).map(|i| f32s(20 + i)).collect();
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
        Dispatch::new(
            KernelId::of(&mm::MATMUL_SWIGLU_MMA_H[f]),
            with_sizes(vec![
                Arg::read(&x),
                Arg::read(&w[0]),
                Arg::read(&w[1]),
                Arg::write(&hidden),
            ]),
            grid(64),
        ),
    ];
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    for d in dispatches {
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
    // (rows, k, n): partial row tiles, one and three steps, one to eight output tiles; 192
    // outputs are whole SwiGLU tiles (64) but not product tiles (128); 200 neither.
    let cases = [
        (64usize, 64usize, 128usize),
        (100, 192, 384),
        (129, 4096, 1024),
        (513, 192, 192),
        (513, 256, 200),
        (513, 4096, 256),
    ];
    for (rows, k, n) in cases {
        let hopper = run(&dev, rows, k, n, MMW_SMEM);
        let mma = run(&dev, rows, k, n, MMH_SMEM);
        for ((h, m), name) in hopper.iter().zip(&mma).zip(names) {
            let differ = h.iter().zip(m).position(|(a, b)| a != b);
            assert_eq!(
                differ, None,
                "rows {rows} k {k} n {n}: {name}: the Hopper and mma.sync forms differ"
            );
            let finite = h.iter().all(|&b| {
                if name == "swiglu" {
                    half::f16::from_bits(b as u16).is_finite()
                } else {
                    f32::from_bits(b).is_finite()
                }
            });
            assert!(
                finite,
                "rows {rows} k {k} n {n}: {name}: not every output written"
            );
        }
    }
}
