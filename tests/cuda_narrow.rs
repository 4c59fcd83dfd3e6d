//! The narrowing on the GPU (`graph::passes::narrow`, `ops::narrow`): an f32 `rms_norm` read only
//! by tensor-core products, narrowed to `rms_norm_f32_to_f16` and the `_h` products (the f16
//! activation form in 64-value steps), gives bitwise what the unnarrowed graph gives on the same
//! GPU: the f32 tensor-core forms round x to f16 (round to nearest even) before their `mma`, the
//! f16 norm stores the same rounding of the same f32 values, and both sum in one order. At the
//! Llama 3.1 8B prompt shapes (q, k, v as one `matmul3_mma`, then the gate product; the SwiGLU
//! and the down product with its residual add) and odd ones (rows ending in a partial tile, 100
//! and 513; widths ending in a partial tile), and the prompt attention with the o product; every
//! block format the narrowing takes on sm_90a (`F16Products::AllBlocks`: on an H100 the Hopper
//! `wgmma` form runs the f16 products; on another GPU the `mma.sync` forms, slower for Q8_0,
//! Q4_K and Q6_K but the same bits), those three in whole 128-output tiles, the only shapes in
//! which they narrow.
//! Seeded random inputs, never zeros. Needs a GPU: ignored by default, it fails where there is none
//! (`ops::narrow`'s test runs the CPU kernels).

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use onepass::backend::{cuda, Capabilities, F16Products};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// The norm and four products of its output, optimized with `caps` and run; the outputs and the
/// producers narrowed.
fn run(
    dev: &Device,
    caps: &Capabilities,
    dtype: DType,
    rows: usize,
    k: usize,
    widths: &[usize; 4],
) -> (Vec<Vec<f32>>, usize) {
    let x = dev
        .upload(&random_f32(rows * k, 2.0, 51), &[rows, k])
        .unwrap();
    let norm = dev.upload(&random_f32(k, 1.0, 52), &[k]).unwrap();
    let xn = dev.alloc(DType::F32, &[rows, k]).unwrap();
    let ws: Vec<Buffer> = widths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let bytes =
                onepass::quant::quantize(dtype, &random_f32(n * k, 1.0, 60 + i as u64)).unwrap();
            dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
        })
        .collect();
    let outs: Vec<Buffer> = widths
        .iter()
        .map(|&n| dev.alloc(DType::F32, &[rows, n]).unwrap())
        .collect();
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.rms_norm(&x, &norm, &xn, 1e-5).unwrap();
    for (w, out) in ws.iter().zip(&outs) {
        s.matmul(&xn, w, out).unwrap();
    }
    s.mark_scratch(&xn);
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    let values = outs.iter().map(|o| dev.download(o).unwrap()).collect();
    (values, report.narrowed)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn narrowed_prompt_products_give_the_f32_forms_bits() {
    let gpu = cuda_device();
    let narrowing = cuda::CAPABILITIES.with_f16_products(F16Products::AllBlocks);
    let plain = cuda::CAPABILITIES.with_f16_products(F16Products::None);
    let cases: [(DType, usize, usize, [usize; 4]); 6] = [
        (DType::Q4_0, 512, 4096, [4096, 1024, 1024, 14336]),
        (DType::Q5_0, 513, 2048, [2048, 512, 512, 8192]),
        (DType::Q4_1, 100, 2048, [200, 64, 72, 96]),
        (DType::Q4K, 512, 4096, [4096, 1024, 1024, 14336]),
        (DType::Q6K, 513, 4096, [4096, 1024, 1024, 256]),
        (DType::Q8_0, 100, 2048, [2048, 512, 512, 8192]),
    ];
    for (dtype, rows, k, widths) in cases {
        let what = format!("{dtype} rows {rows} k {k}");
        let (want, none) = run(&gpu, &plain, dtype, rows, k, &widths);
        let (got, narrowed) = run(&gpu, &narrowing, dtype, rows, k, &widths);
        assert_eq!((none, narrowed), (0, 1), "{what}: the norm narrowed once");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let differ = g
                .iter()
                .zip(w)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                differ, None,
                "{what}: product {i}: narrowed and f32 forms differ"
            );
        }
    }
}

