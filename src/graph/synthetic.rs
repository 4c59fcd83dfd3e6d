//! A synthetic graph shaped like one decode step of a Llama-family model, for benchmarks, the
//! graph export and demonstrations of what the optimizer does. Its kernels are declared here
//! under names of their own (the graph is never run); the buffers are real views, laid out as the
//! model lays them out: weights as views of one big allocation, activations in a scratch
//! allocation, one K and one V cache allocation per layer, a small step buffer for the position.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::passes::FusionRule;
use crate::graph::{
    ArgRef, ComputeGraph, DispatchRef, DispatchSpec, Grid, KernelId, KernelSig, OpKind, Range,
};
use crate::memory::Buffer;

/// The step's kernels: declared with their parameters, so recording checks every argument as
/// it does for a real model, under names of their own (the graph is studied, never run).
mod sigs {
    use crate::dtype::DType;
    use crate::graph::{KernelSig, OpKind};
    use crate::kernels::{DTypes, Param};

    const F32: DTypes = DTypes::one(DType::F32);
    const I32: DTypes = DTypes::one(DType::I32);
    const U8: DTypes = DTypes::one(DType::U8);

    pub(super) static EMBEDDING_Q4_1: KernelSig = KernelSig::new(
        "synthetic_embedding_q4_1",
        OpKind::Gather,
        &[
            Param::read("token", I32),
            Param::read("table", U8),
            Param::write("out", F32),
        ],
    );
    pub(super) static MATMUL_Q4_1: KernelSig = KernelSig::new(
        "synthetic_matmul_q4_1",
        OpKind::MatMul,
        &[
            Param::read("x", F32),
            Param::read("w", U8),
            Param::write("out", F32),
        ],
    );
    pub(super) static ROPE_F32: KernelSig = KernelSig::new(
        "synthetic_rope_f32",
        OpKind::Rope,
        &[Param::read_write("x", F32), Param::read("positions", I32)],
    );
    pub(super) static KV_WRITE_F32: KernelSig = KernelSig::new(
        "synthetic_kv_write_f32",
        OpKind::KvWrite,
        &[
            Param::read("new", F32),
            Param::read("step", I32),
            Param::read_write("cache", F32),
        ],
    );
    pub(super) static ATTENTION_DECODE_F32: KernelSig = KernelSig::new(
        "synthetic_attention_decode_f32",
        OpKind::Attention,
        &[
            Param::read("q", F32),
            Param::read("k_cache", F32),
            Param::read("v_cache", F32),
            Param::read("step", I32),
            Param::write("out", F32),
        ],
    );
    pub(super) static ADD_F32: KernelSig = KernelSig::new(
        "synthetic_add_f32",
        OpKind::Add,
        &[Param::read_write("acc", F32), Param::read("b", F32)],
    );
    pub(super) static SWIGLU_F32: KernelSig = KernelSig::new(
        "synthetic_swiglu_f32",
        OpKind::Elementwise,
        &[
            Param::read("gate", F32),
            Param::read("up", F32),
            Param::write("out", F32),
        ],
    );
    pub(super) static RMS_NORM_F32: KernelSig = KernelSig::new(
        "synthetic_rms_norm_f32",
        OpKind::RmsNorm,
        &[
            Param::read("x", F32),
            Param::write("out", F32),
            Param::f32("eps"),
        ],
    );
    pub(super) static MUL_F32: KernelSig = KernelSig::new(
        "synthetic_mul_f32",
        OpKind::Mul,
        &[
            Param::read("a", F32),
            Param::read("b", F32),
            Param::write("out", F32),
        ],
    );
    pub(super) static RMS_NORM_MUL_F32: KernelSig = KernelSig::new(
        "synthetic_rms_norm_mul_f32",
        OpKind::RmsNormMul,
        &[
            Param::read("x", F32),
            Param::read("weight", F32),
            Param::write("out", F32),
            Param::f32("eps"),
        ],
    );
}
use sigs::*;

/// Model dimensions of the synthetic decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Transformer layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// KV cache capacity in positions.
    pub max_ctx: usize,
}

