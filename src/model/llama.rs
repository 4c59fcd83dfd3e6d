//! The Llama-family forward pass (SmolLM2, Llama 3.x), built only from `Session` ops.
//!
//! Weights stay where the backend wants them (zero-copy views of the mapped file on the CPU).
//! The KV cache is preallocated for the whole context. Everything that changes from one step to the
//! next (token ids, positions, the first position of the pass) lives in small device buffers, so a
//! recorded decode step is valid for every step.

use std::sync::Arc;

use crate::backend::{Buffer, DType, Device};
use crate::error::{Error, Result};
use crate::model::budget;
use crate::model::gguf::GgufFile;
use crate::ops::attention::AttentionParams;
use crate::ops::rope::{RopeMode, RopeParams};
use crate::session::Session;

/// Shapes and constants of a Llama-family model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub dim: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// Context length the model was trained for.
    pub train_ctx: usize,
}

impl LlamaConfig {
    /// Reads the configuration from a GGUF file's metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(file.err(format!(
                "architecture `{arch}` is not supported (only `llama`, which covers SmolLM2 and Llama 3)"
            )));
        }
        let key = |k: &str| format!("llama.{k}");
        let req = |k: &str| file.get_u32(&key(k)).map(|v| v as usize);
        let opt = |k: &str| file.opt_u32(&key(k)).map(|v| v.map(|v| v as usize));
        let optf = |k: &str| file.opt_f32(&key(k));
        let n_layer = req("block_count")?;
        check_blocks(file, n_layer)?;
        let dim = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_kv_head = opt("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_kv_head == 0 || dim % n_head != 0 || n_head % n_kv_head != 0 {
            return Err(file.err(format!(
                "inconsistent heads: dim {dim}, {n_head} heads, {n_kv_head} kv heads"
            )));
        }
        let head_dim = opt("attention.key_length")?.unwrap_or(dim / n_head);
        let embd = file.tensor("token_embd.weight")?.dims_row_major();
        let vocab = embd.first().copied().unwrap_or(0);
        let cfg = LlamaConfig {
            n_layer,
            dim,
            n_head,
            n_kv_head,
            head_dim,
            ffn_dim: req("feed_forward_length")?,
            vocab,
            rope_base: optf("rope.freq_base")?.unwrap_or(10000.0),
            rope_dim: opt("rope.dimension_count")?.unwrap_or(head_dim),
            norm_eps: optf("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
            train_ctx: opt("context_length")?.unwrap_or(2048),
        };
        if cfg.rope_dim > cfg.head_dim || !cfg.rope_dim.is_multiple_of(2) || cfg.vocab == 0 {
            return Err(file.err(format!("inconsistent configuration {cfg:?}")));
        }
        Ok(cfg)
    }

    /// Weights per token, roughly (for reports).
    pub fn params(&self) -> usize {
        let attn = self.dim * self.head_dim * (2 * self.n_head + 2 * self.n_kv_head);
        let ffn = 3 * self.dim * self.ffn_dim;
        self.n_layer * (attn + ffn) + self.vocab * self.dim
    }
}

/// Checks `llama.block_count` against the file before anything is sized by it: a model needs at
/// least one block, and the tensors of every block it declares. The scan stops at the first
/// missing block, so it looks at no more blocks than the file has tensors.
fn check_blocks(file: &GgufFile, n_layer: usize) -> Result<()> {
    if n_layer == 0 {
        return Err(file.err("`llama.block_count` is 0: a model with no blocks cannot run"));
    }
    let first_missing =
        (0..n_layer).find(|i| !file.has_tensor(&format!("blk.{i}.attn_norm.weight")));
    match first_missing {
        Some(i) => Err(file.err(format!(
            "`llama.block_count` is {n_layer}, but the tensors of block {i} are missing \
             (no `blk.{i}.attn_norm.weight`)"
        ))),
        None => Ok(()),
    }
}

