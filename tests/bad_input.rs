//! Bad input everywhere a user can give it: every public op builder with one bad argument at a
//! time (the error must name the op and the argument), buffer views that do not fit, context
//! overflow, token ids outside the vocabulary, empty prompts, and the CLI given non-UTF-8 input,
//! broken model files and bad flags (one `error: ...` line and a non-zero exit, never a panic).
//!
//! The model-dependent tests use a tiny synthetic llama (2 layers, dim 64, byte-level vocabulary)
//! written with the GGUF writer, so they need no downloaded model.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::gguf_write::GgufWriter;
use onepass::model::llama::{Llama, Logits};
use onepass::model::sampler::SamplerConfig;
use onepass::ops::attention::{self, AttentionParams};
use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::ops::{argmax, copy, elementwise, embedding, kv_cache, matmul, norm, softmax};
use onepass::{Buffer, DType, Device, Executor, Mode, Result};

// ---------------------------------------------------------------------------------------------
// Op argument checks.

fn dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| Device::cpu(1).unwrap())
}

fn buf(dtype: DType, dims: &[usize]) -> Buffer {
    dev().alloc(dtype, dims).unwrap()
}

fn f32b(dims: &[usize]) -> Buffer {
    buf(DType::F32, dims)
}

/// One bad call: the op and argument its error must name, and the call.
struct Case {
    op: &'static str,
    arg: &'static str,
    call: Box<dyn Fn() -> Result<()>>,
}

fn case<T: 'static>(
    op: &'static str,
    arg: &'static str,
    call: impl Fn() -> Result<T> + 'static,
) -> Case {
    Case {
        op,
        arg,
        call: Box::new(move || call().map(|_| ())),
    }
}

fn rope_params(head_dim: usize, rotary_dim: usize, base: f32) -> RopeParams<'static> {
    RopeParams {
        mode: RopeMode::Normal,
        head_dim,
        rotary_dim,
        base,
        freq_factors: None,
    }
}