impl DecodeShape {
    /// SmolLM2-135M: 30 layers, hidden 576, 9 query and 3 KV heads of 64, FFN 1536.
    pub const SMOLLM2_135M: DecodeShape = DecodeShape {
        layers: 30,
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        ffn: 1536,
        vocab: 49152,
        max_ctx: 256,
    };

    /// The same model with `layers` layers.
    pub const fn with_layers(self, layers: usize) -> DecodeShape {
        DecodeShape { layers, ..self }
    }

    /// Dispatches per layer in [`DecodeGraph::record`].
    pub const DISPATCHES_PER_LAYER: usize = 19;

    /// Dispatches in one recorded step: the layers plus embedding, final norm, multiply and
    /// LM head.
    pub const fn dispatches(&self) -> usize {
        self.layers * Self::DISPATCHES_PER_LAYER + 4
    }
}

struct LayerWeights {
    attn_norm: Buffer,
    wq: Buffer,
    wk: Buffer,
    wv: Buffer,
    wo: Buffer,
    ffn_norm: Buffer,
    gate: Buffer,
    up: Buffer,
    down: Buffer,
    k_cache: Buffer,
    v_cache: Buffer,
}

struct Scratch {
    x: Buffer,
    normed: Buffer,
    scaled: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    attn: Buffer,
    proj: Buffer,
    gate: Buffer,
    up: Buffer,
    act: Buffer,
    logits: Buffer,
}

/// The buffers of a synthetic decode step; [`record`](Self::record) builds its graph.
pub struct DecodeGraph {
    shape: DecodeShape,
    token: Buffer,
    step: Buffer,
    positions: Buffer,
    embedding: Buffer,
    out_norm: Buffer,
    layers: Vec<LayerWeights>,
    s: Scratch,
}

/// Bytes of a `[rows, cols]` Q4_1 matrix (blocks of 32 values in 20 bytes).
fn q4_1_bytes(rows: usize, cols: usize) -> usize {
    rows * cols.div_ceil(32) * 20
}

/// Hands out consecutive u8 views of one allocation.
struct Carver {
    whole: Buffer,
    next: usize,
}

impl Carver {
    fn take(&mut self, bytes: usize) -> Result<Buffer> {
        let b = self.whole.view(self.next, DType::U8, &[bytes])?;
        self.next += bytes.next_multiple_of(64);
        Ok(b)
    }

    fn take_f32(&mut self, elems: usize) -> Result<Buffer> {
        let b = self.whole.view(self.next, DType::F32, &[elems])?;
        self.next += (elems * 4).next_multiple_of(64);
        Ok(b)
    }
}

