//! Every built-in CPU kernel against hostile scalars (issue 17, point 5: no safe public function
//! can cause undefined behaviour).
//!
//! Each case builds a dispatch that [`Dispatch::new`] accepts (the kernel's declared argument
//! count, access and dtypes) but whose scalars disagree with its buffers: dims larger than the
//! buffers, dims whose product overflows `usize`, zero where a divisor is expected, negative or
//! huge positions and ids. It runs through [`call_kernel`], the entry the worker and the CPU
//! executable use, and must come back as an error naming the kernel and the argument, never as a
//! caught panic (and never as a crash). Each kernel also keeps a case with valid scalars that
//! must succeed. The buffers are small and hold seeded random values.
//!
//! The matrix and attention families are in `hostile_matrix_tests.rs`, the norm + three
//! products and the q/k norm + cache write kernels in `hostile_qk_norm_tests.rs`, the batched decode
//! step's kernels in `hostile_batch_tests.rs`.

use std::sync::OnceLock;

use rand::RngExt;

use crate::backend::cpu::run::call_kernel;
use crate::backend::cpu::CpuRegistry;
use crate::backend::{Buffer, DType, Device};
use crate::error::Result;
use crate::graph::{Access, Arg, Dispatch, Grid, KernelId};
use crate::kernels::{
    attention as ka, elementwise as ew, matmul as mm, misc as km, norm as kn, KernelSig, ParamKind,
};
use crate::testutil::{random_f32, rng};

#[path = "hostile_matrix_tests.rs"]
mod matrix;

#[path = "hostile_batch_tests.rs"]
mod batch;
#[path = "hostile_qk_norm_tests.rs"]
mod qk_norm;

/// The CPU device the buffers live on.
fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE.get_or_init(|| Device::cpu(2).expect("a CPU device"))
}

/// Every built-in CPU kernel, as the device registers them.
fn registry() -> &'static CpuRegistry {
    static REGISTRY: OnceLock<CpuRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = CpuRegistry::default();
        super::register_all(&mut r);
        r
    })
}

/// A buffer of `dims` of `dtype` holding seeded random values (never zero: integer buffers get
/// bytes in `1..=255`, float and quantized ones values in `[-1, 1)` without zeros).
pub(super) fn random_buffer(dtype: DType, dims: &[usize], seed: u64) -> Buffer {
    let elems: usize = dims.iter().product();
    let bytes: Vec<u8> = match dtype {
        DType::I32 | DType::U32 | DType::U8 => {
            let mut r = rng(seed);
            (0..elems * dtype.block_bytes())
                .map(|_| r.random_range(1..=255u8))
                .collect()
        }
        _ => crate::quant::quantize(dtype, &random_f32(elems, 1.0, seed)).expect("quantize"),
    };
    device()
        .upload_bytes(&bytes, dtype, dims)
        .expect("upload a random buffer")
}

/// The arguments of one dispatch, filled in by parameter name.
pub(super) struct Call {
    sig: &'static KernelSig,
    args: Vec<Option<Arg>>,
    seed: u64,
}