/// Every public op builder, each with one bad argument (the others valid).
fn cases() -> Vec<Case> {
    let (x, w, o) = (f32b(&[3, 8]), f32b(&[8]), f32b(&[3, 8]));
    let xi = buf(DType::I32, &[3, 8]);
    let xh = buf(DType::F16, &[3, 8]);
    // A view of `x`'s allocation that overlaps it partially (shifted by one row).
    let big = f32b(&[4, 8]);
    let (lo, hi) = (big.rows(0, 3).unwrap(), big.rows(1, 3).unwrap());
    let p = AttentionParams::new(4, 2, 8);
    let q = f32b(&[2, 32]);
    let (kc, vc) = (f32b(&[2, 16, 8]), f32b(&[2, 16, 8]));
    let step = buf(DType::I32, &[1]);
    let q1 = f32b(&[1, 32]);
    let parts_len = attention::attention_decode_scratch_len(p, 16, 4).unwrap();
    let parts = f32b(&[parts_len]);
    let pos = buf(DType::I32, &[3]);
    let table = f32b(&[10, 8]);
    let ids = buf(DType::I32, &[3]);
    let wm = f32b(&[5, 8]);
    let out5 = f32b(&[3, 5]);
    let wq = buf(DType::U32, &[5, 1]); // 4-bit affine: 32 values per row -> 4 words; wrong on purpose below
    let we = f32b(&[2, 5, 8]);
    let ide = buf(DType::I32, &[3, 2]);

    macro_rules! c {
        ($op:literal, $arg:literal, || $e:expr) => {
            case($op, $arg, move || $e)
        };
        ($op:literal, $arg:literal, |$($v:ident),*| $e:expr) => {{
            $(let $v = $v.clone();)*
            case($op, $arg, move || $e)
        }};
    }
    vec![
        // norm
        c!("rms_norm", "x", |xi, w, o| norm::rms_norm(
            &xi, &w, &o, 1e-5
        )),
        c!("rms_norm", "weight", |x, o| norm::rms_norm(
            &x,
            &f32b(&[7]),
            &o,
            1e-5
        )),
        c!("rms_norm", "weight", |x, o| norm::rms_norm(
            &x,
            &buf(DType::F16, &[8]),
            &o,
            1e-5
        )),
        c!("rms_norm", "out", |x, w| norm::rms_norm(
            &x,
            &w,
            &f32b(&[3, 7]),
            1e-5
        )),
        c!("rms_norm", "out", |x, w| norm::rms_norm(
            &x,
            &w,
            &buf(DType::F16, &[3, 8]),
            1e-5
        )),
        c!("rms_norm", "eps", |x, w, o| norm::rms_norm(
            &x,
            &w,
            &o,
            f32::NAN
        )),
        c!("rms_norm", "out", |lo, hi, w| norm::rms_norm(
            &lo, &w, &hi, 1e-5
        )),
        c!("rms_norm_no_scale", "x", |xi, o| norm::rms_norm_no_scale(
            &xi, &o, 1e-5
        )),
        c!("rms_norm_no_scale", "out", |x| norm::rms_norm_no_scale(
            &x,
            &f32b(&[8, 3]),
            1e-5
        )),
        c!("rms_norm_no_scale", "eps", |x, o| norm::rms_norm_no_scale(
            &x, &o, -1.0
        )),
        c!("rms_norm_mul", "m", |x, w, o| norm::rms_norm_mul(
            &x,
            Some(&w),
            &f32b(&[5]),
            &o,
            1e-5
        )),
        c!("rms_norm_mul", "weight", |x, w, o| norm::rms_norm_mul(
            &x,
            Some(&f32b(&[4])),
            &w,
            &o,
            1e-5
        )),
        c!("rms_norm_mul", "out", |x, w| norm::rms_norm_mul(
            &x,
            None,
            &w,
            &f32b(&[3, 9]),
            1e-5
        )),
        c!("rms_norm_mul", "x", |xi, w, o| norm::rms_norm_mul(
            &xi, None, &w, &o, 1e-5
        )),
        // elementwise
        c!("add", "a", |xi, w, o| elementwise::add(&xi, &w, &o)),
        c!("add", "b", |x, o| elementwise::add(&x, &f32b(&[2, 8]), &o)),
        c!("add", "b", |x, xh, o| elementwise::add(&x, &xh, &o)),
        c!("add", "out", |x, w| elementwise::add(
            &x,
            &w,
            &f32b(&[3, 4])
        )),
        c!("add", "out", |x, w| elementwise::add(
            &x,
            &w,
            &buf(DType::BF16, &[3, 8])
        )),
        c!("mul", "b", |x, o| elementwise::mul(&x, &f32b(&[9]), &o)),
        c!("mul", "out", |x, w| elementwise::mul(&x, &w, &f32b(&[24]))),
        c!("swiglu", "gate", |xi, o| elementwise::swiglu(&xi, &o, &o)),
        c!("swiglu", "up", |x, w, o| elementwise::swiglu(&x, &w, &o)),
        c!("swiglu", "out", |x| elementwise::swiglu(
            &x,
            &x.clone(),
            &f32b(&[2, 8])
        )),
        c!("scale", "s", |x, o| elementwise::scale(
            &x,
            f32::INFINITY,
            &o
        )),
        c!("scale", "x", |xi, o| elementwise::scale(&xi, 2.0, &o)),
        c!("scale", "out", |x| elementwise::scale(
            &x,
            2.0,
            &f32b(&[3, 9])
        )),
        c!("gelu_tanh", "x", |xi, o| elementwise::gelu_tanh(&xi, &o)),
        c!("gelu_tanh", "out", |x| elementwise::gelu_tanh(
            &x,
            &f32b(&[4, 8])
        )),
        c!("gelu_erf", "out", |x, xh| elementwise::gelu_erf(&x, &xh)),
        c!("silu", "out", |x| elementwise::silu(&x, &f32b(&[8, 3]))),
        c!("silu", "out", |lo, hi| elementwise::silu(&lo, &hi)),
        c!("softcap", "cap", |x, o| elementwise::softcap(&x, 0.0, &o)),
        c!("softcap", "cap", |x, o| elementwise::softcap(
            &x,
            f32::NAN,
            &o
        )),
        c!("softcap", "out", |x| elementwise::softcap(
            &x,
            5.0,
            &f32b(&[2])
        )),
        // copy
        c!("copy", "src", |xi, o| copy::copy(&xi, &o)),
        c!("copy", "dst", |x| copy::copy(&x, &f32b(&[3, 7]))),
        c!("copy", "dst", |x| copy::copy(&x, &buf(DType::U8, &[24]))),
        c!("copy", "dst", |lo, hi| copy::copy(&lo, &hi)),
        // embedding
        c!("embedding", "table", |ids, o| embedding::embedding(
            &f32b(&[80]),
            &ids,
            &o
        )),
        c!("embedding", "table", |ids, o| embedding::embedding(
            &buf(DType::I32, &[10, 8]),
            &ids,
            &o
        )),
        c!("embedding", "ids", |table, o| embedding::embedding(
            &table,
            &f32b(&[3]),
            &o
        )),
        c!("embedding", "out", |table, ids| embedding::embedding(
            &table,
            &ids,
            &f32b(&[3, 7])
        )),
        c!("embedding", "out", |table, ids| embedding::embedding(
            &table,
            &ids,
            &f32b(&[4, 8])
        )),
        c!("embedding", "out", |table, ids, xh| embedding::embedding(
            &table, &ids, &xh
        )),
        // kv_cache
        c!("kv_write", "new", |kc, step| kv_cache::kv_write(
            &f32b(&[2, 15]),
            &kc,
            &step
        )),
        c!("kv_write", "new", |kc, step| kv_cache::kv_write(
            &f32b(&[17, 16]),
            &kc,
            &step
        )),
        c!("kv_write", "new", |kc, step| kv_cache::kv_write(
            &buf(DType::F16, &[2, 16]),
            &kc,
            &step
        )),
        c!("kv_write", "cache", |step| kv_cache::kv_write(
            &f32b(&[2, 16]),
            &f32b(&[16, 16]),
            &step
        )),
        c!("kv_write", "cache", |step| kv_cache::kv_write(
            &f32b(&[2, 16]),
            &buf(DType::I32, &[2, 16, 8]),
            &step
        )),
        c!("kv_write", "step", |kc| kv_cache::kv_write(
            &f32b(&[2, 16]),
            &kc,
            &f32b(&[1])
        )),
        c!("kv_write", "step", |kc| kv_cache::kv_write(
            &f32b(&[2, 16]),
            &kc,
            &buf(DType::I32, &[0])
        )),
        // matmul
        c!("matmul", "w", |x, out5| matmul::matmul(
            &x,
            &f32b(&[1, 5, 8]),
            &out5
        )),
        c!("matmul", "w", |x, out5| matmul::matmul(
            &x,
            &buf(DType::U8, &[5, 8]),
            &out5
        )),
        c!("matmul", "x", |wm, out5| matmul::matmul(
            &f32b(&[3, 7]),
            &wm,
            &out5
        )),
        c!("matmul", "x", |wm, out5| matmul::matmul(
            &buf(DType::F16, &[3, 8]),
            &wm,
            &out5
        )),
        c!("matmul", "out", |x, wm| matmul::matmul(
            &x,
            &wm,
            &f32b(&[3, 6])
        )),
        c!("matmul", "out", |x, wm| matmul::matmul(
            &x,
            &wm,
            &f32b(&[2, 5])
        )),
        c!("matmul", "out", |x, wm| matmul::matmul(
            &x,
            &wm,
            &buf(DType::F16, &[3, 5])
        )),
        c!("matmul_affine", "bits", |wq| {
            let s = f32b(&[5, 1]);
            matmul::matmul_affine(&f32b(&[3, 32]), &wq, &s, &s, 3, 32, &f32b(&[3, 5]))
        }),
        c!("matmul_affine", "group_size", |wq| {
            let s = f32b(&[5, 1]);
            matmul::matmul_affine(&f32b(&[3, 32]), &wq, &s, &s, 4, 48, &f32b(&[3, 5]))
        }),
        c!("matmul_affine", "w", |wq| {
            // 32 values of 4 bits are 4 words per row, not 1.
            let s = f32b(&[5, 1]);
            matmul::matmul_affine(&f32b(&[3, 32]), &wq, &s, &s, 4, 32, &f32b(&[3, 5]))
        }),
        c!("matmul_affine", "w", || {
            let s = f32b(&[5, 1]);
            matmul::matmul_affine(
                &f32b(&[3, 32]),
                &f32b(&[5, 4]),
                &s,
                &s,
                4,
                32,
                &f32b(&[3, 5]),
            )
        }),
        c!("matmul_affine", "scales", || {
            let s = f32b(&[5, 1]);
            let w4 = buf(DType::U32, &[5, 4]);
            matmul::matmul_affine(
                &f32b(&[3, 32]),
                &w4,
                &f32b(&[5, 2]),
                &s,
                4,
                32,
                &f32b(&[3, 5]),
            )
        }),
        c!("matmul_affine", "biases", || {
            let s = f32b(&[5, 1]);
            let w4 = buf(DType::U32, &[5, 4]);
            let b = buf(DType::F16, &[5, 1]);
            matmul::matmul_affine(&f32b(&[3, 32]), &w4, &s, &b, 4, 32, &f32b(&[3, 5]))
        }),
        c!("matmul_affine", "x", || {
            let s = f32b(&[5, 1]);
            let w4 = buf(DType::U32, &[5, 4]);
            matmul::matmul_affine(&f32b(&[3, 31]), &w4, &s, &s, 4, 32, &f32b(&[3, 5]))
        }),
        c!("matmul_affine", "out", || {
            let s = f32b(&[5, 1]);
            let w4 = buf(DType::U32, &[5, 4]);
            matmul::matmul_affine(&f32b(&[3, 32]), &w4, &s, &s, 4, 32, &f32b(&[3, 4]))
        }),
        c!("matmul_id", "w", |x, ide| matmul::matmul_id(
            &x,
            &f32b(&[5, 8]),
            &ide,
            &f32b(&[3, 2, 5])
        )),
        c!("matmul_id", "x", |we, ide| matmul::matmul_id(
            &f32b(&[3, 9]),
            &we,
            &ide,
            &f32b(&[3, 2, 5])
        )),
        c!("matmul_id", "ids", |x, we| matmul::matmul_id(
            &x,
            &we,
            &buf(DType::I32, &[2, 2]),
            &f32b(&[3, 2, 5])
        )),
        c!("matmul_id", "ids", |x, we| matmul::matmul_id(
            &x,
            &we,
            &f32b(&[3, 2]),
            &f32b(&[3, 2, 5])
        )),
        c!("matmul_id", "out", |x, we, ide| matmul::matmul_id(
            &x,
            &we,
            &ide,
            &f32b(&[3, 5])
        )),
        // rope
        c!("rope", "x", |xi, pos, o| onepass::ops::rope::rope(
            &xi,
            &pos,
            &o,
            &rope_params(4, 4, 1e4)
        )),
        c!("rope", "x", |pos| onepass::ops::rope::rope(
            &f32b(&[8]),
            &pos,
            &f32b(&[8]),
            &rope_params(4, 4, 1e4)
        )),
        c!("rope", "positions", |x, o| onepass::ops::rope::rope(
            &x,
            &buf(DType::I32, &[2]),
            &o,
            &rope_params(4, 4, 1e4)
        )),
        c!("rope", "positions", |x, o| onepass::ops::rope::rope(
            &x,
            &f32b(&[3]),
            &o,
            &rope_params(4, 4, 1e4)
        )),
        c!("rope", "head_dim", |x, pos, o| onepass::ops::rope::rope(
            &x,
            &pos,
            &o,
            &rope_params(3, 2, 1e4)
        )),
        c!("rope", "rotary_dim", |x, pos, o| onepass::ops::rope::rope(
            &x,
            &pos,
            &o,
            &rope_params(4, 3, 1e4)
        )),
        c!("rope", "rotary_dim", |x, pos, o| onepass::ops::rope::rope(
            &x,
            &pos,
            &o,
            &rope_params(4, 8, 1e4)
        )),
        c!("rope", "base", |x, pos, o| onepass::ops::rope::rope(
            &x,
            &pos,
            &o,
            &rope_params(4, 4, 0.0)
        )),
        c!("rope", "freq_factors", |x, pos, o| {
            let ff = f32b(&[3]);
            let mut rp = rope_params(4, 4, 1e4);
            rp.freq_factors = Some(&ff);
            onepass::ops::rope::rope(&x, &pos, &o, &rp)
        }),
        c!("rope", "out", |x, pos| onepass::ops::rope::rope(
            &x,
            &pos,
            &f32b(&[3, 4]),
            &rope_params(4, 4, 1e4)
        )),
        c!("rope", "out", |x, pos, xh| onepass::ops::rope::rope(
            &x,
            &pos,
            &xh,
            &rope_params(4, 4, 1e4)
        )),
        // softmax
        c!("softmax", "x", |xi, o| softmax::softmax(&xi, &o, 1.0, None)),
        c!("softmax", "out", |x| softmax::softmax(
            &x,
            &f32b(&[3, 4]),
            1.0,
            None
        )),
        c!("softmax", "scale", |x, o| softmax::softmax(
            &x,
            &o,
            f32::NAN,
            None
        )),
        c!("softmax", "mask", |x, o| softmax::softmax(
            &x,
            &o,
            1.0,
            Some(&f32b(&[2, 8]))
        )),
        c!("softmax", "mask", |x, o| softmax::softmax(
            &x,
            &o,
            1.0,
            Some(&f32b(&[3, 7]))
        )),
        c!("softmax", "mask", |x, o, xh| softmax::softmax(
            &x,
            &o,
            1.0,
            Some(&xh)
        )),
        // argmax
        c!("argmax", "x", |xh| argmax::argmax(
            &xh,
            &buf(DType::I32, &[3])
        )),
        c!("argmax", "out", |x| argmax::argmax(
            &x,
            &buf(DType::I32, &[2])
        )),
        c!("argmax", "out", |x| argmax::argmax(&x, &f32b(&[3]))),
        // attention
        c!("attention", "q", |kc, vc, step| attention::attention(
            &f32b(&[2, 31]),
            &kc,
            &vc,
            &step,
            &f32b(&[2, 31]),
            p
        )),
        c!("attention", "q", |kc, vc, step| attention::attention(
            &f32b(&[17, 32]),
            &kc,
            &vc,
            &step,
            &f32b(&[17, 32]),
            p
        )),
        c!("attention", "q", |kc, vc, step| attention::attention(
            &buf(DType::F16, &[2, 32]),
            &kc,
            &vc,
            &step,
            &f32b(&[2, 32]),
            p
        )),
        c!("attention", "k_cache", |q, vc, step| attention::attention(
            &q,
            &f32b(&[4, 16, 8]),
            &vc,
            &step,
            &q.clone(),
            p
        )),
        c!("attention", "k_cache", |q, vc, step| attention::attention(
            &q,
            &f32b(&[2, 16, 4]),
            &vc,
            &step,
            &q.clone(),
            p
        )),
        c!("attention", "v_cache", |q, kc, step| attention::attention(
            &q,
            &kc,
            &f32b(&[2, 8, 8]),
            &step,
            &q.clone(),
            p
        )),
        c!("attention", "v_cache", |q, kc, step| attention::attention(
            &q,
            &kc,
            &buf(DType::F16, &[2, 16, 8]),
            &step,
            &q.clone(),
            p
        )),
        c!("attention", "step", |q, kc, vc| attention::attention(
            &q,
            &kc,
            &vc,
            &f32b(&[1]),
            &f32b(&[2, 32]),
            p
        )),
        c!("attention", "out", |q, kc, vc, step| attention::attention(
            &q,
            &kc,
            &vc,
            &step,
            &f32b(&[2, 16]),
            p
        )),
        c!("attention", "params", |q, kc, vc, step| {
            attention::attention(
                &q,
                &kc,
                &vc,
                &step,
                &f32b(&[2, 32]),
                AttentionParams::new(4, 3, 8),
            )
        }),
        c!("attention", "params", |q, kc, vc, step| {
            attention::attention(&q, &kc, &vc, &step, &f32b(&[2, 32]), p.with_softcap(-1.0))
        }),
        c!("attention", "params", |q, kc, vc, step| {
            attention::attention(&q, &kc, &vc, &step, &f32b(&[2, 32]), p.with_scale(f32::NAN))
        }),
        c!("attention_decode", "q", |q, kc, vc, step, parts| {
            attention::attention_decode(&q, &kc, &vc, &step, &parts, &f32b(&[2, 32]), p, 4)
        }),
        c!("attention_decode", "partials", |q1, kc, vc, step| {
            attention::attention_decode(&q1, &kc, &vc, &step, &f32b(&[7]), &f32b(&[1, 32]), p, 4)
        }),
        c!("attention_decode", "partials", |q1, kc, vc, step, parts| {
            attention::attention_decode(
                &q1,
                &kc,
                &vc,
                &step,
                &buf(DType::I32, &[parts.elems()]),
                &f32b(&[1, 32]),
                p,
                4,
            )
        }),
        c!(
            "attention_decode",
            "chunk_len",
            |q1, kc, vc, step, parts| attention::attention_decode(
                &q1,
                &kc,
                &vc,
                &step,
                &parts,
                &f32b(&[1, 32]),
                p,
                0
            )
        ),
        c!("attention_decode", "out", |q1, kc, vc, step, parts| {
            attention::attention_decode(&q1, &kc, &vc, &step, &parts, &f32b(&[1, 16]), p, 4)
        }),
        c!("attention_decode", "k_cache", |q1, vc, step, parts| {
            attention::attention_decode(
                &q1,
                &buf(DType::I32, &[2, 16, 8]),
                &vc,
                &step,
                &parts,
                &f32b(&[1, 32]),
                p,
                4,
            )
        }),
        c!("attention_decode", "chunk_len", || {
            attention::attention_decode_scratch_len(p, 16, 0)
        }),
    ]
}