/// The SwiGLU, the down product and the residual add (one `matmul_add_mma`), optimized with
/// `caps` and run: the accumulator and the producers narrowed.
fn run_down(
    dev: &Device,
    caps: &Capabilities,
    dtype: DType,
    rows: usize,
    ffn: usize,
    n: usize,
) -> (Vec<f32>, usize) {
    let gate = dev
        .upload(&random_f32(rows * ffn, 3.0, 71), &[rows, ffn])
        .unwrap();
    let up = dev
        .upload(&random_f32(rows * ffn, 1.0, 72), &[rows, ffn])
        .unwrap();
    let hidden = dev.alloc(DType::F32, &[rows, ffn]).unwrap();
    let bytes = onepass::quant::quantize(dtype, &random_f32(n * ffn, 1.0, 73)).unwrap();
    let w = dev.upload_bytes(&bytes, dtype, &[n, ffn]).unwrap();
    let acc = dev
        .upload(&random_f32(rows * n, 1.0, 74), &[rows, n])
        .unwrap();
    let proj = dev.alloc(DType::F32, &[rows, n]).unwrap();
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.swiglu(&gate, &up, &hidden).unwrap();
    s.matmul(&hidden, &w, &proj).unwrap();
    s.add_inplace(&acc, &proj).unwrap();
    s.mark_scratch(&hidden);
    s.mark_scratch(&proj);
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    (dev.download(&acc).unwrap(), report.narrowed)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_narrowed_swiglu_and_down_product_give_the_f32_forms_bits() {
    let gpu = cuda_device();
    let narrowing = cuda::CAPABILITIES.with_f16_products(F16Products::AllBlocks);
    let plain = cuda::CAPABILITIES.with_f16_products(F16Products::None);
    let cases: [(DType, usize, usize, usize); 6] = [
        (DType::Q4_0, 512, 14336, 4096),
        (DType::Q4_1, 100, 8192, 2048),
        (DType::Q5_0, 513, 2048, 200),
        (DType::Q6K, 512, 14336, 4096),
        (DType::Q4K, 100, 14336, 4096),
        (DType::Q8_0, 513, 2048, 256),
    ];
    for (dtype, rows, ffn, n) in cases {
        let what = format!("{dtype} rows {rows} ffn {ffn} n {n}");
        let (want, none) = run_down(&gpu, &plain, dtype, rows, ffn, n);
        let (got, narrowed) = run_down(&gpu, &narrowing, dtype, rows, ffn, n);
        assert_eq!((none, narrowed), (0, 1), "{what}: the SwiGLU narrowed once");
        let differ = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(differ, None, "{what}: narrowed and f32 forms differ");
    }
}

/// Query heads, KV heads and head size of an attention case.
type Heads = (usize, usize, usize);

/// The tensor-core prompt attention (`heads` of `hd` over `kv` KV heads, the pass starting at
/// position 7), the o product and the residual add (one `matmul_add_mma`), optimized with `caps`
/// and run: the accumulator and the producers narrowed.
fn run_o(
    dev: &Device,
    caps: &Capabilities,
    dtype: DType,
    rows: usize,
    (heads, kv, hd): Heads,
    n: usize,
) -> (Vec<f32>, usize) {
    let (k, ctx) = (heads * hd, rows + 64);
    let q = dev
        .upload(&random_f32(rows * k, 1.0, 81), &[rows, k])
        .unwrap();
    let cache = |seed| {
        dev.upload(&random_f32(kv * ctx * hd, 1.0, seed), &[kv, ctx, hd])
            .unwrap()
    };
    let (kc, vc) = (cache(82), cache(83));
    let step = dev.upload(&[7i32], &[1]).unwrap();
    let attn = dev.alloc(DType::F32, &[rows, k]).unwrap();
    let bytes = onepass::quant::quantize(dtype, &random_f32(n * k, 1.0, 84)).unwrap();
    let w = dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap();
    let acc = dev
        .upload(&random_f32(rows * n, 1.0, 85), &[rows, n])
        .unwrap();
    let proj = dev.alloc(DType::F32, &[rows, n]).unwrap();
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    let params = onepass::ops::attention::AttentionParams::new(heads, kv, hd);
    s.attention(&q, &kc, &vc, &step, &attn, params).unwrap();
    s.matmul(&attn, &w, &proj).unwrap();
    s.add_inplace(&acc, &proj).unwrap();
    s.mark_scratch(&attn);
    s.mark_scratch(&proj);
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    (dev.download(&acc).unwrap(), report.narrowed)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_narrowed_attention_and_o_product_give_the_f32_forms_bits() {
    let gpu = cuda_device();
    let narrowing = cuda::CAPABILITIES.with_f16_products(F16Products::AllBlocks);
    let plain = cuda::CAPABILITIES.with_f16_products(F16Products::None);
    let cases: [(DType, usize, Heads, usize); 6] = [
        (DType::Q4_0, 512, (32, 8, 128), 4096),
        (DType::Q4_1, 100, (32, 8, 64), 2048),
        (DType::Q5_0, 513, (16, 4, 128), 200),
        (DType::Q6K, 512, (32, 8, 128), 4096),
        (DType::Q4K, 100, (32, 8, 64), 2048),
        (DType::Q8_0, 513, (16, 4, 128), 256),
    ];
    for (dtype, rows, heads, n) in cases {
        let what = format!("{dtype} rows {rows} heads {heads:?} n {n}");
        let (want, none) = run_o(&gpu, &plain, dtype, rows, heads, n);
        let (got, narrowed) = run_o(&gpu, &narrowing, dtype, rows, heads, n);
        assert_eq!(
            (none, narrowed),
            (0, 1),
            "{what}: the attention narrowed once"
        );
        let differ = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(differ, None, "{what}: narrowed and f32 forms differ");
    }
}