impl Call {
    /// No argument set yet.
    pub(super) fn new(sig: &'static KernelSig) -> Call {
        let n = sig.params().expect("a typed kernel").len();
        let seed = sig
            .name()
            .bytes()
            .fold(17u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        Call {
            sig,
            args: (0..n).map(|_| None).collect(),
            seed,
        }
    }

    fn param(&self, name: &str) -> (usize, ParamKind) {
        let i = self
            .sig
            .index_of(name)
            .unwrap_or_else(|| panic!("{} has no parameter `{name}`", self.sig.name()));
        (i, self.sig.params().expect("typed")[i].kind)
    }

    /// Whether the kernel has a parameter called `name`.
    pub(super) fn has(&self, name: &str) -> bool {
        self.sig.index_of(name).is_some()
    }

    /// The declared dtype of buffer parameter `name`.
    pub(super) fn dtype(&self, name: &str) -> DType {
        match self.param(name).1 {
            ParamKind::Buffer(_, dtypes) => dtypes.list()[0],
            ParamKind::Scalar(_) => panic!("`{name}` is a scalar"),
        }
    }

    /// `buf` as buffer parameter `name`, with the declared access.
    pub(super) fn buffer(mut self, name: &str, buf: &Buffer) -> Call {
        let (i, kind) = self.param(name);
        let ParamKind::Buffer(access, _) = kind else {
            panic!("`{name}` is a scalar")
        };
        self.args[i] = Some(match access {
            Access::Read => Arg::read(buf),
            Access::Write => Arg::write(buf),
            Access::ReadWrite => Arg::read_write(buf),
        });
        self
    }

    /// A random buffer of `dims` (of the declared dtype) as parameter `name`.
    pub(super) fn buf(mut self, name: &str, dims: &[usize]) -> Call {
        self.seed += 1;
        let b = random_buffer(self.dtype(name), dims, self.seed);
        self.buffer(name, &b)
    }

    /// [`Call::buf`] where the kernel has a parameter `name`; else nothing.
    pub(super) fn opt_buf(self, name: &str, dims: &[usize]) -> Call {
        if self.has(name) {
            self.buf(name, dims)
        } else {
            self
        }
    }

    /// An i32 buffer holding `values` as parameter `name`.
    pub(super) fn ints(self, name: &str, values: &[i32]) -> Call {
        let b = device()
            .upload(values, &[values.len()])
            .expect("upload ints");
        self.buffer(name, &b)
    }

    fn scalar(mut self, name: &str, arg: Arg) -> Call {
        let (i, kind) = self.param(name);
        assert!(matches!(kind, ParamKind::Scalar(_)), "`{name}` is a buffer");
        self.args[i] = Some(arg);
        self
    }

    /// A u32 scalar.
    pub(super) fn u32(self, name: &str, v: u32) -> Call {
        self.scalar(name, Arg::u32(v))
    }

    /// An f32 scalar.
    pub(super) fn f32(self, name: &str, v: f32) -> Call {
        self.scalar(name, Arg::f32(v))
    }

    /// Builds the dispatch (which must be valid as far as `Dispatch::new` checks) and runs the
    /// kernel through `call_kernel`.
    pub(super) fn run(self) -> Result<()> {
        let name = self.sig.name();
        let args: Vec<Arg> = self
            .args
            .into_iter()
            .enumerate()
            .map(|(i, a)| a.unwrap_or_else(|| panic!("{name}: argument {i} not set")))
            .collect();
        let id = KernelId::of(self.sig);
        let d = Dispatch::new(id, args, Grid::new(1, 1))
            .unwrap_or_else(|e| panic!("{name}: the dispatch must be declared-valid: {e}"));
        let f = registry().get(id).expect("a registered CPU kernel");
        call_kernel(f, id, d.args())
    }

    /// Runs the kernel and asserts an error that names the kernel and contains `what` (the
    /// inconsistent argument), not a caught panic.
    #[track_caller]
    pub(super) fn refused(self, what: &str) {
        let name = self.sig.name();
        match self.run() {
            Ok(()) => {
                panic!("{name}: hostile arguments were accepted (expected an error on {what})")
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    !msg.contains("panicked"),
                    "{name}: a panic, not an error: {msg}"
                );
                assert!(
                    msg.contains(name),
                    "{name}: the error does not name it: {msg}"
                );
                assert!(
                    msg.contains(what),
                    "{name}: the error does not name {what:?}: {msg}"
                );
            }
        }
    }

    /// Runs the kernel and asserts success.
    #[track_caller]
    pub(super) fn accepted(self) {
        let name = self.sig.name();
        if let Err(e) = self.run() {
            panic!("{name}: valid arguments were refused: {e}");
        }
    }
}

