//! The other side of `bad_input.rs`'s table: the same arguments accepted when valid, the session
//! methods returning the ops' errors, and buffer views that do not fit.

use onepass::ops::attention::{self, AttentionParams};
use onepass::ops::{argmax, copy, elementwise, embedding, kv_cache, matmul, norm, softmax};
use onepass::{DType, Executor, Mode};

use super::{buf, dev, f32b, rope_params};

#[test]
fn the_same_arguments_when_valid_are_accepted() {
    // Guards the table: the valid baseline of each family builds, so each error above comes from
    // the one bad argument.
    let (x, w, o) = (f32b(&[3, 8]), f32b(&[8]), f32b(&[3, 8]));
    norm::rms_norm(&x, &w, &o, 1e-5).unwrap();
    norm::rms_norm_mul(&x, Some(&w), &w, &o, 1e-5).unwrap();
    norm::rms_norm_add(&x, &w, &o, 1e-5).unwrap();
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
