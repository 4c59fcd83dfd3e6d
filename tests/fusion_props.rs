//! Property tests of the optimizer's fusion rules on random programs of plain ops, run on the
//! CPU (seeded proptest cases, never zeros):
//!
//! - a program is a random sequence of decoder-block motifs over shared buffers, as a model
//!   records them: the attention input (norm, q/k/v products, RoPE, cache writes), the MLP input
//!   (norm, gate/up products, SwiGLU or GeGLU), a product with its residual add, and a product
//!   whose norm is added into the residual (Gemma 3's post-block norms), each possibly spoiled by
//!   one perturbation: an intermediate read again after the motif, or a write of what an earlier
//!   op of the motif reads (the residual, for the input norms) in the middle of it;
//! - the program recorded, fused and reordered (`Plan::OPTIMIZED`, the CPU's rules) gives the
//!   bits of the same program run op by op (`Mode::Direct`, `Plan::SEQUENTIAL`) in every buffer
//!   it leaves readable (the CPU's fused kernels run the plain ops' own loops: bitwise);
//! - each rule fires exactly on the motifs left intact: never where an intermediate is read
//!   later or a write intervenes.

mod seeded;

use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::{Buffer, DType, Device, Executor, FinishReport, Mode, Plan, Session};
use seeded::random_f32;

const DIM: usize = 128;
const HD: usize = 32;
const N_HEAD: usize = 4;
const N_KV: usize = 2;
const FFN: usize = 96;
const MAX_CTX: usize = 16;
const EPS: f32 = 1e-5;

/// What spoils a motif.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Spoil {
    /// Nothing: the motif must fuse.
    None,
    /// Intermediate number `i` of the motif (the norm's output, then the outputs of the products
    /// that the fused kernel does not write: k and v, gate and up, the product before the add)
    /// is copied out after the motif, so it is live.
    ReadLater(usize),
    /// After the motif's first product, a write of what an earlier op of the motif reads (the
    /// residual, for the norm) or of the product's output (before the residual add, or the
    /// post-block norm's add, reads it).
    WriteBetween,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Motif {
    Qkv(Spoil),
    /// The MLP input; `true`: GeGLU (Gemma), `false`: SwiGLU.
    GateUp(Spoil, bool),
    MatMulAdd(Spoil),
    /// A product, the norm of it and the add of the norm into the residual.
    PostNormAdd(Spoil),
}

fn spoil(intermediates: usize) -> impl Strategy<Value = Spoil> {
    prop_oneof![
        2 => Just(Spoil::None),
        1 => (0..intermediates).prop_map(Spoil::ReadLater),
        1 => Just(Spoil::WriteBetween),
    ]
}

fn motif() -> impl Strategy<Value = Motif> {
    prop_oneof![
        spoil(3).prop_map(Motif::Qkv),
        (spoil(3), any::<bool>()).prop_map(|(sp, geglu)| Motif::GateUp(sp, geglu)),
        spoil(1).prop_map(Motif::MatMulAdd),
        spoil(1).prop_map(Motif::PostNormAdd),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    motifs: Vec<Motif>,
    rows: usize,
    dtype: DType,
    neox: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(motif(), 1..=6),
        1usize..=3,
        prop_oneof![
            Just(DType::F32),
            Just(DType::F16),
            Just(DType::Q8_0),
            Just(DType::Q4_1),
            Just(DType::Q5_0)
        ],
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(motifs, rows, dtype, neox, seed)| Case {
            motifs,
            rows,
            dtype,
            neox,
            seed,
        })
}

/// The buffers of one program.
struct Bufs {
    x: Buffer,
    bias: Buffer,
    norm: Buffer,
    w: [Buffer; 6],
    positions: Buffer,
    step: Buffer,
    xn: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    gate: Buffer,
    up: Buffer,
    hidden: Buffer,
    proj: Buffer,
    caches: [Buffer; 2],
    /// One probe per motif, for a copied-out intermediate (as wide as the widest).
    probes: Vec<Buffer>,
}

