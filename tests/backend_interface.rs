//! The backend interface as the layers above it use it: the model's passes and the optimizer's
//! fusions follow the device's declared capabilities (Llama's blocks and Gemma 3's GeGLU ones),
//! and waiting after every dispatch is an option of the encoder a session opens, which other
//! sessions on the same device do not see.

mod common;

use std::sync::Arc;

use onepass::backend::{BackendKind, EncoderOptions};
use onepass::graph::{Arg, ComputeGraph, Scalar};
use onepass::kernels::Fusion;
use onepass::model::arch::Family;
use onepass::model::gguf::GgufFile;
use onepass::model::synth::{write_synthetic_shape, ShapeParams};
use onepass::model::transformer::{Logits, Transformer};
use onepass::sanitize::prefill_and_sanitize_decode;
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};

/// Records one pass of `rows` rows of the tiny model on `device`.
fn record_pass(llama: &Transformer, device: &Device, rows: usize) -> ComputeGraph {
    let mut s = Executor::new(device.clone()).begin(Mode::Recorded);
    llama.record(&mut s, rows, Logits::Last, false).unwrap();
    s.into_graph().unwrap()
}

fn kernel_names(g: &ComputeGraph) -> Vec<&'static str> {
    g.dispatches().map(|d| d.kernel().name()).collect()
}