struct LayerWeights {
    attn_norm: Buffer,
    wq: Buffer,
    wk: Buffer,
    wv: Buffer,
    wo: Buffer,
    ffn_norm: Buffer,
    w_gate: Buffer,
    w_up: Buffer,
    w_down: Buffer,
}

struct Weights {
    embed: Buffer,
    layers: Vec<LayerWeights>,
    out_norm: Buffer,
    lm_head: Buffer,
    rope_freqs: Option<Buffer>,
}

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
    partials: Option<Buffer>,
}

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

/// Which rows of a pass produce logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last row (what generation needs).
    Last,
    /// Every row (for tests and scoring).
    All,
}

/// A loaded model with its KV cache and scratch, ready to record passes.
pub struct Llama {
    config: LlamaConfig,
    device: Device,
    weights: Weights,
    kv: Vec<(Buffer, Buffer)>,
    max_ctx: usize,
    inputs: StepInputs,
    prefill: Scratch,
    decode: Scratch,
    norm_out: Buffer,
    logits: Buffer,
    next_token: Buffer,
    /// Chunk length of the split decode attention (the backend's choice).
    decode_chunk: usize,
    _file: Arc<GgufFile>,
}

impl Llama {
    /// Loads a model for `device` with a KV cache of `max_ctx` positions and prefill passes of up
    /// to `max_batch` tokens.
    pub fn load(
        file: Arc<GgufFile>,
        device: &Device,
        max_ctx: usize,
        max_batch: usize,
    ) -> Result<Self> {
        let config = LlamaConfig::from_gguf(&file)?;
        if max_ctx == 0 || max_batch == 0 {
            return Err(Error::InvalidArgument(
                "context and batch sizes must be at least 1".into(),
            ));
        }
        let max_batch = max_batch.min(max_ctx);
        let params = attention_params(&config);
        let decode_chunk = crate::ops::attention::decode_chunk_len(device);
        let partial_len =
            crate::ops::attention::attention_decode_scratch_len(params, max_ctx, decode_chunk)?;
        let need = budget::cache_and_scratch_bytes(&config, max_ctx, max_batch, partial_len);
        budget::check_fits(need, device.allocatable_bytes(), max_ctx)?;
        if max_ctx > config.train_ctx {
            tracing::warn!(
                "a context of {max_ctx} tokens exceeds the {} the model was trained for: \
                 positions past it may give poor text",
                config.train_ctx
            );
        }
        let weights = load_weights(&file, device, &config)?;
        let mut kv = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            let dims = [config.n_kv_head, max_ctx, config.head_dim];
            kv.push((
                device.alloc(DType::F32, &dims)?,
                device.alloc(DType::F32, &dims)?,
            ));
        }
        let inputs = StepInputs::new(device, max_batch)?;
        let prefill = Scratch::new(device, &config, max_batch, None)?;
        let decode = Scratch::new(device, &config, 1, Some(partial_len))?;
        Ok(Llama {
            norm_out: device.alloc(DType::F32, &[max_batch, config.dim])?,
            logits: device.alloc(DType::F32, &[max_batch, config.vocab])?,
            next_token: device.alloc(DType::I32, &[1])?,
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
    pub fn config(&self) -> &LlamaConfig {
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

    /// Records one forward pass over `rows` tokens (inputs set by [`Llama::set_inputs`]) into a
    /// session. Decode passes (`rows == 1`) use the split decode attention and their own scratch, so
    /// a recorded decode step can be replayed for every later step. With `argmax`, the pass ends by
    /// writing the most likely next token (of the last row) into [`Llama::next_token_buffer`].
    pub fn record(&self, s: &mut Session, rows: usize, logits: Logits, argmax: bool) -> Result<()> {
        let c = &self.config;
        let decode = rows == 1;
        let sc = if decode { &self.decode } else { &self.prefill };
        if rows == 0 || rows > sc.rows {
            return Err(Error::InvalidArgument(format!(
                "a pass takes 1 to {} rows, got {rows}",
                sc.rows
            )));
        }
        let view = |b: &Buffer| b.rows(0, rows);
        let (x, xn, q, k, v) = (
            view(&sc.x)?,
            view(&sc.xn)?,
            view(&sc.q)?,
            view(&sc.k)?,
            view(&sc.v)?,
        );
        let (attn, proj) = (view(&sc.attn)?, view(&sc.proj)?);
        let (gate, up, hidden) = (view(&sc.gate)?, view(&sc.up)?, view(&sc.hidden)?);
        let tokens = self.inputs.tokens.rows(0, rows)?;
        let positions = self.inputs.positions.rows(0, rows)?;
        let step = &self.inputs.step;
        let rope = RopeParams {
            mode: RopeMode::Normal,
            head_dim: c.head_dim,
            rotary_dim: c.rope_dim,
            base: c.rope_base,
            freq_factors: self.weights.rope_freqs.as_ref(),
        };
        let attn_params = attention_params(c);
        let rope_inplace = |s: &mut Session, t: &Buffer| s.rope(t, &positions, t, &rope);
        let w = &self.weights;
        s.embedding(&w.embed, &tokens, &x)?;
        for (l, (kc, vc)) in w.layers.iter().zip(&self.kv) {
            s.rms_norm(&x, &l.attn_norm, &xn, c.norm_eps)?;
            s.matmul(&xn, &l.wq, &q)?;
            s.matmul(&xn, &l.wk, &k)?;
            s.matmul(&xn, &l.wv, &v)?;
            rope_inplace(s, &q)?;
            rope_inplace(s, &k)?;
            s.kv_write(&k, kc, step)?;
            s.kv_write(&v, vc, step)?;
            match &sc.partials {
                Some(partials) if decode => s.attention_decode(
                    &q,
                    kc,
                    vc,
                    step,
                    partials,
                    &attn,
                    attn_params,
                    self.decode_chunk,
                )?,
                _ => s.attention(&q, kc, vc, step, &attn, attn_params)?,
            }
            s.matmul(&attn, &l.wo, &proj)?;
            s.add_inplace(&x, &proj)?;
            s.rms_norm(&x, &l.ffn_norm, &xn, c.norm_eps)?;
            s.matmul(&xn, &l.w_gate, &gate)?;
            s.matmul(&xn, &l.w_up, &up)?;
            s.swiglu(&gate, &up, &hidden)?;
            s.matmul(&hidden, &l.w_down, &proj)?;
            s.add_inplace(&x, &proj)?;
        }
        let (first, count) = match logits {
            Logits::Last => (rows - 1, 1),
            Logits::All => (0, rows),
        };
        let x_out = x.rows(first, count)?;
        let normed = self.norm_out.rows(0, count)?;
        let out = self.logits.rows(0, count)?;
        s.rms_norm(&x_out, &w.out_norm, &normed, c.norm_eps)?;
        s.matmul(&normed, &w.lm_head, &out)?;
        if argmax {
            s.argmax(&out.rows(count - 1, 1)?, &self.next_token)?;
        }
        // Nobody reads the activations after the pass (the residual `x` and the final norm's
        // output stay readable: `final_hidden_norms` reads them).
        for b in [&xn, &q, &k, &v, &attn, &proj, &gate, &up, &hidden] {
            s.mark_scratch(b);
        }
        Ok(())
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

    /// The i32 buffer an `argmax` pass writes the next token into.
    pub fn next_token_buffer(&self) -> &Buffer {
        &self.next_token
    }

    /// Every buffer the model owns for its whole life, named: weights, KV cache, step inputs,
    /// scratch, logits. A recorded pass touches only these, so they are what an instantiated graph
    /// may rely on (`crate::executable::StableSet`).
    pub fn stable_buffers(&self) -> Vec<(String, Buffer)> {
        let w = &self.weights;
        let mut v = vec![
            ("token_embd".to_string(), w.embed.clone()),
            ("output_norm".into(), w.out_norm.clone()),
        ];
        v.push(("lm_head".into(), w.lm_head.clone()));
        if let Some(f) = &w.rope_freqs {
            v.push(("rope_freqs".into(), f.clone()));
        }
        for (i, l) in w.layers.iter().enumerate() {
            for (n, b) in [
                ("attn_norm", &l.attn_norm),
                ("attn_q", &l.wq),
                ("attn_k", &l.wk),
                ("attn_v", &l.wv),
                ("attn_output", &l.wo),
                ("ffn_norm", &l.ffn_norm),
                ("ffn_gate", &l.w_gate),
                ("ffn_up", &l.w_up),
                ("ffn_down", &l.w_down),
            ] {
                v.push((format!("blk.{i}.{n}"), b.clone()));
            }
        }
        for (i, (k, c)) in self.kv.iter().enumerate() {
            v.push((format!("blk.{i}.k_cache"), k.clone()));
            v.push((format!("blk.{i}.v_cache"), c.clone()));
        }
        let inputs = &self.inputs;
        v.push(("tokens".into(), inputs.tokens.clone()));
        v.push(("positions".into(), inputs.positions.clone()));
        v.push(("step".into(), inputs.step.clone()));
        for (which, sc) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            let bufs = [
                &sc.x, &sc.xn, &sc.q, &sc.k, &sc.v, &sc.attn, &sc.proj, &sc.gate, &sc.up,
                &sc.hidden,
            ];
            let names = [
                "x", "xn", "q", "k", "v", "attn", "proj", "gate", "up", "hidden",
            ];
            for (n, b) in names.iter().zip(bufs) {
                v.push((format!("{which}.{n}"), b.clone()));
            }
            if let Some(p) = &sc.partials {
                v.push((format!("{which}.partials"), p.clone()));
            }
        }
        v.push(("norm_out".into(), self.norm_out.clone()));
        v.push(("logits".into(), self.logits.clone()));
        v.push(("next_token".into(), self.next_token.clone()));
        v
    }

    /// The device buffers holding the per-step values (token ids, positions, first position).
    pub fn step_buffers(&self) -> [&Buffer; 3] {
        [
            &self.inputs.tokens,
            &self.inputs.positions,
            &self.inputs.step,
        ]
    }

    // Accessors for the schedule sanitizer (`crate::sanitize`).

    /// The buffers a pass of `rows` tokens uses as scratch (activations, attention partials, the
    /// final norm): their contents mean nothing between passes.
    pub fn scratch_buffers(&self, rows: usize) -> Vec<Buffer> {
        let sc = if rows == 1 {
            &self.decode
        } else {
            &self.prefill
        };
        let mut v = vec![
            sc.x.clone(),
            sc.xn.clone(),
            sc.q.clone(),
            sc.k.clone(),
            sc.v.clone(),
            sc.attn.clone(),
            sc.proj.clone(),
            sc.gate.clone(),
            sc.up.clone(),
            sc.hidden.clone(),
        ];
        // The attention records only: the counters after them stay zero between passes.
        let params = attention_params(&self.config);
        v.extend(
            sc.partials
                .as_ref()
                .and_then(|p| crate::ops::attention::attention_decode_records(p, params).ok()),
        );
        v.push(self.norm_out.clone());
        v
    }

    /// What a pass of `rows` tokens leaves for its caller, named: its logits, the next token (with
    /// `argmax`) and every layer's K and V cache.
    pub fn output_buffers(
        &self,
        rows: usize,
        logits: Logits,
        argmax: bool,
    ) -> Result<Vec<(String, Buffer)>> {
        let count = if logits == Logits::All { rows } else { 1 };
        let mut out = vec![("logits".to_string(), self.logits.rows(0, count)?)];
        if argmax {
            out.push(("next_token".to_string(), self.next_token.clone()));
        }
        for (i, (k, v)) in self.kv.iter().enumerate() {
            out.push((format!("blk.{i}.k_cache"), k.clone()));
            out.push((format!("blk.{i}.v_cache"), v.clone()));
        }
        Ok(out)
    }
}

fn attention_params(c: &LlamaConfig) -> AttentionParams {
    AttentionParams::new(c.n_head, c.n_kv_head, c.head_dim)
}

impl Scratch {
    fn new(device: &Device, c: &LlamaConfig, rows: usize, partials: Option<usize>) -> Result<Self> {
        let f = |width: usize| device.alloc(DType::F32, &[rows, width]);
        Ok(Scratch {
            rows,
            x: f(c.dim)?,
            xn: f(c.dim)?,
            q: f(c.n_head * c.head_dim)?,
            k: f(c.n_kv_head * c.head_dim)?,
            v: f(c.n_kv_head * c.head_dim)?,
            attn: f(c.n_head * c.head_dim)?,
            proj: f(c.dim)?,
            gate: f(c.ffn_dim)?,
            up: f(c.ffn_dim)?,
            hidden: f(c.ffn_dim)?,
            partials: match partials {
                Some(n) => Some(device.alloc(DType::F32, &[n])?),
                None => None,
            },
        })
    }
}

/// Makes each tensor of `file` a buffer on `device`: a view of the mapped file (no copy) where
/// the backend can use host mappings (the CPU), elsewhere an upload.
struct DeviceTensors<'a> {
    file: &'a GgufFile,
    device: &'a Device,
    mapped: Option<Buffer>,
}

impl<'a> DeviceTensors<'a> {
    fn new(file: &'a GgufFile, device: &'a Device) -> Result<Self> {
        let map = file.mmap().clone();
        let len = map.len();
        let mapped = match device.backend().map_file(map, 0, len)? {
            Some(alloc) => Some(Buffer::whole(
                alloc,
                DType::U8,
                crate::backend::Shape::new(&[len])?,
            )?),
            None => None,
        };
        Ok(DeviceTensors {
            file,
            device,
            mapped,
        })
    }

    fn get(&self, name: &str) -> Result<Buffer> {
        let info = self.file.tensor(name)?;
        let dtype = info.dtype()?;
        let dims = info.dims_row_major();
        match &self.mapped {
            Some(whole) => whole.view(info.file_offset, dtype, &dims),
            None => self
                .device
                .upload_bytes(self.file.tensor_bytes(info)?, dtype, &dims),
        }
    }
}

fn load_weights(file: &GgufFile, device: &Device, c: &LlamaConfig) -> Result<Weights> {
    let mapped = DeviceTensors::new(file, device)?;
    let get = |name: &str, dims: &[usize]| -> Result<Buffer> {
        let t = mapped.get(name)?;
        if t.dims() != dims {
            return Err(file.err(format!(
                "tensor `{name}` has shape {:?}, the configuration needs {dims:?}",
                t.dims()
            )));
        }
        Ok(t)
    };
    let (d, hd) = (c.dim, c.head_dim);
    let mut layers = Vec::with_capacity(c.n_layer);
    for i in 0..c.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        layers.push(LayerWeights {
            attn_norm: get(&n("attn_norm"), &[d])?,
            wq: get(&n("attn_q"), &[c.n_head * hd, d])?,
            wk: get(&n("attn_k"), &[c.n_kv_head * hd, d])?,
            wv: get(&n("attn_v"), &[c.n_kv_head * hd, d])?,
            wo: get(&n("attn_output"), &[d, c.n_head * hd])?,
            ffn_norm: get(&n("ffn_norm"), &[d])?,
            w_gate: get(&n("ffn_gate"), &[c.ffn_dim, d])?,
            w_up: get(&n("ffn_up"), &[c.ffn_dim, d])?,
            w_down: get(&n("ffn_down"), &[d, c.ffn_dim])?,
        });
    }
    let embed = get("token_embd.weight", &[c.vocab, d])?;
    let lm_head = if file.has_tensor("output.weight") {
        get("output.weight", &[c.vocab, d])?
    } else {
        embed.clone()
    };
    let rope_freqs = if file.has_tensor("rope_freqs.weight") {
        Some(get("rope_freqs.weight", &[c.rope_dim / 2])?)
    } else {
        None
    };
    Ok(Weights {
        embed,
        layers,
        out_norm: get("output_norm.weight", &[d])?,
        lm_head,
        rope_freqs,
    })
}