/// Every family of kernels the CPU backend registers.
fn families() -> Vec<&'static [KernelSig]> {
    vec![
        std::slice::from_ref(&km::ARGMAX),
        std::slice::from_ref(&km::ARGMAX_ADVANCE),
        std::slice::from_ref(&km::DRAW_ADVANCE),
        std::slice::from_ref(&km::DRAW_ROWS),
        &km::COPY,
        &km::EMBEDDING,
        &km::KV_WRITE,
        &km::ROPE,
        &km::ROPE_FF,
        &km::ROPE_INPLACE,
        &km::ROPE_FF_INPLACE,
        &km::ROPE_KV,
        &km::SOFTMAX,
        &ew::ADD,
        &ew::ADD_INPLACE,
        &ew::MUL,
        &ew::MUL_INPLACE,
        &ew::SWIGLU,
        &ew::SWIGLU_INPLACE,
        std::slice::from_ref(&ew::SWIGLU_TO_F16),
        &ew::GEGLU,
        &ew::GEGLU_INPLACE,
        &ew::SCALE,
        &ew::SCALE_INPLACE,
        &ew::SOFTCAP,
        &ew::SOFTCAP_INPLACE,
        &ew::GELU_TANH,
        &ew::GELU_TANH_INPLACE,
        &ew::GELU_ERF,
        &ew::GELU_ERF_INPLACE,
        &ew::SILU,
        &ew::SILU_INPLACE,
        &kn::RMS_NORM,
        &kn::RMS_NORM_NO_SCALE,
        &kn::RMS_NORM_MUL,
        &kn::RMS_NORM_NO_SCALE_MUL,
        &kn::RMS_NORM_ADD,
        &kn::RMS_NORM_ROPE,
        &kn::RMS_NORM_ROPE_KV,
        std::slice::from_ref(&kn::RMS_NORM_TO_F16),
        &ka::ATTENTION,
        &ka::ATTENTION_MMA,
        &ka::ATTENTION_MMA_TO_F16,
        &ka::DECODE_PARTIAL,
        std::slice::from_ref(&ka::DECODE_COMBINE),
        &mm::MATMUL,
        &mm::MATMUL_ADD,
        &mm::MATMUL_MMA,
        &mm::MATMUL_ADD_MMA,
        &mm::MATMUL3_MMA,
        &mm::MATMUL_MMA_H,
        &mm::MATMUL3_MMA_H,
        &mm::MATMUL_ADD_MMA_H,
        &mm::MATMUL_SWIGLU_MMA_H,
        &mm::MATMUL_ID,
        &mm::MATMUL_AFFINE,
        &mm::NORM_QKV_ROPE,
        &mm::NORM_QKV_ROPE_SHARED,
        &mm::NORM_QKV_ROPE_MIXED,
        &mm::NORM_QKV_ROPE_FF,
        &mm::NORM_QKV_ROPE_FF_SHARED,
        &mm::NORM_QKV_ROPE_FF_MIXED,
        &mm::NORM_QKV,
        &mm::NORM_QKV_SHARED,
        &mm::NORM_QKV_MIXED,
        &mm::NORM_GATE_UP,
        &mm::NORM_GATE_UP_SHARED,
        &crate::kernels::batch::MATMUL_ROWS,
        &crate::kernels::batch::KV_WRITE_SLOTS,
        &crate::kernels::batch::ATTENTION_SLOTS,
    ]
}

/// The families above (each has its test below or in `hostile_matrix_tests.rs`) are exactly the
/// kernels the CPU backend registers, so a new kernel cannot go untested.
#[test]
fn every_registered_cpu_kernel_has_hostile_cases() {
    let mut covered: Vec<&str> = families()
        .into_iter()
        .flatten()
        .map(KernelSig::name)
        .collect();
    covered.sort_unstable();
    assert_eq!(covered, registry().names());
}

const MAX: u32 = u32::MAX;

#[test]
fn argmax_refuses_row_lengths_that_do_not_fit() {
    let call = |n: u32, x: usize, out: usize| {
        Call::new(&km::ARGMAX)
            .buf("x", &[x])
            .buf("out", &[out])
            .u32("n", n)
    };
    call(4, 12, 3).accepted();
    call(4, 0, 0).accepted();
    call(0, 12, 3).refused("n = 0");
    call(0, 0, 0).refused("n = 0");
    call(5, 12, 3).refused("n = 5");
    call(MAX, 12, 3).refused("n = 4294967295");
    call(6, 12, 3).refused("n = 6");
}

