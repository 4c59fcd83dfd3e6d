//! The gate/up/SwiGLU fusion on the GPU (`ops::matmul_swiglu`, `matmul_swiglu_mma_h_<w>`): a
//! prompt's MLP input (the norm, the gate and up products, the SwiGLU, the down product and its
//! residual add) gives bitwise the same residual fused, narrowed without the fusion, and in the
//! plain f32 forms (which round x to f16 before their `mma` and sum in the same order), at the
//! Llama 3.1 8B shape and at odd rows (100 and 513, partial tiles), for Q4_0, Q4_1 and Q5_0 and,
//! where the GPU's kernels are compiled for sm_90a (the Hopper form), Q4_K, Q6_K and Q8_0 (on
//! other GPUs those neither narrow nor fuse, which the test checks); and the fused kernel alone,
//! dispatched directly at widths that end in a partial tile of 64 outputs, gives the bits of the
//! two f16 products and `swiglu_f32_to_f16` dispatched the same way. Seeded random inputs, never
//! zeros. Needs a GPU: ignored by default, it fails where there is none (`ops::matmul_swiglu`'s
//! tests run the CPU kernels).

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use onepass::backend::{Capabilities, F16Products};
use onepass::graph::{Arg, Dispatch, Grid, KernelId};
use onepass::kernels::{elementwise as ew, matmul as mm, Fusion, FusionUse, WEIGHT_FORMATS};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

fn weights(dev: &Device, dtype: DType, n: usize, k: usize, seed: u64) -> Buffer {
    let bytes = onepass::quant::quantize(dtype, &random_f32(n * k, 1.0, seed)).unwrap();
    dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
}