impl DecodeGraph {
    /// Allocates the buffers through `alloc` (a device's zeroing `alloc`, such as
    /// `|dtype, dims| device.alloc(dtype, dims)`; the weights stay untouched memory).
    pub fn new(
        mut alloc: impl FnMut(DType, &[usize]) -> Result<Buffer>,
        shape: DecodeShape,
    ) -> Result<DecodeGraph> {
        let DecodeShape {
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn,
            vocab,
            max_ctx,
            ..
        } = shape;
        if hidden == 0 || heads * head_dim != hidden || kv_heads == 0 || ffn == 0 || vocab == 0 {
            return Err(Error::InvalidArgument(format!(
                "inconsistent decode shape {shape:?}"
            )));
        }
        let kv = kv_heads * head_dim;
        let per_layer = 2 * hidden * 4
            + q4_1_bytes(hidden, hidden) * 2
            + q4_1_bytes(kv, hidden) * 2
            + q4_1_bytes(ffn, hidden) * 2
            + q4_1_bytes(hidden, ffn)
            + 16 * 64;
        let weight_bytes = per_layer * shape.layers + q4_1_bytes(vocab, hidden) + hidden * 4 + 256;
        let mut w = Carver {
            whole: alloc(DType::U8, &[weight_bytes])?,
            next: 0,
        };
        let scratch_elems = 8 * hidden + 2 * kv + 3 * ffn + vocab + 16 * 64;
        let mut a = Carver {
            whole: alloc(DType::F32, &[scratch_elems])?,
            next: 0,
        };
        let mut layers = Vec::with_capacity(shape.layers);
        for _ in 0..shape.layers {
            layers.push(LayerWeights {
                attn_norm: w.take_f32(hidden)?,
                wq: w.take(q4_1_bytes(hidden, hidden))?,
                wk: w.take(q4_1_bytes(kv, hidden))?,
                wv: w.take(q4_1_bytes(kv, hidden))?,
                wo: w.take(q4_1_bytes(hidden, hidden))?,
                ffn_norm: w.take_f32(hidden)?,
                gate: w.take(q4_1_bytes(ffn, hidden))?,
                up: w.take(q4_1_bytes(ffn, hidden))?,
                down: w.take(q4_1_bytes(hidden, ffn))?,
                k_cache: alloc(DType::F32, &[kv_heads, max_ctx, head_dim])?,
                v_cache: alloc(DType::F32, &[kv_heads, max_ctx, head_dim])?,
            });
        }
        let s = Scratch {
            x: a.take_f32(hidden)?,
            normed: a.take_f32(hidden)?,
            scaled: a.take_f32(hidden)?,
            q: a.take_f32(hidden)?,
            k: a.take_f32(kv)?,
            v: a.take_f32(kv)?,
            attn: a.take_f32(hidden)?,
            proj: a.take_f32(hidden)?,
            gate: a.take_f32(ffn)?,
            up: a.take_f32(ffn)?,
            act: a.take_f32(ffn)?,
            logits: a.take_f32(vocab)?,
        };
        Ok(DecodeGraph {
            shape,
            token: alloc(DType::I32, &[1])?,
            step: alloc(DType::I32, &[1])?,
            positions: alloc(DType::I32, &[1])?,
            embedding: w.take(q4_1_bytes(vocab, hidden))?,
            out_norm: w.take_f32(hidden)?,
            layers,
            s,
        })
    }

    /// The model dimensions.
    pub fn shape(&self) -> DecodeShape {
        self.shape
    }

    /// Records one decode step: builds every dispatch (ranges derived from the arguments).
    pub fn record(&self) -> Result<ComputeGraph> {
        let mut g = ComputeGraph::with_capacity(self.shape.dispatches());
        self.record_into(&mut g)?;
        Ok(g)
    }