#[test]
fn argmax_advance_refuses_rows_rings_inputs_and_steps_that_do_not_fit() {
    let call = |n: u32, x: usize, ring: usize, inputs: &[i32]| {
        Call::new(&km::ARGMAX_ADVANCE)
            .buf("x", &[x])
            .buf("ring", &[ring])
            .ints("inputs", inputs)
            .u32("n", n)
    };
    call(12, 12, 4, &[9, 3, 9]).accepted();
    call(1, 1, 1, &[0, 5, 6, 7, 8]).accepted();
    call(12, 12, 4, &[i32::MAX - 1, 3, 9]).accepted();
    call(0, 12, 4, &[9, 3, 9]).refused("n = 0");
    call(0, 0, 4, &[9, 3, 9]).refused("n = 0");
    call(MAX, 12, 4, &[9, 3, 9]).refused("n = 4294967295");
    call(13, 12, 4, &[9, 3, 9]).refused("n = 13");
    call(4, 12, 4, &[9, 3, 9]).refused("n = 4");
    call(12, 12, 0, &[9, 3, 9]).refused("ring");
    call(12, 12, 4, &[9, 3, 9, 9]).refused("inputs has 4 values");
    call(12, 12, 4, &[9]).refused("inputs has 1 values");
    call(12, 12, 4, &[]).refused("inputs has 0 values");
    call(12, 12, 4, &[-1, 3, 9]).refused("inputs[0] = -1");
    call(12, 12, 4, &[i32::MIN, 3, 9]).refused("inputs[0] = -2147483648");
    call(12, 12, 4, &[i32::MAX, 3, 9]).refused("inputs[0] = 2147483647");
}

#[test]
fn draw_advance_refuses_rows_states_windows_and_steps_that_do_not_fit() {
    use crate::sampler::device::{DrawState, DRAW_WINDOW};
    use crate::sampler::SamplerConfig;
    let cfg = SamplerConfig {
        temperature: 0.8,
        ..SamplerConfig::default()
    };
    let good = DrawState::new(&cfg, 7, 3).expect("a state").words();
    let with = |i: usize, v: u32| {
        let mut w = good;
        w[i] = v;
        w
    };
    let call = |n: u32, x: usize, words: &[u32], window: usize, scratch: usize, inputs: &[i32]| {
        let state = device()
            .upload(words, &[words.len()])
            .expect("upload the state");
        Call::new(&km::DRAW_ADVANCE)
            .buf("x", &[x])
            .buf("ring", &[4])
            .ints("inputs", inputs)
            .buffer("state", &state)
            .buf("window", &[window])
            .buf("scratch", &[scratch])
            .u32("n", n)
    };
    let w = DRAW_WINDOW;
    call(12, 12, &good, w, 108, &[9, 3, 9]).accepted();
    call(0, 12, &good, w, 108, &[9, 3, 9]).refused("n = 0");
    call(13, 12, &good, w, 117, &[9, 3, 9]).refused("n = 13");
    call(12, 12, &good, w, 107, &[9, 3, 9]).refused("scratch");
    call(12, 12, &good, 64, 108, &[9, 3, 9]).refused("window");
    call(12, 12, &good[..8], w, 108, &[9, 3, 9]).refused("state has 8 words");
    call(12, 12, &with(3, 2000), w, 108, &[9, 3, 9]).refused("window of 2000");
    call(12, 12, &with(6, 0), w, 108, &[9, 3, 9]).refused("--top-p");
    call(12, 12, &with(5, f32::NAN.to_bits()), w, 108, &[9, 3, 9]).refused("--temperature");
    call(12, 12, &good, w, 108, &[-1, 3, 9]).refused("inputs[0] = -1");
    call(12, 12, &good, w, 108, &[9, 3, 9, 9]).refused("inputs has 4 values");
}