impl Bufs {
    fn new(dev: &Device, c: &Case) -> Bufs {
        let rows = c.rows;
        let s = c.seed;
        let up = |n: usize, dims: &[usize], seed: u64| {
            dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
        };
        let weight = |n: usize, k: usize, seed: u64| {
            let bytes = onepass::quant::quantize(c.dtype, &random_f32(n * k, 0.5, seed)).unwrap();
            dev.upload_bytes(&bytes, c.dtype, &[n, k]).unwrap()
        };
        let f32s = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
        let cache = [N_KV, MAX_CTX, HD];
        Bufs {
            x: up(rows * DIM, &[rows, DIM], s),
            bias: up(rows * DIM, &[rows, DIM], s ^ 1),
            norm: up(DIM, &[DIM], s ^ 2),
            w: [
                weight(N_HEAD * HD, DIM, s ^ 3),
                weight(N_KV * HD, DIM, s ^ 4),
                weight(N_KV * HD, DIM, s ^ 5),
                weight(FFN, DIM, s ^ 6),
                weight(FFN, DIM, s ^ 7),
                weight(DIM, FFN, s ^ 8),
            ],
            positions: dev
                .upload::<i32>(
                    &(0..rows as i32).map(|r| 3 + r).collect::<Vec<_>>(),
                    &[rows],
                )
                .unwrap(),
            step: dev.upload::<i32>(&[3], &[1]).unwrap(),
            xn: f32s(&[rows, DIM]),
            q: f32s(&[rows, N_HEAD * HD]),
            k: f32s(&[rows, N_KV * HD]),
            v: f32s(&[rows, N_KV * HD]),
            gate: f32s(&[rows, FFN]),
            up: f32s(&[rows, FFN]),
            hidden: up(rows * FFN, &[rows, FFN], s ^ 9),
            proj: f32s(&[rows, DIM]),
            caches: [
                up(N_KV * MAX_CTX * HD, &cache, s ^ 10),
                up(N_KV * MAX_CTX * HD, &cache, s ^ 11),
            ],
            probes: c.motifs.iter().map(|_| f32s(&[rows, DIM])).collect(),
        }
    }

    /// What the program leaves readable: everything but the marked scratch.
    fn outputs(&self) -> Vec<&Buffer> {
        let mut v = vec![
            &self.x,
            &self.q,
            &self.hidden,
            &self.caches[0],
            &self.caches[1],
        ];
        v.extend(&self.probes);
        v
    }
}

/// Copies `t` into the front of `probe` (a view of `t`'s size).
fn copy_out(s: &mut Session, t: &Buffer, probe: &Buffer) {
    let dst = probe.view(0, DType::F32, t.dims()).unwrap();
    s.copy(t, &dst).unwrap();
}

