//! The decoder-only transformer skeleton every family shares, built only from `Session` ops: a
//! [`ModelConfig`] says which norms, activation, RoPE layout and attention windows a family uses,
//! and [`Transformer::record`] records a forward pass from it.
//!
//! Weights stay where the backend wants them (zero-copy views of the mapped file on the CPU).
//! The KV cache is preallocated for the whole context. Everything that changes from one step to the
//! next (token ids, positions, the first position of the pass) lives in small device buffers, so a
//! recorded decode step is valid for every step.

use std::sync::Arc;

use crate::backend::{Buffer, DType, Device};
use crate::error::{Error, Result};
use crate::model::arch::{Activation, ModelConfig};
use crate::model::budget;
use crate::model::gguf::GgufFile;
use crate::model::weights::{self, Weights};
use crate::ops::attention::AttentionParams;
use crate::ops::rope::RopeParams;
use crate::session::Session;

mod draw;
mod named;
mod options;
mod slots;
use draw::DrawBuffers;
pub use options::{KvCache, LoadOptions};
use slots::BatchBuffers;

/// Scratch activations for passes of up to `rows` tokens.
struct Scratch {
    rows: usize,
    x: Buffer,
    xn: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    attn: Buffer,
    proj: Buffer,
    gate: Buffer,
    up: Buffer,
    hidden: Buffer,
    /// Queries and keys before their per-head norm (families with `qk_norm`).
    qk_raw: Option<(Buffer, Buffer)>,
    partials: Option<Buffer>,
}

/// Slots of the ring greedy decode steps write their tokens into ([`Transformer::step_token`]):
/// more than the steps a caller keeps in flight (two).
pub const TOKEN_RING: usize = 4;

/// The per-step values, in device memory.
/// The per-pass values, as views of one i32 allocation laid out `[step, tokens.., positions..]`
/// (one host-to-device copy per pass writes them all).
struct StepInputs {
    all: Buffer,
    tokens: Buffer,
    positions: Buffer,
    step: Buffer,
}

impl StepInputs {
    fn new(device: &Device, max_batch: usize) -> Result<Self> {
        let all = device.alloc(DType::I32, &[1 + 2 * max_batch])?;
        Ok(StepInputs {
            step: all.view(0, DType::I32, &[1])?,
            tokens: all.view(4, DType::I32, &[max_batch])?,
            positions: all.view(4 * (1 + max_batch), DType::I32, &[max_batch])?,
            all,
        })
    }

    /// The values of a pass of `ids` starting at `pos0`, as the prefix of `all` to write.
    fn write(&self, device: &Device, ids: &[i32], pos0: usize) -> Result<()> {
        let max_batch = self.tokens.elems();
        let rows = ids.len();
        let mut words = vec![0i32; 1 + max_batch + rows];
        words[0] = pos0 as i32;
        words[1..1 + rows].copy_from_slice(ids);
        for (r, w) in words[1 + max_batch..].iter_mut().enumerate() {
            *w = (pos0 + r) as i32;
        }
        device.write(&self.all.view(0, DType::I32, &[words.len()])?, &words)
    }
}

/// What a pass records: its rows, scratch views, token and position inputs, and whether its
/// products must be row-invariant (batched steps).
struct Pass {
    rows: usize,
    sc: ScratchViews,
    tokens: Buffer,
    positions: Buffer,
    row_invariant: bool,
}

/// What one layer's cache writes and attention read and write.
struct AttentionIo<'a> {
    q: &'a Buffer,
    k: &'a Buffer,
    v: &'a Buffer,
    out: &'a Buffer,
    params: AttentionParams,
}

/// The first `rows` rows of a [`Scratch`].
struct ScratchViews {
    x: Buffer,
    xn: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    attn: Buffer,
    proj: Buffer,
    gate: Buffer,
    up: Buffer,
    hidden: Buffer,
    qk_raw: Option<(Buffer, Buffer)>,
}