    /// Records one decode step at the end of `g` (after [`ComputeGraph::clear`], a graph that
    /// recorded a step before records it again without taking its views in anew).
    pub fn record_into(&self, g: &mut ComputeGraph) -> Result<()> {
        let s = &self.s;
        let (hidden, ffn) = (self.shape.hidden, self.shape.ffn);
        let rows = |n: usize| Grid::cover(n, 256);
        let mut push = |kernel: &'static KernelSig, args: &[ArgRef<'_>], grid: Grid| {
            g.record(KernelId::of(kernel), args, grid)
        };
        push(
            &EMBEDDING_Q4_1,
            &[
                ArgRef::read(&self.token),
                ArgRef::read(&self.embedding),
                ArgRef::write(&s.x),
            ],
            rows(hidden),
        )?;
        for l in &self.layers {
            self.norm_mul(&mut push, &l.attn_norm)?;
            for (w, out) in [(&l.wq, &s.q), (&l.wk, &s.k), (&l.wv, &s.v)] {
                push(
                    &MATMUL_Q4_1,
                    &[ArgRef::read(&s.scaled), ArgRef::read(w), ArgRef::write(out)],
                    rows(out.elems()),
                )?;
            }
            for t in [&s.q, &s.k] {
                push(
                    &ROPE_F32,
                    &[ArgRef::read_write(t), ArgRef::read(&self.positions)],
                    rows(t.elems()),
                )?;
            }
            for (src, cache) in [(&s.k, &l.k_cache), (&s.v, &l.v_cache)] {
                push(
                    &KV_WRITE_F32,
                    &[
                        ArgRef::read(src),
                        ArgRef::read(&self.step),
                        ArgRef::read_write(cache),
                    ],
                    rows(src.elems()),
                )?;
            }
            push(
                &ATTENTION_DECODE_F32,
                &[
                    ArgRef::read(&s.q),
                    ArgRef::read(&l.k_cache),
                    ArgRef::read(&l.v_cache),
                    ArgRef::read(&self.step),
                    ArgRef::write(&s.attn),
                ],
                Grid::new(self.shape.heads as u32, 128),
            )?;
            push(
                &MATMUL_Q4_1,
                &[
                    ArgRef::read(&s.attn),
                    ArgRef::read(&l.wo),
                    ArgRef::write(&s.proj),
                ],
                rows(hidden),
            )?;
            push(
                &ADD_F32,
                &[ArgRef::read_write(&s.x), ArgRef::read(&s.proj)],
                rows(hidden),
            )?;
            self.norm_mul(&mut push, &l.ffn_norm)?;
            for (w, out) in [(&l.gate, &s.gate), (&l.up, &s.up)] {
                push(
                    &MATMUL_Q4_1,
                    &[ArgRef::read(&s.scaled), ArgRef::read(w), ArgRef::write(out)],
                    rows(ffn),
                )?;
            }
            push(
                &SWIGLU_F32,
                &[
                    ArgRef::read(&s.gate),
                    ArgRef::read(&s.up),
                    ArgRef::write(&s.act),
                ],
                rows(ffn),
            )?;
            push(
                &MATMUL_Q4_1,
                &[
                    ArgRef::read(&s.act),
                    ArgRef::read(&l.down),
                    ArgRef::write(&s.proj),
                ],
                rows(hidden),
            )?;
            push(
                &ADD_F32,
                &[ArgRef::read_write(&s.x), ArgRef::read(&s.proj)],
                rows(hidden),
            )?;
        }
        self.norm_mul(&mut push, &self.out_norm)?;
        push(
            &MATMUL_Q4_1,
            &[
                ArgRef::read(&s.scaled),
                ArgRef::read(&self.embedding),
                ArgRef::write(&s.logits),
            ],
            rows(self.shape.vocab),
        )?;
        Ok(())
    }

    fn norm_mul(
        &self,
        push: &mut impl FnMut(&'static KernelSig, &[ArgRef<'_>], Grid) -> Result<()>,
        weight: &Buffer,
    ) -> Result<()> {
        let s = &self.s;
        push(
            &RMS_NORM_F32,
            &[
                ArgRef::read(&s.x),
                ArgRef::write(&s.normed),
                ArgRef::f32(1e-5),
            ],
            Grid::new(1, 256),
        )?;
        push(
            &MUL_F32,
            &[
                ArgRef::read(&s.normed),
                ArgRef::read(weight),
                ArgRef::write(&s.scaled),
            ],
            Grid::cover(s.scaled.elems(), 256),
        )
    }
}

/// The fusion rule for the synthetic graph: `rms_norm_f32` writing `t`, then `mul_f32` reading
/// `t` and a weight, becomes one `rms_norm_mul_f32` (input, weight, output, epsilon).
pub fn norm_mul_rule() -> FusionRule {
    FusionRule::pair(
        "synthetic_rms_norm_mul",
        OpKind::RmsNorm,
        OpKind::Mul,
        norm_mul_intermediate,
        norm_mul_build,
    )
}

fn norm_mul_intermediate(a: DispatchRef<'_>, b: DispatchRef<'_>) -> Option<Range> {
    if a.kernel() != KernelId::of(&RMS_NORM_F32) || b.kernel() != KernelId::of(&MUL_F32) {
        return None;
    }
    let (out, input) = (Range::of(a.buffer("out")?), Range::of(b.buffer("a")?));
    (out == input).then_some(out)
}