#[test]
fn the_model_plans_its_passes_from_the_declared_capabilities() {
    let dir = common::scratch_dir("backend-interface");
    let path = common::write_tiny(&dir, "tiny.gguf", &common::Tiny::default());
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let device = Device::cpu(2).unwrap();
    let caps = device.capabilities();
    let llama = Transformer::load(file, &device, 96, 8).unwrap();

    // Decode: the split attention with the declared chunk length, in as many dispatches as the
    // backend declares.
    let decode = record_pass(&llama, &device, 1);
    let names = kernel_names(&decode);
    let partials: Vec<_> = decode
        .dispatches()
        .filter(|d| d.kernel().name().starts_with("attention_decode_partial"))
        .collect();
    assert_eq!(
        partials.is_empty(),
        caps.single_dispatch_decode_attention,
        "{names:?}"
    );
    assert_eq!(partials.len(), common::N_LAYER, "{names:?}");
    for d in &partials {
        let at = d.kernel().sig().index_of("chunk_len").unwrap();
        match d.args()[at] {
            Arg::Scalar(Scalar::U32(chunk)) => {
                assert_eq!(chunk as usize, caps.decode_attention_chunk)
            }
            ref other => panic!("chunk_len is {other:?}"),
        }
    }

    // The model records plain ops only; the optimizer makes the fused block kernels for the
    // row counts each backend declares (every count on the CPU, one row on CUDA, which a CPU
    // device standing in for CUDA records and optimizes like CUDA without running anything).
    let stand_in = Device::cpu_standing_in_for(BackendKind::Cuda, 1).unwrap();
    let cuda_model = Transformer::load(llama_file(&path), &stand_in, 96, 8).unwrap();
    for (model, dev) in [(&llama, &device), (&cuda_model, &stand_in)] {
        let caps = dev.capabilities();
        let max = caps
            .fusion(Fusion::NormQkvRope)
            .map(|u| u.max_rows.unwrap_or(usize::MAX));
        for rows in [1, 2, 8] {
            let mut g = record_pass(model, dev, rows);
            let recorded = kernel_names(&g);
            assert!(
                !recorded.iter().any(|n| n.starts_with("norm_")),
                "{recorded:?}"
            );
            let report = Executor::optimize(&mut g, &Plan::OPTIMIZED, caps);
            let names = kernel_names(&g);
            let fused = names.iter().any(|n| n.starts_with("norm_qkv_rope"));
            let want = max.is_some_and(|m| rows <= m);
            assert_eq!(fused, want, "{}, {rows} rows: {names:?}", dev.name());
            assert_eq!(
                names.iter().any(|n| n.starts_with("norm_gate_up")),
                fused,
                "{rows} rows: {names:?}"
            );
            let by_rule = |r: &str| report.fusions_by_rule.get(r).copied().unwrap_or(0);
            let blocks = if want { common::N_LAYER } else { 0 };
            assert_eq!(by_rule("rms_norm+qkv+rope+kv_write"), blocks, "{report:?}");
            assert_eq!(by_rule("rms_norm+gate_up+glu"), blocks, "{report:?}");
            assert_eq!(by_rule("matmul+add"), 2 * common::N_LAYER, "{report:?}");
            // Llama adds each product into the residual directly: no norm to fuse with the add.
            assert_eq!(by_rule("rms_norm+add"), 0, "{report:?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Gemma 3's post-block norms, as the model records them after a product (`matmul -> proj;
/// rms_norm(proj) -> tmp; x += tmp`, with `proj` and `tmp` scratch): on the CPU and on CUDA's
/// declarations (a CPU device standing in), for one row and for several, the optimizer makes one
/// `rms_norm_add` of the norm and the add, and leaves the product alone (the norm, not an add,
/// reads it, so `matmul+add` does not apply). `gemma_blocks_fuse_...` checks the same on a whole
/// Gemma 3 recording.
#[test]
fn post_block_norms_fuse_into_rms_norm_add_on_both_backends() {
    let cpu = Device::cpu(2).unwrap();
    let stand_in = Device::cpu_standing_in_for(BackendKind::Cuda, 1).unwrap();
    for dev in [&cpu, &stand_in] {
        for rows in [1, 5] {
            let (k, d) = (96, 64);
            let buf = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
            let (attn, wo, proj) = (buf(&[rows, k]), buf(&[d, k]), buf(&[rows, d]));
            let (norm, tmp, x) = (buf(&[d]), buf(&[rows, d]), buf(&[rows, d]));
            let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
            s.matmul(&attn, &wo, &proj).unwrap();
            s.rms_norm(&proj, &norm, &tmp, 1e-6).unwrap();
            s.add_inplace(&x, &tmp).unwrap();
            s.mark_scratch(&proj);
            s.mark_scratch(&tmp);
            let mut g = s.into_graph().unwrap();
            let report = Executor::optimize(&mut g, &Plan::OPTIMIZED, dev.capabilities());
            let names = kernel_names(&g);
            let what = format!("{}, {rows} rows: {report:?}", dev.name());
            assert_eq!(names, ["matmul_f32", "rms_norm_add_f32"], "{what}");
            assert_eq!(
                report.fusions_by_rule.get("rms_norm+add"),
                Some(&1),
                "{what}"
            );
            assert_eq!(report.fusions, 1, "{what}");
        }
    }
}

fn llama_file(path: &std::path::Path) -> Arc<GgufFile> {
    Arc::new(GgufFile::open(path).unwrap())
}

/// A small synthetic Gemma 3 (GeGLU feed-forward, q/k norms, norms after attention and the MLP):
/// 3 layers, hidden 64, 2 query heads and 1 KV head of 32, FFN 96, a window of 4.
fn tiny_gemma(path: &std::path::Path) {
    let p = ShapeParams {
        name: "tiny-gemma",
        family: Family::Gemma3,
        n_layer: 3,
        dim: 64,
        n_head: 2,
        n_kv_head: 1,
        head_dim: 32,
        ffn_dim: 96,
        vocab: 200,
        rope_base: 10000.0,
        ctx: 64,
        tied: true,
        window: Some(4),
    };
    write_synthetic_shape(&p, DType::Q8_0.into(), 5, None, path, &mut |_, _| {}).unwrap();
}

#[test]
fn gemma_blocks_fuse_their_geglu_mlp_input_and_post_block_norms() {
    let dir = common::scratch_dir("backend-interface-gemma");
    let path = dir.join("tiny-gemma.gguf");
    tiny_gemma(&path);
    let n_layer = 3;
    let device = Device::cpu(2).unwrap();
    let stand_in = Device::cpu_standing_in_for(BackendKind::Cuda, 1).unwrap();
    let gemma = Transformer::load(llama_file(&path), &device, 32, 8).unwrap();
    let cuda_gemma = Transformer::load(llama_file(&path), &stand_in, 32, 8).unwrap();
    // Every layer records `rms_norm`, the gate and up products and `geglu`; the rule makes one
    // `norm_gate_up` of them for every row count on the CPU, for one-row passes on CUDA.
    for (model, dev, max_rows) in [(&gemma, &device, usize::MAX), (&cuda_gemma, &stand_in, 1)] {
        for rows in [1, 3] {
            let mut g = record_pass(model, dev, rows);
            let count = |g: &ComputeGraph, prefix: &str| {
                kernel_names(g)
                    .iter()
                    .filter(|n| n.starts_with(prefix))
                    .count()
            };
            assert_eq!(count(&g, "geglu_"), n_layer, "{:?}", kernel_names(&g));
            let report = Executor::optimize(&mut g, &Plan::OPTIMIZED, dev.capabilities());
            let fused = if rows <= max_rows { n_layer } else { 0 };
            let what = format!("{}, {rows} rows: {report:?}", dev.name());
            let by_rule = report.fusions_by_rule.get("rms_norm+gate_up+glu");
            assert_eq!(by_rule.copied().unwrap_or(0), fused, "{what}");
            assert_eq!(count(&g, "norm_gate_up_q8_0"), fused, "{what}");
            assert_eq!(count(&g, "geglu_"), n_layer - fused, "{what}");
            // Both post-block norms of every layer fuse with their residual adds, on both
            // backends and for every row count.
            let norm_add = report.fusions_by_rule.get("rms_norm+add").copied();
            assert_eq!(norm_add.unwrap_or(0), 2 * n_layer, "{what}");
            assert_eq!(count(&g, "rms_norm_add_f32"), 2 * n_layer, "{what}");
            // The per-head query and key norms of every layer fuse with the RoPE after them, on
            // both backends and for every row count; no plain rope is left.
            let norm_rope = report.fusions_by_rule.get("rms_norm+rope").copied();
            assert_eq!(norm_rope.unwrap_or(0), 2 * n_layer, "{what}");
            assert_eq!(count(&g, "rms_norm_rope_f32"), 2 * n_layer, "{what}");
            assert_eq!(count(&g, "rope_"), 0, "{what}");
        }
    }
    // On the CPU the fused decode step gives the plain step's bits (the schedule sanitizer runs it
    // serially and optimized, dead bytes poisoned, and compares the logits and the caches).
    let exec = Executor::new(device.clone());
    let prompt = [3, 17, 150, 9, 42, 7];
    let report = prefill_and_sanitize_decode(&gemma, &exec, &Plan::OPTIMIZED, &prompt).unwrap();
    assert!(report.passed(), "{}", report.verdict());
    assert!(report.fusions >= n_layer, "{report:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `out = a + b` for one value per buffer.
fn add_one(s: &mut onepass::Session, a: &Buffer, b: &Buffer, out: &Buffer) {
    s.add(a, b, out).unwrap();
}

#[test]
fn waiting_after_each_dispatch_belongs_to_the_session_that_asked() {
    let device = Device::cpu(2).unwrap();
    let exec = Executor::new(device.clone());
    let x = device.upload(&[1.0f32, 2.0], &[2]).unwrap();
    let (plain_out, sync_out, later_out) = (
        device.alloc(DType::F32, &[2]).unwrap(),
        device.alloc(DType::F32, &[2]).unwrap(),
        device.alloc(DType::F32, &[2]).unwrap(),
    );
    let sync_each = EncoderOptions {
        sync_each_dispatch: true,
    };

    // Two direct sessions on one device, used in turn.
    let mut plain = exec.begin(Mode::Direct);
    let mut synced = exec.begin_with(Mode::Direct, sync_each);
    assert_eq!(plain.options(), EncoderOptions::default());
    assert_eq!(synced.options(), sync_each);
    add_one(&mut plain, &x, &x, &plain_out);
    add_one(&mut synced, &x, &x, &sync_out);

    // The synchronized session's dispatch has run by the time `add` returned; the plain one's is
    // only encoded (the CPU submits a short direct pass when it finishes).
    assert_eq!(device.download::<f32>(&sync_out).unwrap(), [2.0, 4.0]);
    assert_eq!(device.download::<f32>(&plain_out).unwrap(), [0.0, 0.0]);

    // A session opened after the synchronized one is as plain as the first.
    let mut later = exec.begin(Mode::Direct);
    add_one(&mut later, &x, &x, &later_out);
    assert_eq!(device.download::<f32>(&later_out).unwrap(), [0.0, 0.0]);

    synced.add_inplace(&sync_out, &x).unwrap();
    assert_eq!(device.download::<f32>(&sync_out).unwrap(), [3.0, 6.0]);
    assert_eq!(device.download::<f32>(&plain_out).unwrap(), [0.0, 0.0]);

    for (s, out, want) in [
        (plain, &plain_out, [2.0f32, 4.0]),
        (synced, &sync_out, [3.0, 6.0]),
        (later, &later_out, [2.0, 4.0]),
    ] {
        let report = s.finish(&Plan::SEQUENTIAL).unwrap();
        assert!(report.dispatches >= 1);
        assert_eq!(device.download::<f32>(out).unwrap(), want);
    }
}

#[test]
fn a_recorded_session_runs_its_graph_with_its_own_encoder_options() {
    let device = Device::cpu(2).unwrap();
    let exec = Executor::new(device.clone());
    let x = device.upload(&[1.0f32, -2.0, 0.5], &[3]).unwrap();
    let y = device.alloc(DType::F32, &[3]).unwrap();
    let z = device.alloc(DType::F32, &[3]).unwrap();
    for options in [
        EncoderOptions::default(),
        EncoderOptions {
            sync_each_dispatch: true,
        },
    ] {
        let mut s = exec.begin_with(Mode::Recorded, options);
        s.add(&x, &x, &y).unwrap();
        s.add(&y, &x, &z).unwrap();
        let report = s.finish(&Plan::OPTIMIZED).unwrap();
        assert_eq!(report.dispatches + report.fusions, 2, "{options:?}");
        assert_eq!(
            device.download::<f32>(&z).unwrap(),
            [3.0, -6.0, 1.5],
            "{options:?}"
        );
    }
}