#[test]
fn every_op_names_the_op_and_the_bad_argument() {
    let mut failures = vec![];
    let all = cases();
    for (i, c) in all.iter().enumerate() {
        match (c.call)() {
            Ok(()) => failures.push(format!("#{i} {}({}): accepted", c.op, c.arg)),
            Err(e) => {
                let msg = e.to_string();
                let want = format!("{}: argument `{}`", c.op, c.arg);
                if !msg.starts_with(&want) {
                    failures.push(format!(
                        "#{i} {}({}): error `{msg}` does not start `{want}`",
                        c.op, c.arg
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    // Every public op builder appears in the table.
    let ops: std::collections::BTreeSet<&str> = all.iter().map(|c| c.op).collect();
    for op in [
        "rms_norm",
        "rms_norm_no_scale",
        "rms_norm_mul",
        "add",
        "mul",
        "swiglu",
        "scale",
        "gelu_tanh",
        "gelu_erf",
        "silu",
        "softcap",
        "copy",
        "embedding",
        "kv_write",
        "matmul",
        "matmul_affine",
        "matmul_id",
        "rope",
        "softmax",
        "argmax",
        "attention",
        "attention_decode",
    ] {
        assert!(ops.contains(op), "no bad-argument case for `{op}`");
    }
}

#[test]
fn the_same_arguments_when_valid_are_accepted() {
    // Guards the table: the valid baseline of each family builds, so each error above comes from
    // the one bad argument.
    let (x, w, o) = (f32b(&[3, 8]), f32b(&[8]), f32b(&[3, 8]));
    norm::rms_norm(&x, &w, &o, 1e-5).unwrap();
    norm::rms_norm_mul(&x, Some(&w), &w, &o, 1e-5).unwrap();
    elementwise::add(&x, &w, &o).unwrap();
    elementwise::swiglu(&x, &o, &f32b(&[3, 8])).unwrap();
    elementwise::softcap(&x, 5.0, &o).unwrap();
    copy::copy(&x, &o).unwrap();
    embedding::embedding(&f32b(&[10, 8]), &buf(DType::I32, &[3]), &o).unwrap();
    kv_cache::kv_write(&f32b(&[2, 16]), &f32b(&[2, 16, 8]), &buf(DType::I32, &[1])).unwrap();
    matmul::matmul(&x, &f32b(&[5, 8]), &f32b(&[3, 5])).unwrap();
    let s = f32b(&[5, 1]);
    matmul::matmul_affine(
        &f32b(&[3, 32]),
        &buf(DType::U32, &[5, 4]),
        &s,
        &s,
        4,
        32,
        &f32b(&[3, 5]),
    )
    .unwrap();
    matmul::matmul_id(
        &x,
        &f32b(&[2, 5, 8]),
        &buf(DType::I32, &[3, 2]),
        &f32b(&[3, 2, 5]),
    )
    .unwrap();
    onepass::ops::rope::rope(&x, &buf(DType::I32, &[3]), &o, &rope_params(4, 4, 1e4)).unwrap();
    softmax::softmax(&x, &o, 1.0, Some(&f32b(&[1, 8]))).unwrap();
    argmax::argmax(&x, &buf(DType::I32, &[3])).unwrap();
    let p = AttentionParams::new(4, 2, 8);
    let (kc, vc, step) = (f32b(&[2, 16, 8]), f32b(&[2, 16, 8]), buf(DType::I32, &[1]));
    attention::attention(&f32b(&[2, 32]), &kc, &vc, &step, &f32b(&[2, 32]), p).unwrap();
    let parts = f32b(&[attention::attention_decode_scratch_len(p, 16, 4).unwrap()]);
    attention::attention_decode(
        &f32b(&[1, 32]),
        &kc,
        &vc,
        &step,
        &parts,
        &f32b(&[1, 32]),
        p,
        4,
    )
    .unwrap();
}

#[test]
fn session_methods_return_the_op_errors() {
    let ex = Executor::new(dev().clone());
    for mode in [Mode::Direct, Mode::Recorded] {
        let mut s = ex.begin(mode);
        let err = s
            .rms_norm(&f32b(&[3, 8]), &f32b(&[7]), &f32b(&[3, 8]), 1e-5)
            .unwrap_err();
        assert!(
            err.to_string().starts_with("rms_norm: argument `weight`"),
            "{err}"
        );
        let err = s
            .matmul(&f32b(&[3, 8]), &f32b(&[5, 8]), &f32b(&[3, 4]))
            .unwrap_err();
        assert!(
            err.to_string().starts_with("matmul: argument `out`"),
            "{err}"
        );
    }
}

#[test]
fn views_that_do_not_fit_are_errors() {
    let b = f32b(&[4, 8]);
    for (what, r) in [
        ("view past the end", b.view(4, DType::F32, &[4, 8])),
        ("view of more bytes", b.view(0, DType::F32, &[5, 8])),
        (
            "view at a huge offset",
            b.view(usize::MAX - 3, DType::U8, &[8]),
        ),
        ("rows past the end", b.rows(2, 3)),
        ("rows with a huge count", b.rows(1, usize::MAX)),
        ("reshape to more elements", b.reshape(&[33])),
        (
            "reshape to an overflowing shape",
            b.reshape(&[usize::MAX, 2]),
        ),
    ] {
        let e = r.expect_err(what).to_string();
        assert!(
            e.starts_with("buffer view:") || e.contains("shape"),
            "{what}: {e}"
        );
    }
    // A quantized view whose row is not whole blocks.
    let q = buf(DType::U8, &[64]);
    assert!(q.view(0, DType::Q8_0, &[33]).is_err());
}

// ---------------------------------------------------------------------------------------------
// A tiny synthetic llama.

const DIM: usize = 64;
const N_LAYER: usize = 2;
const N_HEAD: usize = 4;
const N_KV_HEAD: usize = 2;
const FFN: usize = 128;

/// The GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256 + rank.
fn byte_char(b: u8) -> char {
    let printable =
        |x: u32| (33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x);
    let b = u32::from(b);
    if printable(b) {
        char::from_u32(b).unwrap()
    } else {
        char::from_u32(256 + (0..b).filter(|&x| !printable(x)).count() as u32).unwrap()
    }
}

fn tiny_tokens() -> Vec<String> {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    tokens
}

/// Deterministic values in about `±scale`.
fn values(n: usize, seed: u64, scale: f32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            ((u * 2.0 - 1.0) * scale).to_le_bytes()
        })
        .collect()
}

fn tiny_model_bytes() -> Vec<u8> {
    let tokens = tiny_tokens();
    let vocab = tokens.len();
    let head_dim = DIM / N_HEAD;
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama").unwrap();
    w.add_u32("llama.context_length", 256).unwrap();
    w.add_u32("llama.embedding_length", DIM as u32).unwrap();
    w.add_u32("llama.block_count", N_LAYER as u32).unwrap();
    w.add_u32("llama.feed_forward_length", FFN as u32).unwrap();
    w.add_u32("llama.attention.head_count", N_HEAD as u32)
        .unwrap();
    w.add_u32("llama.attention.head_count_kv", N_KV_HEAD as u32)
        .unwrap();
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .unwrap();
    w.add_f32("llama.rope.freq_base", 10000.0).unwrap();
    w.add_str("tokenizer.ggml.model", "gpt2").unwrap();
    w.add_str("tokenizer.ggml.pre", "smollm").unwrap();
    w.add_u32("tokenizer.ggml.bos_token_id", 1).unwrap();
    w.add_u32("tokenizer.ggml.eos_token_id", 2).unwrap();
    w.add_bool("tokenizer.ggml.add_bos_token", false).unwrap();
    let mut types = vec![3i32; 3];
    types.extend(std::iter::repeat_n(1, 256));
    w.add_str_array("tokenizer.ggml.tokens", &tokens).unwrap();
    w.add_i32_array("tokenizer.ggml.token_type", &types)
        .unwrap();
    w.add_str_array::<&str>("tokenizer.ggml.merges", &[])
        .unwrap();
    let mut seed = 0;
    let mut mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize| {
        seed += 1;
        let scale = (3.0 / cols as f32).sqrt();
        w.add_tensor(
            name,
            &[rows, cols],
            DType::F32,
            values(rows * cols, seed, scale),
        )
        .unwrap();
    };
    let ones = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect() };
    mat(&mut w, "token_embd.weight", vocab, DIM);
    for i in 0..N_LAYER {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(&n("attn_norm"), &[DIM], DType::F32, ones(DIM))
            .unwrap();
        mat(&mut w, &n("attn_q"), N_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_k"), N_KV_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_v"), N_KV_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_output"), DIM, N_HEAD * head_dim);
        w.add_tensor(&n("ffn_norm"), &[DIM], DType::F32, ones(DIM))
            .unwrap();
        mat(&mut w, &n("ffn_gate"), FFN, DIM);
        mat(&mut w, &n("ffn_up"), FFN, DIM);
        mat(&mut w, &n("ffn_down"), DIM, FFN);
    }
    w.add_tensor("output_norm.weight", &[DIM], DType::F32, ones(DIM))
        .unwrap();
    w.to_bytes().unwrap()
}

fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("onepass-bad-input-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// The tiny model, written once per test run.
fn tiny_model_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = scratch_dir().join("tiny.gguf");
        std::fs::write(&p, tiny_model_bytes()).unwrap();
        p
    })
}

fn tiny_engine(max_ctx: usize, max_batch: usize) -> Engine {
    let file = Arc::new(GgufFile::open(tiny_model_path()).unwrap());
    let llama = Llama::load(file, dev(), max_ctx, max_batch).unwrap();
    Engine::new(llama, Executor::new(dev().clone()), RunMode::Graph)
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, needle: &str) {
    let e = r.expect_err(needle).to_string();
    assert!(
        e.contains(needle),
        "error `{e}` does not mention `{needle}`"
    );
    assert!(!e.contains('\n'), "error is not one line: {e:?}");
}

#[test]
fn out_of_vocabulary_and_bad_passes_in_set_inputs() {
    let engine = tiny_engine(16, 8);
    let llama = engine.llama();
    let vocab = llama.config().vocab as u32;
    assert_eq!(vocab as usize, tiny_tokens().len());
    llama.set_inputs(&[0, vocab - 1], 0).unwrap();
    expect_err(llama.set_inputs(&[vocab], 0), "out of range");
    expect_err(llama.set_inputs(&[1, u32::MAX], 0), "out of range");
    expect_err(llama.set_inputs(&[], 0), "got 0");
    expect_err(llama.set_inputs(&[1; 9], 0), "got 9");
    expect_err(llama.set_inputs(&[1; 4], 13), "context overflow");
    expect_err(llama.set_inputs(&[1], 16), "context overflow");
    expect_err(llama.set_inputs(&[1], usize::MAX), "context overflow");
}

#[test]
fn engine_rejects_overflow_empty_prompts_and_bad_ids() {
    let mut engine = tiny_engine(16, 8);
    let greedy = SamplerConfig::default();
    let vocab = engine.llama().config().vocab as u32;
    let none = |_| Ok(());
    expect_err(
        engine.generate(&[5; 10], 8, &greedy, &[], none),
        "exceeds the context",
    );
    expect_err(engine.generate(&[5; 17], 0, &greedy, &[], none), "context");
    expect_err(engine.generate(&[], 4, &greedy, &[], none), "empty");
    expect_err(engine.prefill(&[], Logits::Last), "empty");
    expect_err(
        engine.generate(&[5, vocab + 3], 2, &greedy, &[], none),
        "out of range",
    );
    expect_err(engine.decode(7, 16, true), "context overflow");
    // Right at the limit: the prompt and the new tokens fill the context exactly (the last new
    // token is never fed back), which is defined and works.
    // 10 + 7 = 17 = ctx + 1 is allowed: positions 0..16 are used, the 7th new token is not fed.
    let stats = engine.generate(&[5; 10], 7, &greedy, &[], none).unwrap();
    assert_eq!(stats.generated_ids.len(), 7);
    assert!(stats.generated_ids.iter().all(|&t| t < vocab));
    // The engine stays usable after the errors and gives the same tokens again.
    let again = engine.generate(&[5; 10], 7, &greedy, &[], none).unwrap();
    assert_eq!(again.generated_ids, stats.generated_ids);
}

// ---------------------------------------------------------------------------------------------
// The CLI.

/// Runs `onepass` with `args` and `stdin`; returns (exit code, stdout, stderr).
fn cli(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .args(args)
        .env("ONEPASS_CACHE_DIR", scratch_dir().join("cache"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command fails with exactly one `error: ...` line on stderr that mentions `needle`.
fn fails_with_one_line(args: &[&str], stdin: &[u8], needle: &str) {
    let (code, _, err) = cli(args, stdin);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        code != 0 && code != 101,
        "{args:?}: exit {code}, stderr {err:?}"
    );
    assert!(!err.contains("panicked"), "{args:?}: panic: {err}");
    assert_eq!(lines.len(), 1, "{args:?}: stderr is not one line: {err:?}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {err:?}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: `{}` does not mention `{needle}`",
        lines[0]
    );
}

fn model_arg() -> String {
    tiny_model_path().display().to_string()
}

#[test]
fn cli_generates_with_the_tiny_model() {
    // The baseline the failure cases below differ from in one thing each.
    let m = model_arg();
    let (code, out, err) = cli(
        &[
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "-n",
            "3",
            "hi",
        ],
        b"",
    );
    assert_eq!(code, 0, "stderr: {err}");
    assert!(!out.is_empty() || !err.is_empty());
    let (code, _, err) = cli(
        &["generate", "--model", &m, "--backend", "cpu", "-n", "2"],
        b"from stdin",
    );
    assert_eq!(code, 0, "stderr: {err}");
}

#[test]
fn cli_rejects_bad_prompts() {
    let m = model_arg();
    let base = [
        "generate",
        "--model",
        m.as_str(),
        "--backend",
        "cpu",
        "-n",
        "2",
    ];
    fails_with_one_line(&base, &[0x68, 0x69, 0xff, 0xfe, 0x20], "not valid UTF-8");
    fails_with_one_line(&base, b"", "empty");
    fails_with_one_line(&[&base[..], &[""]].concat(), b"", "empty");
    // Context overflow through the flags.
    let small = [
        "generate",
        "--model",
        m.as_str(),
        "--backend",
        "cpu",
        "--ctx",
        "4",
        "-n",
        "8",
        "hello",
    ];
    fails_with_one_line(&small, b"", "context");
}

#[test]
fn cli_rejects_broken_model_files() {
    let bytes = std::fs::read(tiny_model_path()).unwrap();
    let dir = scratch_dir();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated-header.gguf",
            bytes[..20].to_vec(),
            "shorter than a GGUF header",
        ),
        ("truncated-meta.gguf", bytes[..400].to_vec(), "truncated"),
        (
            "truncated-data.gguf",
            bytes[..bytes.len() - 100].to_vec(),
            "past the end",
        ),
        (
            "text.gguf",
            b"this is not a model file, just some text\n".to_vec(),
            "not a GGUF file",
        ),
        ("empty.gguf", vec![], "shorter than a GGUF header"),
    ];
    for (name, content, needle) in cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        let ps = p.display().to_string();
        fails_with_one_line(
            &["generate", "--model", &ps, "--backend", "cpu", "hi"],
            b"",
            needle,
        );
    }
    let missing = dir.join("missing.gguf").display().to_string();
    fails_with_one_line(
        &["generate", "--model", &missing, "--backend", "cpu", "hi"],
        b"",
        "--model",
    );
}

#[test]
fn cli_rejects_bad_sampling_flags() {
    let m = model_arg();
    for (flags, needle) in [
        (vec!["--top-p", "2"], "--top-p"),
        (vec!["--top-p", "0"], "--top-p"),
        (vec!["--temperature=-1"], "--temperature"),
        (vec!["--temperature", "-1"], "--temperature"),
        (vec!["--temperature", "nan"], "--temperature"),
        (vec!["--min-p", "1.5"], "--min-p"),
        (vec!["--repeat-penalty", "0"], "penalty"),
    ] {
        let mut args = vec!["generate", "--model", m.as_str(), "--backend", "cpu"];
        args.extend(flags);
        args.push("hi");
        fails_with_one_line(&args, b"", needle);
    }
}