#[test]
fn draw_rows_refuses_rows_states_windows_and_outputs_that_do_not_fit() {
    use crate::sampler::device::{DrawState, DRAW_WINDOW};
    let cfg = crate::sampler::SamplerConfig {
        temperature: 0.8,
        ..Default::default()
    };
    let good: Vec<u32> = DrawState::new(&cfg, 7, 3)
        .expect("a state")
        .words()
        .repeat(2);
    let call = |n: u32, x: usize, words: &[u32], window: usize, scratch: usize, out: usize| {
        let state = device()
            .upload(words, &[words.len()])
            .expect("upload the state");
        Call::new(&km::DRAW_ROWS)
            .buf("x", &[x])
            .buffer("state", &state)
            .buf("window", &[window])
            .buf("scratch", &[scratch])
            .buf("out", &[out])
            .u32("n", n)
    };
    let w = 2 * DRAW_WINDOW;
    call(12, 24, &good, w, 216, 2).accepted();
    call(3, 6, &good, w, 56, 2).accepted(); // an odd row: 9n + 1 words
    call(3, 6, &good, w, 54, 2).refused("scratch has 54");
    call(0, 24, &good, w, 216, 2).refused("n = 0");
    call(12, 24, &good, w, 216, 0).refused("no rows");
    call(12, 25, &good, w, 216, 2).refused("x has 25 values");
    call(12, 24, &good[..9], w, 216, 2).refused("state has 9 values");
    call(12, 24, &good, w - 1, 216, 2).refused("window has 2047");
    call(12, 24, &good, w, 215, 2).refused("scratch has 215");
    call(12, 36, &good, w, 216, 3).refused("state has 18");
}

#[test]
fn copies_refuse_lengths_that_differ() {
    for sig in &km::COPY {
        let call = |src: usize, dst: usize| Call::new(sig).buf("src", &[src]).buf("dst", &[dst]);
        call(10, 10).accepted();
        call(0, 0).accepted();
        call(10, 9).refused("dst");
        call(0, 3).refused("dst");
    }
}

#[test]
fn embeddings_refuse_hostile_vocabularies_dims_and_ids() {
    let big_dim = (MAX / 256) * 256;
    for sig in &km::EMBEDDING {
        let call = |vocab: u32, dim: u32, ids: &[i32], out: usize| {
            Call::new(sig)
                .buf("table", &[8, 256])
                .ints("ids", ids)
                .buf("out", &[out])
                .u32("vocab", vocab)
                .u32("dim", dim)
        };
        call(8, 256, &[3, 0, 7], 3 * 256).accepted();
        call(8, 256, &[], 0).accepted();
        call(MAX, 256, &[3], 256).refused("vocab = 4294967295");
        call(MAX, big_dim, &[3], 256).refused("vocab = 4294967295");
        call(9, 256, &[3], 256).refused("vocab = 9");
        call(8, 250, &[3], 250).refused("dim = 250");
        call(8, 0, &[3], 0).refused("dim = 0");
        call(8, 256, &[3], 255).refused("out");
        call(8, 256, &[1, -1], 512).refused("token id -1");
        call(8, 256, &[8], 256).refused("token id 8");
        call(8, 256, &[i32::MIN], 256).refused("token id -2147483648");
        call(0, 256, &[0], 256).refused("vocab = 0");
    }
}

#[test]
fn kv_writes_refuse_hostile_heads_and_positions() {
    for sig in &km::KV_WRITE {
        let call = |new: usize, step: &[i32], cache: usize, n_kv: u32, hd: u32| {
            Call::new(sig)
                .buf("new", &[new])
                .ints("step", step)
                .buf("cache", &[cache])
                .u32("n_kv_head", n_kv)
                .u32("head_dim", hd)
        };
        let cache = 2 * 10 * 8;
        call(3 * 16, &[4], cache, 2, 8).accepted();
        call(3 * 16, &[7], cache, 2, 8).accepted();
        // No rows into no positions: nothing to write.
        call(0, &[0], 0, 2, 8).accepted();
        call(3 * 16, &[4], cache, 2, 0).refused("head_dim = 0");
        call(3 * 16, &[4], cache, 0, 8).refused("n_kv_head = 0");
        call(3 * 16, &[4], cache, MAX, MAX).refused("n_kv_head = 4294967295");
        call(3 * 16, &[4], cache, 3, 8).refused("n_kv_head = 3");
        call(3 * 16, &[-1], cache, 2, 8).refused("pos0 = -1");
        call(3 * 16, &[i32::MIN], cache, 2, 8).refused("pos0 = -2147483648");
        call(3 * 16, &[i32::MAX], cache, 2, 8).refused("pos0 = 2147483647");
        call(3 * 16, &[8], cache, 2, 8).refused("pos0 = 8");
        call(3 * 16, &[], cache, 2, 8).refused("step");
        call(3 * 16, &[0], 0, 2, 8).refused("cache");
    }
}