fn norm_mul_build<'a>(a: DispatchRef<'a>, b: DispatchRef<'a>) -> Result<DispatchSpec<'a>> {
    let bad = || Error::InvalidArgument("synthetic rms_norm_mul: unexpected arguments".into());
    let x = a.buffer("x").ok_or_else(bad)?;
    let w = b.buffer("b").ok_or_else(bad)?;
    let out = b.buffer("out").ok_or_else(bad)?;
    let eps = a.scalar("eps").ok_or_else(bad)?;
    DispatchSpec::new(
        KernelId::of(&RMS_NORM_MUL_F32),
        &[
            ArgRef::read(x),
            ArgRef::read(w),
            ArgRef::write(out),
            ArgRef::Scalar(eps),
        ],
        a.grid(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;
    use crate::graph::passes;

    #[test]
    fn given_the_smollm2_shape_when_recorded_and_optimized_should_fuse_norms_and_keep_counts() {
        let dev = Device::cpu(1).expect("cpu");
        let shape = DecodeShape::SMOLLM2_135M;
        let dg = DecodeGraph::new(|t, d| dev.alloc(t, d), shape).expect("buffers");
        let mut g = dg.record().expect("record");
        assert_eq!(g.dispatch_count(), shape.dispatches());
        assert_eq!(shape.dispatches(), 574);
        let sequential = {
            let mut s = g.clone();
            passes::place_barriers(&mut s)
        };
        // Every norm is followed by its multiply, and `normed` is rewritten by the next norm,
        // except after the final norm, where nothing overwrites it: 2 per layer fuse.
        assert_eq!(passes::fuse(&mut g, &[norm_mul_rule()]), 2 * shape.layers);
        passes::reorder(&mut g, passes::DEFAULT_LOOKAHEAD);
        let barriers = passes::place_barriers(&mut g);
        assert_eq!(g.dispatch_count(), shape.dispatches() - 2 * shape.layers);
        assert!(
            barriers < sequential,
            "reorder should save barriers: {barriers} vs {sequential}"
        );
    }
}

/// An untyped kernel of kind `op`, named `synthetic_<kind>`: for graphs the optimizer studies
/// and no backend runs (pass tests, property tests, benchmarks). Every call with the same kind
/// gives the same kernel.
pub fn untyped_kernel(op: OpKind) -> KernelId {
    macro_rules! untyped {
        ($($name:literal => $op:expr),* $(,)?) => {
            [$(KernelSig::untyped($name, $op)),*]
        };
    }
    static KERNELS: [KernelSig; OpKind::CODES] = untyped![
        "synthetic_matmul" => OpKind::MatMul,
        "synthetic_matmul_id" => OpKind::MatMulId,
        "synthetic_rms_norm" => OpKind::RmsNorm,
        "synthetic_rms_norm_mul" => OpKind::RmsNormMul,
        "synthetic_rms_norm_add" => OpKind::RmsNormAdd,
        "synthetic_rope" => OpKind::Rope,
        "synthetic_add" => OpKind::Add,
        "synthetic_mul" => OpKind::Mul,
        "synthetic_elementwise" => OpKind::Elementwise,
        "synthetic_copy" => OpKind::Copy,
        "synthetic_kv_write" => OpKind::KvWrite,
        "synthetic_gather" => OpKind::Gather,
        "synthetic_softmax" => OpKind::Softmax,
        "synthetic_attention" => OpKind::Attention,
        "synthetic_argmax" => OpKind::Argmax,
        "synthetic_custom_pinned" => OpKind::Custom { reorderable: false },
        "synthetic_custom" => OpKind::Custom { reorderable: true },
        "synthetic_rms_norm_rope" => OpKind::RmsNormRope,
    ];
    KernelId::of(&KERNELS[op.code()])
}

#[cfg(test)]
mod untyped_tests {
    use super::untyped_kernel;
    use crate::graph::OpKind;

    /// The untyped kernel of each op kind has that kind.
    #[test]
    fn given_each_op_kind_when_asked_for_an_untyped_kernel_should_carry_that_kind() {
        for op in [
            OpKind::MatMul,
            OpKind::Rope,
            OpKind::Softmax,
            OpKind::Custom { reorderable: false },
            OpKind::Custom { reorderable: true },
        ] {
            assert_eq!(untyped_kernel(op).op(), op);
        }
    }
}