/// Records (or runs) the program of `c` into `s`.
fn program(s: &mut Session, b: &Bufs, c: &Case) {
    let mode = if c.neox {
        RopeMode::NeoX
    } else {
        RopeMode::Normal
    };
    let rope = RopeParams::new(mode, HD, 10_000.0);
    let [wq, wk, wv, wg, wu, wd] = &b.w;
    for (i, m) in c.motifs.iter().enumerate() {
        let probe = &b.probes[i];
        let disturb = |s: &mut Session, sp: Spoil| {
            if sp == Spoil::WriteBetween {
                s.add_inplace(&b.x, &b.bias).unwrap();
            }
        };
        match *m {
            Motif::Qkv(sp) => {
                s.rms_norm(&b.x, &b.norm, &b.xn, EPS).unwrap();
                s.matmul(&b.xn, wq, &b.q).unwrap();
                disturb(s, sp);
                s.matmul(&b.xn, wk, &b.k).unwrap();
                s.matmul(&b.xn, wv, &b.v).unwrap();
                s.rope(&b.q, &b.positions, &b.q, &rope).unwrap();
                s.rope(&b.k, &b.positions, &b.k, &rope).unwrap();
                s.kv_write(&b.k, &b.caches[0], &b.step).unwrap();
                s.kv_write(&b.v, &b.caches[1], &b.step).unwrap();
                if let Spoil::ReadLater(t) = sp {
                    copy_out(s, [&b.xn, &b.k, &b.v][t], probe);
                }
            }
            Motif::GateUp(sp, geglu) => {
                s.rms_norm(&b.x, &b.norm, &b.xn, EPS).unwrap();
                s.matmul(&b.xn, wg, &b.gate).unwrap();
                disturb(s, sp);
                s.matmul(&b.xn, wu, &b.up).unwrap();
                if geglu {
                    s.geglu(&b.gate, &b.up, &b.hidden).unwrap();
                } else {
                    s.swiglu(&b.gate, &b.up, &b.hidden).unwrap();
                }
                if let Spoil::ReadLater(t) = sp {
                    copy_out(s, [&b.xn, &b.gate, &b.up][t], probe);
                }
            }
            Motif::MatMulAdd(sp) => {
                s.matmul(&b.hidden, wd, &b.proj).unwrap();
                if sp == Spoil::WriteBetween {
                    s.add_inplace(&b.proj, &b.bias).unwrap();
                }
                s.add_inplace(&b.x, &b.proj).unwrap();
                if let Spoil::ReadLater(_) = sp {
                    copy_out(s, &b.proj, probe);
                }
            }
            Motif::PostNormAdd(sp) => {
                s.matmul(&b.hidden, wd, &b.proj).unwrap();
                s.rms_norm(&b.proj, &b.norm, &b.xn, EPS).unwrap();
                if sp == Spoil::WriteBetween {
                    s.add_inplace(&b.proj, &b.bias).unwrap();
                }
                s.add_inplace(&b.x, &b.xn).unwrap();
                if let Spoil::ReadLater(_) = sp {
                    copy_out(s, &b.xn, probe);
                }
            }
        }
    }
    for t in [&b.xn, &b.k, &b.v, &b.gate, &b.up, &b.proj] {
        s.mark_scratch(t);
    }
}

/// Runs the program of `c` on a fresh CPU device in `mode` with `plan`; returns the bits of
/// every readable buffer and the report.
fn run(c: &Case, mode: Mode, plan: &Plan) -> (Vec<Vec<u32>>, FinishReport) {
    let dev = Device::cpu(2).unwrap();
    let b = Bufs::new(&dev, c);
    let mut s = Executor::new(dev.clone()).begin(mode);
    program(&mut s, &b, c);
    let report = s.finish(plan).unwrap();
    let bits = b
        .outputs()
        .iter()
        .map(|t| {
            let v = dev.download::<f32>(t).unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        })
        .collect();
    (bits, report)
}

/// How many motifs of each kind are intact (and must fuse).
fn intact(c: &Case) -> [usize; 4] {
    let mut n = [0; 4];
    for m in &c.motifs {
        match m {
            Motif::Qkv(Spoil::None) => n[0] += 1,
            Motif::GateUp(Spoil::None, _) => n[1] += 1,
            Motif::MatMulAdd(Spoil::None) => n[2] += 1,
            Motif::PostNormAdd(Spoil::None) => n[3] += 1,
            _ => {}
        }
    }
    n
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        rng_seed: RngSeed::Fixed(0x5eed_0018),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fused_and_reordered_programs_give_the_plain_serial_bits(c in case()) {
        let (plain, direct) = run(&c, Mode::Direct, &Plan::SEQUENTIAL);
        prop_assert_eq!(direct.fusions, 0);
        let (fused, report) = run(&c, Mode::Recorded, &Plan::OPTIMIZED);
        for (i, (a, b)) in plain.iter().zip(&fused).enumerate() {
            prop_assert!(a == b, "output {} differs: {:?} {:?}", i, c, report);
        }
        let by_rule = |r: &str| report.fusions_by_rule.get(r).copied().unwrap_or(0);
        let [qkv, gate_up, mm_add, norm_add] = intact(&c);
        prop_assert_eq!(by_rule("rms_norm+qkv+rope+kv_write"), qkv, "{:?} {:?}", c, report);
        prop_assert_eq!(by_rule("rms_norm+gate_up+glu"), gate_up, "{:?} {:?}", c, report);
        prop_assert_eq!(by_rule("matmul+add"), mm_add, "{:?} {:?}", c, report);
        prop_assert_eq!(by_rule("rms_norm+add"), norm_add, "{:?} {:?}", c, report);
    }
}