#[test]
fn fused_rope_and_cache_writes_refuse_hostile_sizes_steps_and_modes() {
    for sig in &km::ROPE_KV {
        // Three rows: q of 4 heads of 8 values, k and v of 2, caches of 2 heads x 6 positions.
        let call = |(q, kv, cache): (usize, usize, usize), step: &[i32], hd: u32, rot: u32| {
            Call::new(sig)
                .buf("q", &[q])
                .buf("k", &[kv])
                .buf("v", &[kv])
                .ints("positions", &[0, 5, 9])
                .opt_buf("freq_factors", &[rot as usize / 2])
                .ints("step", step)
                .buf("k_cache", &[cache])
                .buf("v_cache", &[cache])
                .u32("head_dim", hd)
                .u32("rotary_dim", rot)
                .f32("base", 10_000.0)
                .u32("mode", 0)
                .u32("n_kv_head", 2)
                .u32("cache_f16", 0)
        };
        let fits = (96, 48, 96);
        call(fits, &[2], 8, 8).accepted();
        call(fits, &[3], 8, 4).u32("mode", 1).accepted();
        call(fits, &[4], 8, 8).refused("pos0 = 4");
        call(fits, &[-1], 8, 8).refused("pos0 = -1");
        call(fits, &[], 8, 8).refused("step");
        call(fits, &[2], 8, 7).refused("rotary_dim = 7");
        call(fits, &[2], 0, 8).refused("head_dim = 0");
        call(fits, &[2], 8, 8).u32("mode", 2).refused("mode = 2");
        call(fits, &[2], MAX, 8).refused("k has 48 values");
        call((96, 40, 96), &[2], 8, 8).refused("k");
        call((90, 48, 96), &[2], 8, 8).refused("q");
        call((96, 48, 90), &[2], 8, 8).refused("k_cache");
    }
}

#[test]
fn ropes_refuse_hostile_head_sizes_and_modes() {
    let families: [&[KernelSig; 3]; 4] = [
        &km::ROPE,
        &km::ROPE_FF,
        &km::ROPE_INPLACE,
        &km::ROPE_FF_INPLACE,
    ];
    for sig in families.into_iter().flatten() {
        let call = |x: usize, positions: &[i32], ff: usize, hd: u32, rot: u32, mode: u32| {
            Call::new(sig)
                .buf("x", &[x])
                .ints("positions", positions)
                .opt_buf("freq_factors", &[ff])
                .opt_buf("out", &[x])
                .u32("head_dim", hd)
                .u32("rotary_dim", rot)
                .f32("base", 10_000.0)
                .u32("mode", mode)
        };
        let rows = [0, 5, 9];
        call(48, &rows, 4, 8, 8, 0).accepted();
        call(48, &rows, 4, 8, 8, 1).accepted();
        call(48, &rows, 2, 8, 4, 1).accepted();
        // Any position is an angle.
        call(48, &[i32::MIN, -1, i32::MAX], 4, 8, 8, 0).accepted();
        call(48, &rows, 4, 8, 8, 0).f32("base", f32::NAN).accepted();
        call(48, &rows, 4, 8, 8, 0).f32("base", 0.0).accepted();
        call(48, &rows, 4, 0, 8, 0).refused("head_dim = 0");
        call(48, &rows, 4, MAX, 8, 0).refused("head_dim = 4294967295");
        call(48, &rows, 4, 5, 4, 0).refused("head_dim = 5");
        call(48, &rows, 4, 8, 7, 0).refused("rotary_dim = 7");
        call(48, &rows, 4, 8, 16, 0).refused("rotary_dim = 16");
        call(48, &rows, 4, 8, MAX - 1, 0).refused("rotary_dim = 4294967294");
        call(48, &rows, 4, 8, 8, 2).refused("mode = 2");
        call(48, &rows, 4, 8, 8, MAX).refused("mode = 4294967295");
        call(0, &rows, 4, 8, 8, 0).refused("x");
        call(48, &[], 4, 8, 8, 0).refused("positions");
        call(47, &rows, 4, 8, 8, 0).refused("positions");
        if sig.index_of("freq_factors").is_some() {
            call(48, &rows, 3, 8, 8, 0).refused("freq_factors");
        }
    }
}