impl ScratchViews {
    fn of(sc: &Scratch, rows: usize) -> Result<Self> {
        let view = |b: &Buffer| b.rows(0, rows);
        Ok(ScratchViews {
            x: view(&sc.x)?,
            xn: view(&sc.xn)?,
            q: view(&sc.q)?,
            k: view(&sc.k)?,
            v: view(&sc.v)?,
            attn: view(&sc.attn)?,
            proj: view(&sc.proj)?,
            gate: view(&sc.gate)?,
            up: view(&sc.up)?,
            hidden: view(&sc.hidden)?,
            qk_raw: match &sc.qk_raw {
                Some((qr, kr)) => Some((view(qr)?, view(kr)?)),
                None => None,
            },
        })
    }

    /// Nobody reads the activations after the pass (the residual `x` and the final norm's
    /// output stay readable: `final_hidden_norms` reads them).
    fn mark_scratch(&self, s: &mut Session) {
        for b in [
            &self.xn,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.proj,
            &self.gate,
            &self.up,
            &self.hidden,
        ] {
            s.mark_scratch(b);
        }
        if let Some((q_raw, k_raw)) = &self.qk_raw {
            s.mark_scratch(q_raw);
            s.mark_scratch(k_raw);
        }
    }
}

/// Which rows of a pass produce logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last row (what generation needs).
    Last,
    /// Every row (for tests and scoring).
    All,
}

/// How a recorded pass ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepEnd {
    /// With the logits.
    Logits,
    /// With the most likely token on the device.
    Argmax,
    /// With a token drawn on the device (one row).
    Draw,
}

/// A loaded model with its KV cache and scratch, ready to record passes.
pub struct Transformer {
    config: ModelConfig,
    device: Device,
    weights: Weights,
    /// Every layer's K and V caches, `[cache_slots, n_kv_head, max_ctx, head_dim]` each: one slot
    /// per sequence (one for [`Transformer::load`]), then a padding slot when batched steps exist.
    kv: Vec<(Buffer, Buffer)>,
    /// Sequences the cache holds (the padding slot, if any, is not counted).
    slots: usize,
    /// The batched decode step's buffers ([`Transformer::load_slots`] only).
    batch: Option<BatchBuffers>,
    max_ctx: usize,
    inputs: StepInputs,
    prefill: Scratch,
    decode: Scratch,
    norm_out: Buffer,
    logits: Buffer,
    next_token: Buffer,
    /// A sampled decode step's draw ([`Transformer::record_sampled_step`]).
    draw: DrawBuffers,
    /// Chunk length of the split decode attention (the backend's choice).
    decode_chunk: usize,
    _file: Arc<GgufFile>,
}

impl Transformer {
    /// Loads a model for `device` with a KV cache of `max_ctx` positions and prefill passes of up
    /// to `max_batch` tokens.
    pub fn load(
        file: Arc<GgufFile>,
        device: &Device,
        max_ctx: usize,
        max_batch: usize,
    ) -> Result<Self> {
        Self::load_with(file, device, &LoadOptions::new(max_ctx, max_batch))
    }

    /// Loads a model whose KV cache holds `slots` sequences of `max_ctx` positions each, with
    /// prefill passes of up to `max_batch` tokens into one slot and, when `max_rows > 0`, batched
    /// decode steps of up to `max_rows` rows (one per slot; see
    /// [`Transformer::record_decode_rows`]). The cache then has one more slot, for the padding
    /// rows of a batch. `load_slots(.., 1, 0)` is [`Transformer::load`].
    pub fn load_slots(
        file: Arc<GgufFile>,
        device: &Device,
        max_ctx: usize,
        max_batch: usize,
        slots: usize,
        max_rows: usize,
    ) -> Result<Self> {
        let options = LoadOptions::new(max_ctx, max_batch).with_slots(slots, max_rows);
        Self::load_with(file, device, &options)
    }

