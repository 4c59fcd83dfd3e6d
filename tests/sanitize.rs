//! The schedule sanitizer: a graph of real ops passes; a kernel that reads what it declares as
//! only written, and a kernel pair whose hidden write the reorder pass moves a reader across, are
//! both caught; the SmolLM2 decode graph passes on the CPU (the CI check of issue 7, item 3).

use onepass::graph::{KernelSig, OpKind};
use onepass::kernels::{DTypes, Param};
use std::sync::{Arc, Mutex};

use onepass::backend::cpu::KernelArgs;
use onepass::graph::{Arg, Grid};
use onepass::model::fetch;
use onepass::model::gguf::GgufFile;
use onepass::model::tokenizer::Tokenizer;
use onepass::model::transformer::Transformer;
use onepass::ops::custom::CustomKernel;
use onepass::sanitize::{prefill_and_sanitize_decode, sanitize, SanitizeInput, POISON_F32};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use rand::{RngExt, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f32 = r.random_range(-1.0..1.0);
            if v.abs() < 1e-3 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

fn named(name: &str, b: &Buffer) -> (String, Buffer) {
    (name.to_string(), b.clone())
}

#[test]
fn given_a_graph_of_real_ops_when_sanitized_should_pass_with_the_optimizer_at_work() {
    let (rows, dim, ffn) = (3, 64, 96);
    let dev = Device::cpu(2).expect("cpu");
    let x = dev.upload(&random(rows * dim, 1), &[rows, dim]).expect("x");
    let norm_w = dev.upload(&random(dim, 2), &[dim]).expect("norm");
    let w_gate = dev
        .upload(&random(ffn * dim, 3), &[ffn, dim])
        .expect("gate");
    let w_up = dev.upload(&random(ffn * dim, 4), &[ffn, dim]).expect("up");
    let w_down = dev
        .upload(&random(dim * ffn, 5), &[dim, ffn])
        .expect("down");
    let scratch_of = |w: usize| dev.alloc(DType::F32, &[rows, w]).expect("scratch");
    let (t, xn, gate, up, hidden, proj) = (
        scratch_of(dim),
        scratch_of(dim),
        scratch_of(ffn),
        scratch_of(ffn),
        scratch_of(ffn),
        scratch_of(dim),
    );
    let y = dev.alloc(DType::F32, &[rows, dim]).expect("y");
    let acc = dev
        .upload(&random(rows * dim, 6), &[rows, dim])
        .expect("acc");

    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    // Two feed-forward blocks sharing the scratch, one fusable norm+mul each.
    for _ in 0..2 {
        s.rms_norm_no_scale(&x, &t, 1e-5).expect("norm");
        s.mul(&t, &norm_w, &xn).expect("mul");
        s.matmul(&xn, &w_gate, &gate).expect("gate");
        s.matmul(&xn, &w_up, &up).expect("up");
        s.swiglu(&gate, &up, &hidden).expect("swiglu");
        s.matmul(&hidden, &w_down, &proj).expect("down");
        s.add_inplace(&acc, &proj).expect("acc");
    }
    s.add(&x, &acc, &y).expect("add");
    let graph = s.into_graph().expect("graph");
    let acc_before = dev.download::<f32>(&acc).expect("acc");

    let scratch = [t, xn, gate, up, hidden, proj];
    let outputs = [named("y", &y), named("acc", &acc)];
    let report = sanitize(
        &exec,
        &Plan::OPTIMIZED,
        &SanitizeInput {
            graph: &graph,
            scratch: &scratch,
            outputs: &outputs,
        },
    )
    .expect("sanitize");
    assert!(report.passed(), "{}", report.verdict());
    assert_eq!(report.dispatches, 15);
    // The first block's norm output is overwritten by the second block's norm, and its down
    // projection's output by the second block's, so those two pairs fuse (norm+mul and
    // matmul+add); the second block's are still live at the end of the graph, so they stay apart.
    assert_eq!(report.fusions, 2, "{report:?}");
    assert!(
        report.groups_optimized < report.dispatches_optimized,
        "{report:?}"
    );
    assert!(
        report.poisoned_bytes_serial > 0 && report.poisoned_bytes_optimized > 0,
        "{report:?}"
    );
    assert_eq!(report.output_bytes, 2 * rows * dim * 4);
    assert!(
        report.verdict().starts_with("sanitize: ok"),
        "{}",
        report.verdict()
    );
    // Non-scratch state is as before; the scratch holds poison.
    assert_eq!(dev.download::<f32>(&acc).expect("acc"), acc_before);
    let poisoned = dev.download::<f32>(&scratch[0]).expect("t");
    assert!(
        poisoned.iter().all(|v| v.to_bits() == POISON_F32),
        "scratch is poisoned after the run"
    );
}

/// `out[i] += x[i]` although `out` is declared as written only: it reads dead bytes.
fn accumulate_into_write(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let x = args.input::<f32>(0)?;
    let out = args.output::<f32>(1)?;
    for (o, v) in out.iter_mut().zip(x) {
        *o += v;
    }
    Ok(())
}

const F32: DTypes = DTypes::one(DType::F32);
const MOVABLE: OpKind = OpKind::Custom { reorderable: true };

static ACCUMULATE_SIG: KernelSig = KernelSig::new(
    "test_sanitize_accumulate_f32",
    MOVABLE,
    &[Param::read("x", F32), Param::write("acc", F32)],
);
const ACCUMULATE: CustomKernel = CustomKernel {
    sig: &ACCUMULATE_SIG,
    cpu: accumulate_into_write,
};

#[test]
fn given_a_kernel_that_reads_its_declared_output_when_sanitized_should_report_a_declaration_mismatch(
) {
    let n = 40;
    let dev = Device::cpu(2).expect("cpu");
    let x = dev.upload(&random(n, 7), &[n]).expect("x");
    let scratch = dev.alloc(DType::F32, &[n]).expect("scratch");
    let y = dev.alloc(DType::F32, &[n]).expect("y");
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.scale(&x, 2.0, &y).expect("scale");
    s.custom(
        &ACCUMULATE,
        vec![Arg::read(&x), Arg::write(&scratch)],
        Grid::cover(n, 64),
    )
    .expect("custom");
    s.copy(&scratch, &y).expect("copy");
    let graph = s.into_graph().expect("graph");
    let outputs = [named("y", &y)];
    let report = sanitize(
        &exec,
        &Plan::OPTIMIZED,
        &SanitizeInput {
            graph: &graph,
            scratch: std::slice::from_ref(&scratch),
            outputs: &outputs,
        },
    )
    .expect("sanitize");
    assert!(!report.passed(), "{}", report.verdict());
    let m = report
        .declaration_mismatch
        .as_ref()
        .expect("declaration mismatch");
    assert_eq!(m.output, "y");
    assert_eq!(m.element, 0);
    assert_eq!(m.differing_elements, n);
    assert!(
        m.expected.contains("NaN"),
        "the NaN-poisoned run reads poison: {m:?}"
    );
    assert!(
        !m.got.contains("NaN"),
        "the zero-poisoned run reads zeros: {m:?}"
    );
    let node = m.first_divergent.as_ref().expect("divergent dispatch");
    assert_eq!(
        (node.index, node.kernel.as_str()),
        (1, ACCUMULATE.sig.name())
    );
    assert!(
        report.verdict().contains("MISMATCH"),
        "{}",
        report.verdict()
    );
}

/// Values one kernel hands to another outside any declared buffer: a write nobody declared.
static STASH: Mutex<Vec<f32>> = Mutex::new(Vec::new());

/// Reads `a` (declared) and stores it in [`STASH`] (undeclared).
fn stash_put(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let a = args.input::<f32>(0)?;
    *STASH
        .lock()
        .map_err(|_| onepass::Error::Backend("stash lock".into()))? = a.to_vec();
    Ok(())
}

/// Writes `2 * stash` into `out` (zeros when the stash is empty), emptying the stash.
fn stash_take(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let out = args.output::<f32>(0)?;
    let stash = std::mem::take(
        &mut *STASH
            .lock()
            .map_err(|_| onepass::Error::Backend("stash lock".into()))?,
    );
    for (i, o) in out.iter_mut().enumerate() {
        *o = 2.0 * stash.get(i).copied().unwrap_or(0.0);
    }
    Ok(())
}

static PUT_SIG: KernelSig =
    KernelSig::new("test_sanitize_stash_put", MOVABLE, &[Param::read("x", F32)]);
static TAKE_SIG: KernelSig = KernelSig::new(
    "test_sanitize_stash_take",
    MOVABLE,
    &[Param::write("out", F32)],
);
const PUT: CustomKernel = CustomKernel {
    sig: &PUT_SIG,
    cpu: stash_put,
};
const TAKE: CustomKernel = CustomKernel {
    sig: &TAKE_SIG,
    cpu: stash_take,
};

#[test]
fn given_a_missing_write_declaration_when_the_reorder_moves_a_reader_should_report_a_schedule_mismatch(
) {
    let n = 24;
    let dev = Device::cpu(2).expect("cpu");
    let x = dev.upload(&random(n, 8), &[n]).expect("x");
    let a = dev.alloc(DType::F32, &[n]).expect("a");
    let out = dev.alloc(DType::F32, &[n]).expect("out");
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.copy(&x, &a).expect("copy");
    s.custom(&PUT, vec![Arg::read(&a)], Grid::new(1, 1))
        .expect("put");
    s.custom(&TAKE, vec![Arg::write(&out)], Grid::new(1, 1))
        .expect("take");
    let graph = s.into_graph().expect("graph");
    let outputs = [named("out", &out)];
    let report = sanitize(
        &exec,
        &Plan::OPTIMIZED,
        &SanitizeInput {
            graph: &graph,
            scratch: std::slice::from_ref(&a),
            outputs: &outputs,
        },
    )
    .expect("sanitize");
    assert!(
        report.reordered > 0,
        "the reorder pass moved the reader: {report:?}"
    );
    assert!(report.declaration_mismatch.is_none(), "{report:?}");
    let m = report
        .schedule_mismatch
        .as_ref()
        .expect("schedule mismatch");
    assert_eq!(m.output, "out");
    let want = 2.0 * dev.download::<f32>(&x).expect("x")[m.element];
    assert!(m.expected.starts_with(&format!("{want:?}")), "{m:?}");
    assert!(m.got.starts_with("0.0"), "{m:?}");
    let node = m.first_divergent.as_ref().expect("divergent dispatch");
    assert_eq!((node.index, node.kernel.as_str()), (2, TAKE.sig.name()));
}

#[test]
fn given_scratch_that_is_read_before_it_is_written_when_sanitized_should_report_it() {
    let n = 16;
    let dev = Device::cpu(1).expect("cpu");
    let x = dev.upload(&random(n, 10), &[n]).expect("x");
    let y = dev.alloc(DType::F32, &[n]).expect("y");
    let exec = Executor::new(dev);
    let mut s = exec.begin(Mode::Recorded);
    s.scale(&x, 3.0, &y).expect("scale");
    let graph = s.into_graph().expect("graph");
    // `x` is an input, wrongly named as scratch: its contents are poison when the graph reads it.
    let outputs = [named("y", &y)];
    let report = sanitize(
        &exec,
        &Plan::OPTIMIZED,
        &SanitizeInput {
            graph: &graph,
            scratch: std::slice::from_ref(&x),
            outputs: &outputs,
        },
    )
    .expect("sanitize");
    let m = report
        .declaration_mismatch
        .as_ref()
        .expect("declaration mismatch");
    assert_eq!((m.output.as_str(), m.differing_elements), ("y", n));
    assert!(report.schedule_mismatch.is_none(), "{report:?}");
}

#[test]
fn given_no_outputs_when_sanitized_should_be_an_error() {
    let dev = Device::cpu(1).expect("cpu");
    let x = dev.upload(&random(4, 9), &[4]).expect("x");
    let y = dev.alloc(DType::F32, &[4]).expect("y");
    let exec = Executor::new(dev);
    let mut s = exec.begin(Mode::Recorded);
    s.copy(&x, &y).expect("copy");
    let graph = s.into_graph().expect("graph");
    let err = sanitize(
        &exec,
        &Plan::OPTIMIZED,
        &SanitizeInput {
            graph: &graph,
            scratch: &[],
            outputs: &[],
        },
    )
    .expect_err("no outputs");
    assert!(err.to_string().contains("no outputs"), "{err}");
}

#[test]
fn given_the_smollm2_decode_graph_when_sanitized_on_the_cpu_should_pass() {
    let cache = fetch::default_cache_dir().expect("cache dir");
    let path = fetch::resolve_model("smollm2", &cache, false).expect("default model");
    let file = Arc::new(GgufFile::open(&path).expect("open model"));
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let dev = Device::cpu(0).expect("cpu");
    let llama = Transformer::load(file, &dev, 96, 16).expect("load");
    let exec = Executor::new(dev);
    let prompt = tokenizer
        .encode("The sanitizer replays one decode step.", true)
        .expect("encode");
    let report =
        prefill_and_sanitize_decode(&llama, &exec, &Plan::OPTIMIZED, &prompt).expect("sanitize");
    eprintln!("{}", report.verdict());
    assert!(report.passed(), "{}", report.verdict());
    // The model records plain ops; on the CPU the optimizer fuses, in every layer, the attention
    // input (8 dispatches into 1), the MLP input (4 into 1) and both products with their
    // residual adds (2 into 1, twice): 4 fusions removing 12 dispatches a layer.
    let layers = llama.config().n_layer;
    assert_eq!(report.fusions, 4 * layers, "{report:?}");
    assert_eq!(
        report.dispatches_optimized,
        report.dispatches - 12 * layers,
        "{report:?}"
    );
    // Logits, the token ring, the step inputs its argmax advanced, and K and V of every layer.
    assert_eq!(report.outputs, 3 + 2 * llama.config().n_layer);
    assert!(report.poisoned_bytes_optimized > 0);
}