#[test]
fn rms_norm_rope_refuses_hostile_head_sizes_and_modes() {
    let call = |x: usize, w: usize, positions: &[i32], hd: u32, rot: u32, mode: u32| {
        Call::new(&kn::RMS_NORM_ROPE[0])
            .buf("x", &[x])
            .buf("weight", &[w])
            .ints("positions", positions)
            .buf("out", &[x])
            .f32("eps", 1e-6)
            .u32("head_dim", hd)
            .u32("rotary_dim", rot)
            .f32("base", 10_000.0)
            .u32("mode", mode)
    };
    let rows = [0, 5, 9];
    call(48, 8, &rows, 8, 8, 0).accepted();
    call(48, 8, &rows, 8, 4, 1).accepted();
    call(48, 8, &[i32::MIN, -1, i32::MAX], 8, 8, 1).accepted();
    call(48, 8, &rows, 8, 8, 0).f32("eps", f32::NAN).accepted();
    call(48, 8, &rows, 0, 8, 0).refused("head_dim = 0");
    call(48, 8, &rows, MAX, 8, 0).refused("head_dim = 4294967295");
    call(48, 5, &rows, 5, 4, 0).refused("head_dim = 5");
    call(48, 7, &rows, 8, 8, 0).refused("weight has 7");
    call(48, 8, &rows, 8, 7, 0).refused("rotary_dim = 7");
    call(48, 8, &rows, 8, 16, 0).refused("rotary_dim = 16");
    call(48, 8, &rows, 8, 8, 2).refused("mode = 2");
    call(0, 8, &rows, 8, 8, 0).refused("x");
    call(48, 8, &[], 8, 8, 0).refused("positions");
    call(47, 8, &rows, 8, 8, 0).refused("positions");
    call(48, 8, &rows, 8, 8, 0)
        .buf("out", &[47])
        .refused("out 47");
}

#[test]
fn softmaxes_refuse_hostile_row_lengths_and_masks() {
    for sig in &km::SOFTMAX {
        let call = |x: usize, mask: usize, n: u32| {
            Call::new(sig)
                .buf("x", &[x])
                .opt_buf("mask", &[mask])
                .opt_buf("out", &[x])
                .f32("scale", 0.5)
                .u32("n", n)
        };
        call(24, 8, 8).accepted();
        call(24, 24, 8).accepted();
        call(0, 8, 8).accepted();
        call(24, 8, 8).f32("scale", f32::INFINITY).accepted();
        call(24, 8, 0).refused("n = 0");
        call(24, 8, 5).refused("n = 5");
        call(24, 8, MAX).refused("n = 4294967295");
        if sig.index_of("mask").is_some() {
            call(24, 0, 8).refused("mask");
            call(24, 16, 8).refused("mask");
            call(24, 12, 8).refused("mask");
        }
    }
}

#[test]
fn binary_elementwise_kernels_refuse_hostile_row_lengths() {
    let families: [&[KernelSig; 3]; 6] = [
        &ew::ADD,
        &ew::ADD_INPLACE,
        &ew::MUL,
        &ew::MUL_INPLACE,
        &ew::SWIGLU,
        &ew::SWIGLU_INPLACE,
    ];
    for sig in families.into_iter().flatten() {
        let params = sig.params().expect("typed");
        let (a, b) = (params[0].name, params[1].name);
        let call = |na: usize, nb: usize, out: usize, row_len: u32| {
            Call::new(sig)
                .buf(a, &[na])
                .buf(b, &[nb])
                .opt_buf("out", &[out])
                .u32("row_len", row_len)
        };
        call(24, 8, 24, 8).accepted();
        call(24, 24, 24, 0).accepted();
        call(0, 8, 0, 8).accepted();
        call(24, 8, 24, 0).refused("row_len = 0");
        call(24, 8, 24, 5).refused("row_len = 5");
        call(24, 8, 24, MAX).refused("row_len = 4294967295");
        call(24, 7, 24, 8).refused("row_len = 8");
        if sig.index_of("out").is_some() {
            call(24, 8, 16, 8).refused("out");
        }
    }
}

