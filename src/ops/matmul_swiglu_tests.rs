use crate::backend::{cpu, Capabilities, DType, Device, F16Products};
use crate::kernels::{Fusion, FusionUse};
use crate::session::FinishReport;
use crate::testutil::random_f32;
use crate::{Buffer, Executor, Mode, Plan};

const ROWS: usize = 64;
/// The shortest k the narrowing takes (`ops::narrow::MIN_K`).
const K: usize = 2048;
/// The MLP's hidden width: the down product's k, so a multiple of 64 of at least 2048 for the
/// SwiGLU to narrow.
const HIDDEN: usize = 2112;
/// The down product's outputs: a partial tile of 128.
const OUT: usize = 200;
/// The other block formats' hidden width (whole 256-value super-blocks, an even count of them so
/// Q6_K rows are word-aligned) and outputs (whole tiles): the Hopper form's shapes, the only ones
/// in which Q8_0, Q4_K and Q6_K narrow.
const HIDDEN_K: usize = 2560;
const OUT_K: usize = 256;

/// An MLP input as a prompt pass records it: the norm, the gate and up products, the SwiGLU, the
/// down product and its residual add.
struct Mlp {
    dev: Device,
    out: usize,
    x: Buffer,
    norm: Buffer,
    xn: Buffer,
    wg: Buffer,
    wu: Buffer,
    wd: Buffer,
    gate: Buffer,
    up: Buffer,
    h: Buffer,
    proj: Buffer,
}

fn weights(dev: &Device, dtype: DType, n: usize, k: usize, seed: u64) -> Buffer {
    let bytes = crate::quant::quantize(dtype, &random_f32(n * k, 1.0, seed)).unwrap();
    dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
}

fn mlp(dtype: DType) -> Mlp {
    let (hidden, out) = if !F16Products::SmallBlocks.takes(dtype) {
        (HIDDEN_K, OUT_K)
    } else {
        (HIDDEN, OUT)
    };
    let dev = Device::cpu(2).unwrap();
    let x = dev
        .upload(&random_f32(ROWS * K, 2.0, 71), &[ROWS, K])
        .unwrap();
    let norm = dev.upload(&random_f32(K, 1.0, 72), &[K]).unwrap();
    let f32s = |n: usize| dev.alloc(DType::F32, &[ROWS, n]).unwrap();
    Mlp {
        xn: f32s(K),
        wg: weights(&dev, dtype, hidden, K, 73),
        wu: weights(&dev, dtype, hidden, K, 74),
        wd: weights(&dev, dtype, out, hidden, 75),
        gate: f32s(hidden),
        up: f32s(hidden),
        h: f32s(hidden),
        proj: f32s(out),
        out,
        dev,
        x,
        norm,
    }
}

/// The MLP recorded (with `also_up`, an add of up's output into that buffer after the SwiGLU),
/// optimized with `caps` and run: the residual after it, and the report.
fn run(m: &Mlp, caps: &Capabilities, also_up: Option<&Buffer>) -> (Vec<u32>, FinishReport) {
    let acc = m
        .dev
        .upload(&random_f32(ROWS * m.out, 1.0, 76), &[ROWS, m.out])
        .unwrap();
    let exec = Executor::new(m.dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.rms_norm(&m.x, &m.norm, &m.xn, 1e-5).unwrap();
    s.matmul(&m.xn, &m.wg, &m.gate).unwrap();
    s.matmul(&m.xn, &m.wu, &m.up).unwrap();
    s.swiglu(&m.gate, &m.up, &m.h).unwrap();
    if let Some(other) = also_up {
        s.add_inplace(other, &m.up).unwrap();
    }
    s.matmul(&m.h, &m.wd, &m.proj).unwrap();
    s.add_inplace(&acc, &m.proj).unwrap();
    for b in [&m.xn, &m.gate, &m.up, &m.h, &m.proj] {
        s.mark_scratch(b);
    }
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    let bits = m
        .dev
        .download::<f32>(&acc)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    (bits, report)
}

/// The CPU's declarations with the narrowing on, as CUDA's for a prompt (no block fusion, which
/// the CPU makes at every row count and which would take the whole MLP input first), and without
/// the pair fusion when `pair` is false.
fn caps(pair: bool) -> Capabilities {
    caps_for(pair, F16Products::SmallBlocks)
}

/// [`caps`] declaring `products`.
fn caps_for(pair: bool, products: F16Products) -> Capabilities {
    let fusions: Vec<FusionUse> = cpu::CAPABILITIES
        .fusions
        .iter()
        .filter(|u| !matches!(u.fusion, Fusion::NormGateUp | Fusion::NormQkvRope))
        .filter(|u| pair || u.fusion != Fusion::ProductPairSwiglu)
        .copied()
        .collect();
    Capabilities {
        fusions: Box::leak(fusions.into_boxed_slice()),
        ..cpu::CAPABILITIES.with_f16_products(products)
    }
}

fn fused(report: &FinishReport) -> usize {
    report
        .fusions_by_rule
        .get("matmul_swiglu")
        .copied()
        .unwrap_or(0)
}

/// Once narrowed, the gate and up products and their SwiGLU fuse into one dispatch, whose
/// results are the unfused graph's, bit for bit; the unfused graph narrowed the norm and the
/// SwiGLU (so it is the graph the fusion replaces). Q4_0, Q4_1 and Q5_0 where their f16 products
/// are declared (`F16Products::SmallBlocks`), Q8_0, Q4_K and Q6_K where every block format's are
/// (`AllBlocks`: the Hopper form's shapes).
#[test]
fn a_narrowed_gate_up_pair_and_its_swiglu_fuse_with_the_same_bits() {
    let small = [DType::Q4_0, DType::Q4_1, DType::Q5_0].map(|d| (d, F16Products::SmallBlocks));
    let all = [DType::Q8_0, DType::Q4K, DType::Q6K].map(|d| (d, F16Products::AllBlocks));
    for (dtype, products) in small.into_iter().chain(all) {
        let m = mlp(dtype);
        let (plain, before) = run(&m, &caps_for(false, products), None);
        let (got, after) = run(&m, &caps_for(true, products), None);
        assert_eq!(
            (before.narrowed, fused(&before)),
            (2, 0),
            "{dtype}: unfused"
        );
        assert_eq!(fused(&after), 1, "{dtype}: fused once");
        assert_eq!(
            after.dispatches + 2,
            before.dispatches,
            "{dtype}: three dispatches became one"
        );
        assert!(
            got == plain,
            "{dtype}: the fused graph changed the residual"
        );
    }
}

/// Where something else reads up's output, or the weights are of a format the fused kernel does
/// not stage (Q8_0), nothing fuses, and the results stay the unfused graph's.
#[test]
fn a_pair_whose_output_is_read_elsewhere_or_not_staged_does_not_fuse() {
    let m = mlp(DType::Q4_0);
    let other = m
        .dev
        .upload(&random_f32(ROWS * HIDDEN, 1.0, 77), &[ROWS, HIDDEN])
        .unwrap();
    let (_, report) = run(&m, &caps(true), Some(&other));
    assert_eq!(fused(&report), 0, "up is read by an add");
    let q8 = mlp(DType::Q8_0);
    let (plain, before) = run(&q8, &caps(false), None);
    let (got, after) = run(&q8, &caps(true), None);
    assert_eq!(fused(&after), 0, "q8_0");
    assert_eq!(before.dispatches, after.dispatches);
    assert!(got == plain);
}
