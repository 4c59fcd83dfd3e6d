//! Bad arguments to every public op builder, one at a time (the error must name the op and the
//! argument); the same arguments accepted when valid and buffer views that do not fit in
//! `bad_input/valid.rs`. The model, engine and CLI side of bad input is in `bad_input_model.rs`.

use std::sync::OnceLock;

use onepass::ops::attention::{self, AttentionParams};
use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::ops::{argmax, copy, elementwise, embedding, kv_cache, matmul, norm, softmax};
use onepass::{Buffer, DType, Device, Result};

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
        c!("rms_norm_add", "x", |xi, w, o| norm::rms_norm_add(
            &xi, &w, &o, 1e-5
        )),
        c!("rms_norm_add", "weight", |x, o| norm::rms_norm_add(
            &x,
            &f32b(&[7]),
            &o,
            1e-5
        )),
        c!("rms_norm_add", "acc", |x, w| norm::rms_norm_add(
            &x,
            &w,
            &f32b(&[3, 7]),
            1e-5
        )),
        c!("rms_norm_add", "acc", |x, w| norm::rms_norm_add(
            &x,
            &w,
            &buf(DType::F16, &[3, 8]),
            1e-5
        )),
        c!("rms_norm_add", "acc", |lo, hi, w| norm::rms_norm_add(
            &lo, &w, &hi, 1e-5
        )),
        c!("rms_norm_add", "eps", |x, w, o| norm::rms_norm_add(
            &x,
            &w,
            &o,
            f32::INFINITY
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
        c!("attention", "params", |q, kc, vc, step| {
            attention::attention(&q, &kc, &vc, &step, &f32b(&[2, 32]), p.with_window(0))
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
        "rms_norm_add",
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

#[path = "bad_input/valid.rs"]
mod valid;