#[test]
fn the_f16_swiglu_refuses_lengths_that_differ() {
    let call = |gate: usize, up: usize, out: usize| {
        Call::new(&ew::SWIGLU_TO_F16)
            .buf("gate", &[gate])
            .buf("up", &[up])
            .buf("out", &[out])
    };
    call(24, 24, 24).accepted();
    call(0, 0, 0).accepted();
    call(24, 8, 24).refused("up (8)");
    call(23, 24, 24).refused("gate (23)");
    call(24, 24, 16).refused("out (16)");
}

#[test]
fn unary_elementwise_kernels_refuse_lengths_that_differ() {
    let families: [&[KernelSig; 3]; 10] = [
        &ew::SCALE,
        &ew::SCALE_INPLACE,
        &ew::SOFTCAP,
        &ew::SOFTCAP_INPLACE,
        &ew::GELU_TANH,
        &ew::GELU_TANH_INPLACE,
        &ew::GELU_ERF,
        &ew::GELU_ERF_INPLACE,
        &ew::SILU,
        &ew::SILU_INPLACE,
    ];
    for sig in families.into_iter().flatten() {
        let params = sig.params().expect("typed");
        let param = params
            .iter()
            .find(|p| matches!(p.kind, ParamKind::Scalar(_)))
            .map(|p| p.name);
        let call = |x: usize, out: usize, v: f32| {
            let c = Call::new(sig).buf("x", &[x]).opt_buf("out", &[out]);
            match param {
                Some(p) => c.f32(p, v),
                None => c,
            }
        };
        call(24, 24, 0.5).accepted();
        call(0, 0, 0.5).accepted();
        // Hostile floats are values, not sizes: a cap of 0 or NaN gives NaN, never a fault.
        call(24, 24, 0.0).accepted();
        call(24, 24, f32::NAN).accepted();
        call(24, 24, f32::NEG_INFINITY).accepted();
        if sig.index_of("out").is_some() {
            call(24, 23, 0.5).refused("out");
        }
    }
}

#[test]
fn the_f16_norm_refuses_hostile_dims() {
    let call = |x: usize, weight: usize, out: usize, dim: u32| {
        Call::new(&kn::RMS_NORM_TO_F16)
            .buf("x", &[x])
            .buf("weight", &[weight])
            .buf("out", &[out])
            .f32("eps", 1e-5)
            .u32("dim", dim)
    };
    call(24, 8, 24, 8).accepted();
    call(24, 8, 24, 0).refused("dim = 0");
    call(24, 8, 24, 5).refused("dim = 5");
    call(24, 8, 24, MAX).refused("dim = 4294967295");
    call(24, 7, 24, 8).refused("weight");
    call(24, 8, 16, 8).refused("out");
}

#[test]
fn rms_norms_refuse_hostile_dims() {
    let families: [&[KernelSig; 3]; 5] = [
        &kn::RMS_NORM,
        &kn::RMS_NORM_NO_SCALE,
        &kn::RMS_NORM_MUL,
        &kn::RMS_NORM_NO_SCALE_MUL,
        &kn::RMS_NORM_ADD,
    ];
    for sig in families.into_iter().flatten() {
        let call = |x: usize, weight: usize, m: usize, dim: u32| {
            Call::new(sig)
                .buf("x", &[x])
                .opt_buf("weight", &[weight])
                .opt_buf("m", &[m])
                .opt_buf("out", &[x])
                .opt_buf("acc", &[x])
                .f32("eps", 1e-5)
                .u32("dim", dim)
        };
        call(24, 8, 8, 8).accepted();
        call(24, 8, 24, 8).accepted();
        call(0, 8, 8, 8).accepted();
        call(24, 8, 8, 8).f32("eps", f32::NAN).accepted();
        call(24, 8, 8, 8).f32("eps", -1.0).accepted();
        call(24, 8, 8, 0).refused("dim = 0");
        call(24, 8, 8, 5).refused("dim = 5");
        call(24, 8, 8, MAX).refused("dim = 4294967295");
        if sig.index_of("weight").is_some() {
            call(24, 7, 8, 8).refused("weight");
        }
        if sig.index_of("m").is_some() {
            call(24, 8, 7, 8).refused("m has 7");
        }
        // The output (or accumulator) one value short of x.
        let out = if sig.index_of("acc").is_some() {
            "acc"
        } else {
            "out"
        };
        call(24, 8, 8, 8)
            .buf(out, &[23])
            .refused(&format!("{out} 23"));
    }
}