/// The MLP input of `rows` rows, k, `ffn` hidden and `n` outputs, optimized with `caps` and
/// run: the residual's bits, the pair fusions made and the producers narrowed.
fn run_mlp(
    dev: &Device,
    caps: &Capabilities,
    dtype: DType,
    (rows, k, ffn, n): (usize, usize, usize, usize),
) -> (Vec<u32>, usize, usize) {
    let x = dev
        .upload(&random_f32(rows * k, 2.0, 81), &[rows, k])
        .unwrap();
    let norm = dev.upload(&random_f32(k, 1.0, 82), &[k]).unwrap();
    let (wg, wu, wd) = (
        weights(dev, dtype, ffn, k, 83),
        weights(dev, dtype, ffn, k, 84),
        weights(dev, dtype, n, ffn, 85),
    );
    let acc = dev
        .upload(&random_f32(rows * n, 1.0, 86), &[rows, n])
        .unwrap();
    let f32s = |width: usize| dev.alloc(DType::F32, &[rows, width]).unwrap();
    let (xn, gate, up, h, proj) = (f32s(k), f32s(ffn), f32s(ffn), f32s(ffn), f32s(n));
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.rms_norm(&x, &norm, &xn, 1e-5).unwrap();
    s.matmul(&xn, &wg, &gate).unwrap();
    s.matmul(&xn, &wu, &up).unwrap();
    s.swiglu(&gate, &up, &h).unwrap();
    s.matmul(&h, &wd, &proj).unwrap();
    s.add_inplace(&acc, &proj).unwrap();
    for b in [&xn, &gate, &up, &h, &proj] {
        s.mark_scratch(b);
    }
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    let bits = dev
        .download::<f32>(&acc)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let pairs = report
        .fusions_by_rule
        .get("matmul_swiglu")
        .copied()
        .unwrap_or(0);
    (bits, pairs, report.narrowed)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_fused_gate_up_swiglu_gives_the_unfused_bits() {
    let gpu = cuda_device();
    // The GPU's declarations: on sm_90a every block format's pairs fuse (the Hopper form), on
    // other GPUs Q4_0, Q4_1 and Q5_0's only.
    let caps = gpu.capabilities();
    let no_pair: Vec<FusionUse> = caps
        .fusions
        .iter()
        .filter(|u| u.fusion != Fusion::ProductPairSwiglu)
        .copied()
        .collect();
    let unfused = caps.with_fusions(Box::leak(no_pair.into_boxed_slice()));
    let plain = caps.with_f16_products(F16Products::None);
    let cases = [
        (DType::Q4_0, (512, 4096, 14336, 4096)),
        (DType::Q4_1, (100, 2048, 2112, 200)),
        (DType::Q5_0, (513, 2048, 8192, 2048)),
        (DType::Q4K, (512, 4096, 14336, 4096)),
        (DType::Q6K, (100, 4096, 14336, 4096)),
        (DType::Q8_0, (513, 2048, 8192, 2048)),
    ];
    for (dtype, shape) in cases {
        let what = format!("{dtype} {shape:?}");
        let takes = caps.f16_products.takes(dtype);
        let (f32_forms, p0, n0) = run_mlp(&gpu, &plain, dtype, shape);
        let (narrowed, p1, n1) = run_mlp(&gpu, &unfused, dtype, shape);
        let (fused, p2, n2) = run_mlp(&gpu, caps, dtype, shape);
        let (pairs, narrowings) = if takes { (1, 2) } else { (0, 0) };
        assert_eq!(
            (p0, p1, p2),
            (0, 0, pairs),
            "{what}: fused only where declared"
        );
        assert_eq!(
            (n0, n1, n2),
            (0, narrowings, narrowings),
            "{what}: the norm and SwiGLU narrowed where the GPU takes the format"
        );
        let differ = |a: &[u32], b: &[u32]| a.iter().zip(b).position(|(x, y)| x != y);
        assert_eq!(differ(&fused, &narrowed), None, "{what}: fused vs narrowed");
        assert_eq!(
            differ(&fused, &f32_forms),
            None,
            "{what}: fused vs f32 forms"
        );
    }
}

/// Dynamic shared memory of the f16-activation products' form (`MMH_SMEM` in
/// `matmul_mma_h.cuh`): three slots of 128 padded activation rows and 128 weight rows of 44
/// bytes, two f16 weight buffers.
const MMH_SMEM: u32 = 3 * (128 * 72 * 2 + 128 * 44) + 2 * 128 * 72 * 2;

/// A launch of the tensor-core form: `cols` output tiles, 128-row tiles.
fn grid(cols: usize, rows: usize) -> Grid {
    Grid::new(cols as u32, 256)
        .with_y(rows.div_ceil(128) as u32)
        .with_shared(MMH_SMEM)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_fused_kernel_alone_gives_the_unfused_bits_at_partial_widths() {
    let dev = cuda_device();
    for (dtype, rows, k, n) in [
        (DType::Q4_0, 100, 2048, 200),
        (DType::Q4_1, 513, 4096, 72),
        (DType::Q5_0, 64, 2048, 1000),
    ] {
        let f = WEIGHT_FORMATS.iter().position(|&d| d == dtype).unwrap();
        let xs: Vec<half::f16> = random_f32(rows * k, 2.0, 91)
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let x = dev.upload(&xs, &[rows, k]).unwrap();
        let (wg, wu) = (
            weights(&dev, dtype, n, k, 92),
            weights(&dev, dtype, n, k, 93),
        );
        let (gate, up) = (
            dev.alloc(DType::F32, &[rows, n]).unwrap(),
            dev.alloc(DType::F32, &[rows, n]).unwrap(),
        );
        let (want, got) = (
            dev.alloc(DType::F16, &[rows, n]).unwrap(),
            dev.alloc(DType::F16, &[rows, n]).unwrap(),
        );
        let sizes = [
            Arg::u32(rows as u32),
            Arg::u32(k as u32),
            Arg::u32(n as u32),
        ];
        let product = |w: &Buffer, out: &Buffer| {
            let mut args = vec![Arg::read(&x), Arg::read(w), Arg::write(out)];
            args.extend(sizes.iter().cloned());
            Dispatch::new(
                KernelId::of(&mm::MATMUL_MMA_H[f]),
                args,
                grid(n.div_ceil(128), rows),
            )
            .unwrap()
        };
        let mut fused_args = vec![
            Arg::read(&x),
            Arg::read(&wg),
            Arg::read(&wu),
            Arg::write(&got),
        ];
        fused_args.extend(sizes.iter().cloned());
        let dispatches = [
            product(&wg, &gate),
            product(&wu, &up),
            Dispatch::new(
                KernelId::of(&ew::SWIGLU_TO_F16),
                vec![Arg::read(&gate), Arg::read(&up), Arg::write(&want)],
                Grid::cover(rows * n, 256),
            )
            .unwrap(),
            Dispatch::new(
                KernelId::of(&mm::MATMUL_SWIGLU_MMA_H[f]),
                fused_args,
                grid(n.div_ceil(64), rows),
            )
            .unwrap(),
        ];
        let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
        for d in dispatches {
            s.push(d).unwrap();
        }
        s.finish(&Plan::SEQUENTIAL).unwrap();
        let (a, b) = (
            dev.download::<half::f16>(&got).unwrap(),
            dev.download::<half::f16>(&want).unwrap(),
        );
        let differ = a
            .iter()
            .zip(&b)
            .position(|(p, q)| p.to_bits() != q.to_bits());
        assert_eq!(differ, None, "{dtype} rows {rows} k {k} n {n}");
        // Not all zeros: the products ran.
        assert!(b.iter().filter(|v| v.to_f32() != 0.0).count() > rows * n / 2);
    }
}