    /// Loads a model as `options` says: [`Transformer::load_slots`] with the KV cache's element
    /// type chosen ([`KvCache`]; the device's choice unless told).
    pub fn load_with(file: Arc<GgufFile>, device: &Device, options: &LoadOptions) -> Result<Self> {
        let LoadOptions {
            max_ctx,
            max_batch,
            slots,
            max_rows,
            kv_cache,
        } = *options;
        let kv_dtype = kv_cache.dtype(device);
        let config = ModelConfig::from_gguf(&file)?;
        if max_ctx == 0 || max_batch == 0 || slots == 0 {
            return Err(Error::InvalidArgument(
                "context, batch sizes and slots must be at least 1".into(),
            ));
        }
        let max_batch = max_batch.min(max_ctx);
        let max_rows = max_rows.min(slots);
        let cache_slots = slots + usize::from(max_rows > 0);
        let params = config.full_attention();
        let decode_chunk = crate::ops::attention::decode_chunk_len(device);
        let partial_len =
            crate::ops::attention::attention_decode_scratch_len(params, max_ctx, decode_chunk)?;
        let kv_bytes = kv_dtype.block_bytes() as u128;
        let need =
            budget::cache_and_scratch_bytes(&config, max_ctx, max_batch, partial_len, kv_bytes)
                + budget::slots_and_batch_bytes(
                    &config,
                    max_ctx,
                    cache_slots,
                    max_rows,
                    partial_len,
                    kv_bytes,
                );
        budget::check_fits(need, device.allocatable_bytes(), max_ctx)?;
        if max_ctx > config.train_ctx {
            tracing::warn!(
                "a context of {max_ctx} tokens exceeds the {} the model was trained for: \
                 positions past it may give poor text",
                config.train_ctx
            );
        }
        let weights = weights::load(&file, device, &config)?;
        let mut kv = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            let dims = [cache_slots, config.n_kv_head, max_ctx, config.head_dim];
            kv.push((
                device.alloc(kv_dtype, &dims)?,
                device.alloc(kv_dtype, &dims)?,
            ));
        }
        let inputs = StepInputs::new(device, max_batch)?;
        let prefill = Scratch::new(device, &config, max_batch, None)?;
        let decode = Scratch::new(device, &config, 1, Some(partial_len))?;
        let batch = if max_rows > 0 {
            Some(BatchBuffers::new(device, &config, max_rows, partial_len)?)
        } else {
            None
        };
        Ok(Transformer {
            slots,
            batch,
            norm_out: device.alloc(DType::F32, &[max_batch, config.dim])?,
            logits: device.alloc(DType::F32, &[max_batch, config.vocab])?,
            next_token: device.alloc(DType::I32, &[TOKEN_RING])?,
            draw: DrawBuffers::new(device, config.vocab)?,
            config,
            device: device.clone(),
            weights,
            kv,
            max_ctx,
            inputs,
            prefill,
            decode,
            decode_chunk,
            _file: file,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Positions the KV cache holds.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Most tokens one prefill pass takes.
    pub fn max_batch(&self) -> usize {
        self.prefill.rows
    }

    /// Writes the per-step inputs for a pass over `tokens` starting at position `pos0`.
    pub fn set_inputs(&self, tokens: &[u32], pos0: usize) -> Result<()> {
        let rows = tokens.len();
        if rows == 0 || rows > self.max_batch() {
            return Err(Error::InvalidArgument(format!(
                "a pass takes 1 to {} tokens, got {rows}",
                self.max_batch()
            )));
        }
        if pos0.checked_add(rows).is_none_or(|end| end > self.max_ctx) {
            return Err(Error::InvalidArgument(format!(
                "context overflow: positions {pos0}..{} exceed the context of {} tokens",
                pos0.saturating_add(rows),
                self.max_ctx
            )));
        }
        let mut ids = Vec::with_capacity(rows);
        for &t in tokens {
            if t as usize >= self.config.vocab {
                return Err(Error::InvalidArgument(format!(
                    "token id {t} is out of range for a vocabulary of {}",
                    self.config.vocab
                )));
            }
            ids.push(t as i32);
        }
        self.inputs.write(&self.device, &ids, pos0)
    }

    /// Records one forward pass over `rows` tokens (inputs set by [`Transformer::set_inputs`]) into a
    /// session. Decode passes (`rows == 1`) use the split decode attention and their own scratch, so
    /// a recorded decode step can be replayed for every later step. With `argmax`, the pass ends by
    /// writing the most likely next token (of the last row) into [`Transformer::argmax_token`]'s
    /// slot; a one-row pass also advances the step inputs to the next greedy step (that token at
    /// the next position), so that its graph can be launched again without the host writing them.
    pub fn record(&self, s: &mut Session, rows: usize, logits: Logits, argmax: bool) -> Result<()> {
        self.record_in_slot(s, rows, logits, argmax, 0)
    }

    /// [`Transformer::record`] with the KV cache of `slot` (positions from
    /// [`Transformer::set_inputs`], counted within the slot).
    pub fn record_in_slot(
        &self,
        s: &mut Session,
        rows: usize,
        logits: Logits,
        argmax: bool,
        slot: usize,
    ) -> Result<()> {
        let end = if argmax {
            StepEnd::Argmax
        } else {
            StepEnd::Logits
        };
        self.record_pass(s, rows, logits, end, slot)
    }

    /// A pass of `rows` rows in `slot` that ends as `end` says.
    pub(crate) fn record_pass(
        &self,
        s: &mut Session,
        rows: usize,
        logits: Logits,
        end: StepEnd,
        slot: usize,
    ) -> Result<()> {
        let decode = rows == 1;
        let sc = if decode { &self.decode } else { &self.prefill };
        if rows == 0 || rows > sc.rows {
            return Err(Error::InvalidArgument(format!(
                "a pass takes 1 to {} rows, got {rows}",
                sc.rows
            )));
        }
        let kv = self.slot_kv(slot)?;
        let step = &self.inputs.step;
        let chunk = self.decode_chunk;
        let pass = Pass {
            rows,
            sc: ScratchViews::of(sc, rows)?,
            tokens: self.inputs.tokens.rows(0, rows)?,
            positions: self.inputs.positions.rows(0, rows)?,
            row_invariant: false,
        };
        let mut attend = |s: &mut Session, i: usize, io: &AttentionIo<'_>| {
            let (kc, vc) = &kv[i];
            s.kv_write(io.k, kc, step)?;
            s.kv_write(io.v, vc, step)?;
            match &sc.partials {
                Some(partials) if decode => {
                    s.attention_decode(io.q, kc, vc, step, partials, io.out, io.params, chunk)
                }
                _ => s.attention(io.q, kc, vc, step, io.out, io.params),
            }
        };
        let x = self.record_layers(s, &pass, &mut attend)?;
        let (first, count) = match logits {
            Logits::Last => (rows - 1, 1),
            Logits::All => (0, rows),
        };
        let normed = self.norm_out.rows(0, count)?;
        let out = self.logits.rows(0, count)?;
        self.record_head(s, &x.rows(first, count)?, &normed, &out, false)?;
        match end {
            // The token into the step's ring slot, and the inputs advanced to the next step, so
            // that the step can run again without the host writing them.
            StepEnd::Argmax if rows == 1 => {
                s.argmax_advance(&out, &self.next_token, &self.inputs.all)?
            }
            StepEnd::Argmax => s.argmax(&out.rows(count - 1, 1)?, &self.next_token.rows(0, 1)?)?,
            StepEnd::Draw if rows == 1 => self.record_draw(s, &out)?,
            StepEnd::Draw => {
                return Err(Error::InvalidArgument(format!(
                    "a pass that draws its token on the device has one row, not {rows}"
                )))
            }
            StepEnd::Logits => {}
        }
        pass.sc.mark_scratch(s);
        Ok(())
    }

    /// The layers of a pass: the embedding, then every block, with `attend` recording each
    /// layer's cache writes and attention. Returns the residual stream `x` (`[rows, dim]`).
    fn record_layers(
        &self,
        s: &mut Session,
        pass: &Pass,
        attend: &mut dyn FnMut(&mut Session, usize, &AttentionIo<'_>) -> Result<()>,
    ) -> Result<Buffer> {
        let c = &self.config;
        let rows = pass.rows;
        let ScratchViews {
            x,
            xn,
            q,
            k,
            v,
            attn,
            proj,
            gate,
            up,
            hidden,
            qk_raw,
        } = &pass.sc;
        let product = |s: &mut Session, x: &Buffer, w: &Buffer, out: &Buffer| {
            if pass.row_invariant {
                s.matmul_rows(x, w, out)
            } else {
                s.matmul(x, w, out)
            }
        };
        let w = &self.weights;
        s.embedding(&w.embed, &pass.tokens, x)?;
        if let Some(scale) = c.embed_scale {
            s.scale(x, scale, x)?;
        }
        // Per-head views: one row per head, for the query and key norms.
        let heads = |t: &Buffer, n: usize| t.reshape(&[rows * n, c.head_dim]);
        for (i, l) in w.layers.iter().enumerate() {
            let layer = c.layer_attention(i);
            let rope = RopeParams {
                mode: c.rope_mode,
                head_dim: c.head_dim,
                rotary_dim: c.rope_dim,
                base: layer.rope_base,
                freq_factors: w.rope_freqs.as_ref(),
            };
            s.rms_norm(x, &l.attn_norm, xn, c.norm_eps)?;
            match (&l.qk_norm, qk_raw) {
                (Some((q_norm, k_norm)), Some((q_raw, k_raw))) => {
                    product(s, xn, &l.wq, q_raw)?;
                    product(s, xn, &l.wk, k_raw)?;
                    product(s, xn, &l.wv, v)?;
                    let (q_heads, k_heads) = (heads(q, c.n_head)?, heads(k, c.n_kv_head)?);
                    s.rms_norm(&heads(q_raw, c.n_head)?, q_norm, &q_heads, c.norm_eps)?;
                    s.rms_norm(&heads(k_raw, c.n_kv_head)?, k_norm, &k_heads, c.norm_eps)?;
                }
                _ => {
                    product(s, xn, &l.wq, q)?;
                    product(s, xn, &l.wk, k)?;
                    product(s, xn, &l.wv, v)?;
                }
            }
            s.rope(q, &pass.positions, q, &rope)?;
            s.rope(k, &pass.positions, k, &rope)?;
            let io = AttentionIo {
                q,
                k,
                v,
                out: attn,
                params: attention_params(c, layer.window),
            };
            attend(s, i, &io)?;
            product(s, attn, &l.wo, proj)?;
            residual_add(s, x, proj, l.post_norms.as_ref().map(|p| &p.0), xn, c)?;
            s.rms_norm(x, &l.ffn_norm, xn, c.norm_eps)?;
            product(s, xn, &l.w_gate, gate)?;
            product(s, xn, &l.w_up, up)?;
            match c.activation {
                Activation::Silu => s.swiglu(gate, up, hidden)?,
                Activation::GeluTanh => s.geglu(gate, up, hidden)?,
            }
            product(s, hidden, &l.w_down, proj)?;
            residual_add(s, x, proj, l.post_norms.as_ref().map(|p| &p.1), xn, c)?;
        }
        Ok(x.clone())
    }

    /// The final norm of `x` into `normed` and the head's product into `logits`.
    fn record_head(
        &self,
        s: &mut Session,
        x: &Buffer,
        normed: &Buffer,
        logits: &Buffer,
        row_invariant: bool,
    ) -> Result<()> {
        let w = &self.weights;
        s.rms_norm(x, &w.out_norm, normed, self.config.norm_eps)?;
        if row_invariant {
            s.matmul_rows(normed, &w.lm_head, logits)
        } else {
            // The logits keep f32 activations (see `ops::matmul::matmul_f32_activations`).
            s.matmul_f32_activations(normed, &w.lm_head, logits)
        }
    }

    /// The logits the last pass wrote: `[rows, vocab]` for [`Logits::All`], else `[1, vocab]`.
    pub fn logits_buffer(&self, rows: usize) -> Result<Buffer> {
        self.logits.rows(0, rows)
    }

    /// Euclidean norms of the last position's hidden vector before and after the final RMSNorm,
    /// as the last pass left them (computed in f64 on the host).
    pub fn final_hidden_norms(&self, rows: usize, logits: Logits) -> Result<(f64, f64)> {
        let sc = if rows == 1 {
            &self.decode
        } else {
            &self.prefill
        };
        let before = self.device.download::<f32>(&sc.x.rows(rows - 1, 1)?)?;
        let count = if logits == Logits::All { rows } else { 1 };
        let after = self
            .device
            .download::<f32>(&self.norm_out.rows(count - 1, 1)?)?;
        let norm = |v: &[f32]| {
            v.iter()
                .map(|&x| (x as f64) * (x as f64))
                .sum::<f64>()
                .sqrt()
        };
        Ok((norm(&before), norm(&after)))
    }

    /// The i32 slot a greedy decode step at position `pos` writes its token into: a ring of
    /// [`TOKEN_RING`] slots, so that a step's token stays readable while the next step runs.
    pub fn step_token(&self, pos: usize) -> Result<Buffer> {
        self.argmax_token(1, pos)
    }

    /// The i32 slot a pass of `rows` rows from position `pos0` with `argmax` writes its last
    /// row's token into: a one-row pass its position's slot of the ring ([`Self::step_token`]),
    /// a longer pass slot 0.
    pub fn argmax_token(&self, rows: usize, pos0: usize) -> Result<Buffer> {
        let slot = if rows == 1 { pos0 % TOKEN_RING } else { 0 };
        self.next_token.rows(slot, 1)
    }
}

/// The attention parameters of a layer with sliding window `window`.
fn attention_params(c: &ModelConfig, window: Option<usize>) -> AttentionParams {
    match window {
        None => c.full_attention(),
        Some(w) => c.full_attention().with_window(w),
    }
}

/// `x += out`, or `x += rms_norm(out) * post_norm` for families that normalize a block's output
/// before the residual add (the norm writes into `tmp`).
fn residual_add(
    s: &mut Session,
    x: &Buffer,
    out: &Buffer,
    post_norm: Option<&Buffer>,
    tmp: &Buffer,
    c: &ModelConfig,
) -> Result<()> {
    match post_norm {
        Some(weight) => {
            s.rms_norm(out, weight, tmp, c.norm_eps)?;
            s.add_inplace(x, tmp)
        }
        None => s.add_inplace(x, out),
    }
}

impl Scratch {
    /// The activation buffers, named (the attention scratch apart).
    fn named(&self) -> Vec<(String, Buffer)> {
        let bufs = [
            &self.x,
            &self.xn,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.proj,
            &self.gate,
            &self.up,
            &self.hidden,
        ];
        let names = [
            "x", "xn", "q", "k", "v", "attn", "proj", "gate", "up", "hidden",
        ];
        let mut v: Vec<(String, Buffer)> = names
            .iter()
            .zip(bufs)
            .map(|(n, b)| (n.to_string(), b.clone()))
            .collect();
        if let Some((q_raw, k_raw)) = &self.qk_raw {
            v.push(("q_raw".into(), q_raw.clone()));
            v.push(("k_raw".into(), k_raw.clone()));
        }
        v
    }

    fn new(device: &Device, c: &ModelConfig, rows: usize, partials: Option<usize>) -> Result<Self> {
        let f = |width: usize| device.alloc(DType::F32, &[rows, width]);
        Ok(Scratch {
            rows,
            x: f(c.dim)?,
            xn: f(c.dim)?,
            q: f(c.q_width())?,
            k: f(c.kv_width())?,
            v: f(c.kv_width())?,
            attn: f(c.q_width())?,
            proj: f(c.dim)?,
            gate: f(c.ffn_dim)?,
            up: f(c.ffn_dim)?,
            hidden: f(c.ffn_dim)?,
            qk_raw: if c.qk_norm {
                Some((f(c.q_width())?, f(c.kv_width())?))
            } else {
                None
            },
            partials: match partials {
                Some(n) => Some(device.alloc(DType::F32, &[n])?),
                None => None,
            },
        })
    }
}
