//! Synthetic models: a GGUF of a known shape (Llama, Gemma 3 or Qwen 3 family) with random
//! weights, for speed work on machines where the real weights cannot go (speed does not depend on
//! weight values) and for tests of the families' forward passes.
//!
//! Weights are uniform in `±sqrt(3 / fan_in)` (unit variance through each product). Llama norm
//! weights are 1; the other families' norm weights are uniform in `[0.75, 1.25]`, so a test can
//! tell which norm went where. Activations stay bounded. Tensors are produced and quantized while the file is written,
//! so even an 8B shape never sits in memory whole.

use std::path::Path;

use rayon::prelude::*;

use crate::backend::DType;
use crate::error::{Error, Result};
use crate::model::arch::Family;
use crate::model::gguf::{Array, GgufFile, Value, ValueType};
use crate::model::gguf_write::GgufWriter;

/// A model shape `synth` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SynthShape {
    /// SmolLM2-135M: 30 layers, hidden 576, 9/3 heads, FFN 1536, vocabulary 49152.
    #[value(name = "smollm2")]
    SmolLm2,
    /// Llama 3.2 1B: 16 layers, hidden 2048, 32/8 heads, FFN 8192, vocabulary 128256.
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    /// Llama 3.1 8B: 32 layers, hidden 4096, 32/8 heads, FFN 14336, vocabulary 128256.
    #[value(name = "llama-3.1-8b")]
    Llama31_8b,
    /// Gemma 3 270M: 18 layers, hidden 640, 4/1 heads of 256, FFN 2048, vocabulary 262144,
    /// sliding window 512 on five of every six layers.
    #[value(name = "gemma3-270m")]
    Gemma3_270m,
    /// Qwen3 0.6B: 28 layers, hidden 1024, 16/8 heads of 128, FFN 3072, vocabulary 151936.
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
}

/// The hyperparameters of a shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeParams {
    /// Name written into `general.name`.
    pub name: &'static str,
    /// The family (`general.architecture`).
    pub family: Family,
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
    /// RoPE base.
    pub rope_base: f32,
    /// Training context.
    pub ctx: usize,
    /// Whether the LM head is the embedding.
    pub tied: bool,
    /// The sliding window of the local layers (Gemma 3).
    pub window: Option<usize>,
}

impl SynthShape {
    /// The shape's hyperparameters.
    pub fn params(self) -> ShapeParams {
        match self {
            SynthShape::SmolLm2 => ShapeParams {
                name: "synthetic SmolLM2-135M",
                family: Family::Llama,
                n_layer: 30,
                dim: 576,
                n_head: 9,
                n_kv_head: 3,
                head_dim: 64,
                ffn_dim: 1536,
                vocab: 49152,
                rope_base: 100000.0,
                ctx: 8192,
                tied: true,
                window: None,
            },
            SynthShape::Llama32_1b => ShapeParams {
                name: "synthetic Llama-3.2-1B",
                family: Family::Llama,
                n_layer: 16,
                dim: 2048,
                n_head: 32,
                n_kv_head: 8,
                head_dim: 64,
                ffn_dim: 8192,
                vocab: 128256,
                rope_base: 500000.0,
                ctx: 131072,
                tied: true,
                window: None,
            },
            SynthShape::Llama31_8b => ShapeParams {
                name: "synthetic Llama-3.1-8B",
                family: Family::Llama,
                n_layer: 32,
                dim: 4096,
                n_head: 32,
                n_kv_head: 8,
                head_dim: 128,
                ffn_dim: 14336,
                vocab: 128256,
                rope_base: 500000.0,
                ctx: 131072,
                tied: false,
                window: None,
            },
            SynthShape::Gemma3_270m => ShapeParams {
                name: "synthetic Gemma-3-270M",
                family: Family::Gemma3,
                n_layer: 18,
                dim: 640,
                n_head: 4,
                n_kv_head: 1,
                head_dim: 256,
                ffn_dim: 2048,
                vocab: 262144,
                rope_base: 1_000_000.0,
                ctx: 32768,
                tied: true,
                window: Some(512),
            },
            SynthShape::Qwen3_0_6b => ShapeParams {
                name: "synthetic Qwen3-0.6B",
                family: Family::Qwen3,
                n_layer: 28,
                dim: 1024,
                n_head: 16,
                n_kv_head: 8,
                head_dim: 128,
                ffn_dim: 3072,
                vocab: 151936,
                rope_base: 1_000_000.0,
                ctx: 40960,
                tied: true,
                window: None,
            },
        }
    }
}

/// The formats of a synthetic model's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixFormats {
    /// One format (Q4_0, Q4_1, Q5_0, Q8_0 or Q4_K) for every matrix; Q4_K falls back to Q4_1
    /// where a row is not whole 256-value super-blocks.
    All(DType),
    /// The mix of a llama.cpp Q4_K_M file: Q4_K, with Q6_K for `attn_v` and `ffn_down` in the
    /// first and last eighth of the layers and every third layer between; rows that are not whole
    /// super-blocks fall back to Q5_0 (for Q4_K) and Q8_0 (for Q6_K), as the converter does. For
    /// the Gemma 3 270M shape this gives exactly the real file's formats.
    Q4KM,
    /// One format for every matrix but the output head, which takes `head` (a shape whose head
    /// is not its embedding).
    WithHead {
        /// The format of every other matrix, as [`MatrixFormats::All`].
        matrices: DType,
        /// The output head's format.
        head: DType,
    },
}

impl From<DType> for MatrixFormats {
    fn from(d: DType) -> Self {
        MatrixFormats::All(d)
    }
}

impl std::fmt::Display for MatrixFormats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MatrixFormats::All(d) => write!(f, "{d}"),
            MatrixFormats::Q4KM => f.write_str("q4_k_m"),
            MatrixFormats::WithHead { matrices, head } => write!(f, "{matrices}, {head} head"),
        }
    }
}

impl MatrixFormats {
    /// The format of matrix `name` (`attn_q`, `ffn_down`, `output`...) of layer `layer` of
    /// `n_layer`, whose rows are `cols` wide.
    pub fn of(self, name: &str, layer: usize, n_layer: usize, cols: usize) -> DType {
        let whole = cols.is_multiple_of(256);
        match self {
            MatrixFormats::WithHead { head, .. } if name == "output" => head,
            MatrixFormats::WithHead { matrices, .. } => {
                MatrixFormats::All(matrices).of(name, layer, n_layer, cols)
            }
            MatrixFormats::All(DType::Q4K) if !whole => DType::Q4_1,
            MatrixFormats::All(d) => d,
            MatrixFormats::Q4KM => {
                let eighth = n_layer / 8;
                // The last clause runs only past the first eighth (`layer >= eighth`).
                let more_bits =
                    layer < eighth || layer >= 7 * n_layer / 8 || (layer - eighth) % 3 == 2;
                let six = name == "output" || (matches!(name, "attn_v" | "ffn_down") && more_bits);
                match (six, whole) {
                    (true, true) => DType::Q6K,
                    (true, false) => DType::Q8_0,
                    (false, true) => DType::Q4K,
                    (false, false) => DType::Q5_0,
                }
            }
        }
    }
}

/// What to write.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    /// The shape.
    pub shape: SynthShape,
    /// The matrices' formats.
    pub quant: MatrixFormats,
    /// Seed of the weights.
    pub seed: u64,
    /// Whether to write Llama 3's RoPE frequency factors (`rope_freqs.weight`; Llama shapes only).
    pub rope_freqs: bool,
    /// Transformer blocks to write in place of the shape's own count (`None`: the shape's): every
    /// matrix keeps the shape's size, so a file of a few layers runs the same kernels at the same
    /// sizes in a fraction of the time (tools that slow every kernel down, such as
    /// compute-sanitizer). At least 1 and at most [`MAX_SYNTH_LAYERS`].
    pub layers: Option<usize>,
}

/// The most transformer blocks [`SynthSpec::layers`] takes.
pub const MAX_SYNTH_LAYERS: usize = 512;

/// Writes the synthetic model to `out` (atomically). `tokenizer_from` supplies the tokenizer
/// metadata (the default model's, padded to the shape's vocabulary); without it a byte-level
/// vocabulary is made. `progress(done, total)` reports bytes written.
pub fn write_synthetic(
    spec: &SynthSpec,
    tokenizer_from: Option<&GgufFile>,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut p = spec.shape.params();
    if let Some(n) = spec.layers {
        if !(1..=MAX_SYNTH_LAYERS).contains(&n) {
            return Err(Error::InvalidArgument(format!(
                "layers: {n} transformer blocks; a synthetic model takes 1 to {MAX_SYNTH_LAYERS}"
            )));
        }
        p.n_layer = n;
    }
    if spec.rope_freqs && p.family != Family::Llama {
        return Err(Error::InvalidArgument(format!(
            "--rope-freqs: {} is not a Llama shape (only Llama 3 files carry rope_freqs)",
            p.name
        )));
    }
    let ff = spec.rope_freqs.then(|| llama3_rope_freqs(&p));
    write_shape(&p, spec.quant, spec.seed, ff, tokenizer_from, out, progress)
}

/// Llama 3's RoPE frequency factors for shape `p` (what llama.cpp writes as `rope_freqs.weight`
/// for Llama 3.1 and 3.2): 1 for wavelengths under 8,192 / 4, 8 over 8,192, the smooth blend
/// between.
fn llama3_rope_freqs(p: &ShapeParams) -> Vec<f32> {
    let (factor, low, high, original) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let hd = p.head_dim as f64;
    (0..p.head_dim / 2)
        .map(|i| {
            let freq = (p.rope_base as f64).powf(-2.0 * i as f64 / hd);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < original / high {
                1.0
            } else if wavelen > original / low {
                factor as f32
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// [`write_synthetic`] for any hyperparameters `p` (tests write small models of each family this
/// way). The head size must be even and the widths whole blocks of `quant`.
pub fn write_synthetic_shape(
    p: &ShapeParams,
    quant: MatrixFormats,
    seed: u64,
    tokenizer_from: Option<&GgufFile>,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    write_shape(p, quant, seed, None, tokenizer_from, out, progress)
}

/// [`write_synthetic_shape`] with RoPE frequency factors `ff` where given.
fn write_shape(
    p: &ShapeParams,
    quant: MatrixFormats,
    seed: u64,
    ff: Option<Vec<f32>>,
    tokenizer_from: Option<&GgufFile>,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    if let MatrixFormats::WithHead { head, .. } = quant {
        check_head(p, head)?;
    }
    if let MatrixFormats::All(dtype)
    | MatrixFormats::WithHead {
        matrices: dtype, ..
    } = quant
    {
        if !matches!(
            dtype,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4K
        ) {
            return Err(Error::InvalidArgument(format!(
                "synth writes q4_0, q4_1, q5_0, q8_0 or q4_k matrices, or the q4_k_m mix, not {}",
                dtype
            )));
        }
    }
    let head_dim = p.head_dim;
    let mut w = GgufWriter::new();
    let arch = p.family.architecture();
    let key = |k: &str| format!("{arch}.{k}");
    w.add_str("general.architecture", arch)?;
    w.add_str("general.name", p.name)?;
    w.add_u32("general.file_type", file_type(quant))?;
    w.add_u32(&key("context_length"), p.ctx as u32)?;
    w.add_u32(&key("embedding_length"), p.dim as u32)?;
    w.add_u32(&key("block_count"), p.n_layer as u32)?;
    w.add_u32(&key("feed_forward_length"), p.ffn_dim as u32)?;
    w.add_u32(&key("rope.dimension_count"), head_dim as u32)?;
    w.add_u32(&key("attention.head_count"), p.n_head as u32)?;
    w.add_u32(&key("attention.head_count_kv"), p.n_kv_head as u32)?;
    w.add_u32(&key("attention.key_length"), head_dim as u32)?;
    w.add_u32(&key("attention.value_length"), head_dim as u32)?;
    let eps = if p.family == Family::Llama {
        1e-5
    } else {
        1e-6
    };
    w.add_f32(&key("attention.layer_norm_rms_epsilon"), eps)?;
    w.add_f32(&key("rope.freq_base"), p.rope_base)?;
    if let Some(window) = p.window {
        w.add_u32(&key("attention.sliding_window"), window as u32)?;
    }
    w.add_u32(&key("vocab_size"), p.vocab as u32)?;
    add_tokenizer(&mut w, tokenizer_from, p.vocab)?;

    let index = std::cell::Cell::new(0u64);
    let next_id = || {
        index.set(index.get() + 1);
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.get()
    };
    let n_layer = p.n_layer;
    let (d, hd, f) = (p.dim, head_dim, p.ffn_dim);
    w.add_tensor_with(
        "token_embd.weight",
        &[p.vocab, d],
        DType::Q8_0,
        random_matrix(next_id(), d, DType::Q8_0, 1.0),
    )?;
    // Llama norms are 1; the other families' are random, so a misplaced norm shows.
    let plain_norms = p.family == Family::Llama;
    let norm = |len: usize| -> crate::model::gguf_write::TensorProducer<'static> {
        if plain_norms {
            ones()
        } else {
            random_norm(next_id(), len)
        }
    };
    for i in 0..p.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor_with(&n("attn_norm"), &[d], DType::F32, norm(d))?;
        if p.family != Family::Llama {
            w.add_tensor_with(&n("attn_q_norm"), &[hd], DType::F32, norm(hd))?;
            w.add_tensor_with(&n("attn_k_norm"), &[hd], DType::F32, norm(hd))?;
        }
        for (name, rows, cols) in [
            ("attn_q", p.n_head * hd, d),
            ("attn_k", p.n_kv_head * hd, d),
            ("attn_v", p.n_kv_head * hd, d),
            ("attn_output", d, p.n_head * hd),
        ] {
            let t = quant.of(name, i, n_layer, cols);
            w.add_tensor_with(
                &n(name),
                &[rows, cols],
                t,
                random_matrix(next_id(), cols, t, fan_in_scale(cols)),
            )?;
        }
        if p.family == Family::Gemma3 {
            w.add_tensor_with(&n("post_attention_norm"), &[d], DType::F32, norm(d))?;
            w.add_tensor_with(&n("post_ffw_norm"), &[d], DType::F32, norm(d))?;
        }
        w.add_tensor_with(&n("ffn_norm"), &[d], DType::F32, norm(d))?;
        for (name, rows, cols) in [("ffn_gate", f, d), ("ffn_up", f, d), ("ffn_down", d, f)] {
            let t = quant.of(name, i, n_layer, cols);
            w.add_tensor_with(
                &n(name),
                &[rows, cols],
                t,
                random_matrix(next_id(), cols, t, fan_in_scale(cols)),
            )?;
        }
    }
    w.add_tensor_with("output_norm.weight", &[d], DType::F32, norm(d))?;
    if let Some(ff) = ff {
        let bytes: Vec<u8> = ff.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor("rope_freqs.weight", &[ff.len()], DType::F32, bytes)?;
    }
    if !p.tied {
        let t = quant.of("output", n_layer, n_layer, d);
        w.add_tensor_with(
            "output.weight",
            &[p.vocab, d],
            t,
            random_matrix(next_id(), d, t, fan_in_scale(d)),
        )?;
    }
    w.write_to(out, progress)
}

/// Refuses an output head format `synth` cannot give shape `p`: a head tied to the embedding, a
/// format other than the GGML block formats (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), or a K format
/// for rows that are not whole 256-value super-blocks.
fn check_head(p: &ShapeParams, head: DType) -> Result<()> {
    if p.tied {
        return Err(Error::InvalidArgument(format!(
            "the output head of the {} shape is its embedding: a head format applies to shapes \
             with their own (llama-3.1-8b)",
            p.name
        )));
    }
    let supported = matches!(
        head,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4K | DType::Q6K
    );
    if !supported || !p.dim.is_multiple_of(head.block_elems()) {
        return Err(Error::InvalidArgument(format!(
            "synth writes q4_0, q4_1, q5_0, q8_0, q4_k or q6_k output heads of whole blocks, \
             not {head} for rows of {} values",
            p.dim
        )));
    }
    Ok(())
}

/// GGML's `general.file_type` code for a model whose matrices are `quant`.
fn file_type(quant: MatrixFormats) -> u32 {
    let (MatrixFormats::All(dtype)
    | MatrixFormats::WithHead {
        matrices: dtype, ..
    }) = quant
    else {
        return 15; // Q4_K_M
    };
    match dtype {
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q8_0 => 7,
        DType::Q5_0 => 8,
        _ => 15, // Q4_K_M
    }
}

fn fan_in_scale(cols: usize) -> f32 {
    (3.0 / cols as f32).sqrt()
}

fn ones<'a>() -> crate::model::gguf_write::TensorProducer<'a> {
    Box::new(|bytes: &mut [u8]| {
        for c in bytes.chunks_exact_mut(4) {
            c.copy_from_slice(&1.0f32.to_le_bytes());
        }
        Ok(())
    })
}

/// A producer of `len` f32 norm weights uniform in `[0.75, 1.25]`.
fn random_norm<'a>(seed: u64, len: usize) -> crate::model::gguf_write::TensorProducer<'a> {
    Box::new(move |bytes: &mut [u8]| {
        let values = uniform_row(seed, len, 0.25);
        for (c, v) in bytes.chunks_exact_mut(4).zip(values) {
            c.copy_from_slice(&(1.0 + v).to_le_bytes());
        }
        Ok(())
    })
}

/// `len` values uniform in `±scale` from the splitmix64 stream of `seed`.
fn uniform_row(seed: u64, len: usize, scale: f32) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
            (unit * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A producer of a `[rows, cols]` matrix of `dtype` with values uniform in `±scale`, each row from
/// its own seeded stream so rows are made in parallel and the file is the same on every run.
fn random_matrix<'a>(
    seed: u64,
    cols: usize,
    dtype: DType,
    scale: f32,
) -> crate::model::gguf_write::TensorProducer<'a> {
    Box::new(move |bytes: &mut [u8]| {
        let row_bytes = dtype.bytes_for(cols).ok_or_else(|| {
            Error::InvalidArgument(format!("{cols} columns are not whole {dtype} blocks"))
        })?;
        bytes
            .par_chunks_mut(row_bytes)
            .enumerate()
            .try_for_each(|(r, out)| {
                let row_seed = seed ^ (r as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
                let values = uniform_row(row_seed, cols, scale);
                let q = crate::quant::quantize(dtype, &values)?;
                out.copy_from_slice(&q);
                Ok(())
            })
    })
}

/// Copies the `tokenizer.*` metadata of `from` (padding the vocabulary to `vocab` entries), or
/// makes a byte-level vocabulary when there is no source.
fn add_tokenizer(w: &mut GgufWriter<'_>, from: Option<&GgufFile>, vocab: usize) -> Result<()> {
    let Some(src) = from else {
        let mut tokens: Vec<String> = vec![
            "<|endoftext|>".into(),
            "<|im_start|>".into(),
            "<|im_end|>".into(),
        ];
        let mut types = vec![3i32, 3, 3];
        for b in 0..=255u32 {
            tokens.push(byte_level_char(b).to_string());
            types.push(1);
        }
        return pad_and_add(w, tokens, types, vocab, Vec::new(), "smollm");
    };
    let strings = |key: &str| -> Result<Vec<String>> {
        match src.get(key).and_then(Value::as_array) {
            Some(a) => Ok(a
                .values
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()),
            None => Err(src.err(format!("tokenizer source lacks `{key}`"))),
        }
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges").unwrap_or_default();
    let types: Vec<i32> = match src
        .get("tokenizer.ggml.token_type")
        .and_then(Value::as_array)
    {
        Some(a) => a
            .values
            .iter()
            .map(|v| v.as_integer().unwrap_or(1) as i32)
            .collect(),
        None => vec![1; tokens.len()],
    };
    if tokens.len() > vocab {
        return Err(Error::InvalidArgument(format!(
            "the tokenizer source has {} tokens, more than the shape's vocabulary of {vocab}",
            tokens.len()
        )));
    }
    for (k, v) in src.metadata() {
        let copied = k.starts_with("tokenizer.")
            && !matches!(
                k.as_str(),
                "tokenizer.ggml.tokens" | "tokenizer.ggml.token_type" | "tokenizer.ggml.merges"
            );
        if copied {
            w.add(k, v.clone())?;
        }
    }
    let pre = src
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("smollm")
        .to_string();
    let has_model = src.get("tokenizer.ggml.model").is_some();
    pad_and_add_arrays(w, tokens, types, vocab, merges)?;
    if !has_model {
        w.add_str("tokenizer.ggml.model", "gpt2")?;
        w.add_str("tokenizer.ggml.pre", &pre)?;
    }
    Ok(())
}

fn pad_and_add(
    w: &mut GgufWriter<'_>,
    tokens: Vec<String>,
    types: Vec<i32>,
    vocab: usize,
    merges: Vec<String>,
    pre: &str,
) -> Result<()> {
    w.add_str("tokenizer.ggml.model", "gpt2")?;
    w.add_str("tokenizer.ggml.pre", pre)?;
    w.add_u32("tokenizer.ggml.bos_token_id", 1)?;
    w.add_u32("tokenizer.ggml.eos_token_id", 2)?;
    w.add_u32("tokenizer.ggml.padding_token_id", 0)?;
    w.add_bool("tokenizer.ggml.add_bos_token", false)?;
    pad_and_add_arrays(w, tokens, types, vocab, merges)
}

fn pad_and_add_arrays(
    w: &mut GgufWriter<'_>,
    mut tokens: Vec<String>,
    mut types: Vec<i32>,
    vocab: usize,
    merges: Vec<String>,
) -> Result<()> {
    types.resize(tokens.len(), 1);
    let mut i = 0;
    while tokens.len() < vocab {
        tokens.push(format!("<|synthetic_{i}|>"));
        types.push(4); // user-defined: never produced by merges, decodes to its text
        i += 1;
    }
    w.add_str_array("tokenizer.ggml.tokens", &tokens)?;
    w.add_i32_array("tokenizer.ggml.token_type", &types)?;
    w.add(
        "tokenizer.ggml.merges",
        Value::Array(Array {
            elem_type: ValueType::String,
            values: merges.into_iter().map(Value::String).collect(),
        }),
    )?;
    Ok(())
}

/// The GPT-2 byte-level character for byte `b`.
fn byte_level_char(b: u32) -> char {
    let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable {
        char::from_u32(b).unwrap_or('?')
    } else {
        // Unprintable bytes map to 256 + their rank among the unprintable bytes.
        let rank = (0..b)
            .filter(|&x| {
                !((33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x))
            })
            .count() as u32;
        char::from_u32(256 + rank).unwrap_or('?')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matrices of every format synth writes: seeded values uniform in `±scale`, quantized
    /// (none all zero, rows distinct), dequantize to values within `scale` plus one
    /// quantization step (Q4_0's and Q5_0's largest value is exact, the others round within a
    /// step of at most `2 * scale / 15`); the file type is GGML's code for the format.
    #[test]
    fn random_matrices_of_every_format_stay_within_their_scale() {
        let (rows, cols, scale) = (3usize, 512usize, 0.25f32);
        for (dtype, ftype) in [
            (DType::Q4_0, 2),
            (DType::Q4_1, 3),
            (DType::Q5_0, 8),
            (DType::Q8_0, 7),
            (DType::Q4K, 15),
        ] {
            let row_bytes = dtype.bytes_for(cols).unwrap();
            let mut bytes = vec![0u8; rows * row_bytes];
            random_matrix(11, cols, dtype, scale)(&mut bytes).unwrap();
            let values = crate::quant::dequantize(dtype, &bytes).unwrap();
            let bound = scale * (1.0 + 2.0 / 15.0);
            assert!(
                values.iter().all(|v| v.abs() <= bound),
                "{dtype}: a value beyond {bound}"
            );
            assert!(values.iter().filter(|v| **v != 0.0).count() > values.len() / 2);
            assert_ne!(
                bytes[..row_bytes],
                bytes[row_bytes..2 * row_bytes],
                "{dtype}"
            );
            assert_eq!(file_type(dtype.into()), ftype, "{dtype}");
        }
    }

    /// The Q4_K_M mix gives the Gemma 3 270M shape exactly the formats of the real file (the
    /// fixture README lists them): Q5_0 for the 640-wide q, k, gate and up, Q8_0 or Q5_0 for
    /// `attn_v` and Q6_K or Q4_K for `ffn_down` by layer, Q4_K for `attn_output`.
    #[test]
    fn the_q4_k_m_mix_matches_the_real_gemma3_file() {
        let m = MatrixFormats::Q4KM;
        let more = [0, 1, 4, 7, 10, 13, 15, 16, 17];
        for l in 0..18 {
            assert_eq!(m.of("attn_q", l, 18, 640), DType::Q5_0);
            assert_eq!(m.of("ffn_gate", l, 18, 640), DType::Q5_0);
            assert_eq!(m.of("attn_output", l, 18, 1024), DType::Q4K);
            let (v, down) = if more.contains(&l) {
                (DType::Q8_0, DType::Q6K)
            } else {
                (DType::Q5_0, DType::Q4K)
            };
            assert_eq!(m.of("attn_v", l, 18, 640), v, "layer {l}");
            assert_eq!(m.of("ffn_down", l, 18, 2048), down, "layer {l}");
        }
        assert_eq!(m.of("output", 32, 32, 4096), DType::Q6K);
        assert_eq!(file_type(m), 15);
    }

    /// A head format of its own changes the output head only; shapes whose head is the embedding,
    /// and formats or widths `synth` cannot write, are refused before anything is written.
    #[test]
    fn a_head_format_of_its_own_sets_the_output_head_only() {
        let m = MatrixFormats::WithHead {
            matrices: DType::Q4K,
            head: DType::Q6K,
        };
        assert_eq!(m.of("output", 32, 32, 4096), DType::Q6K);
        assert_eq!(m.of("attn_q", 3, 32, 4096), DType::Q4K);
        assert_eq!(m.of("ffn_down", 3, 32, 1000), DType::Q4_1);
        assert_eq!(file_type(m), 15);
        assert_eq!(m.to_string(), "q4_k, q6_k head");
        let p8 = SynthShape::Llama31_8b.params();
        check_head(&p8, DType::Q6K).unwrap();
        check_head(&p8, DType::Q8_0).unwrap();
        let tied = check_head(&SynthShape::SmolLm2.params(), DType::Q6K).unwrap_err();
        assert!(tied.to_string().contains("is its embedding"), "{tied}");
        let f16 = check_head(&p8, DType::F16).unwrap_err();
        assert!(f16.to_string().contains("not f16"), "{f16}");
        let narrow = ShapeParams { dim: 640, ..p8 };
        let k = check_head(&narrow, DType::Q6K).unwrap_err();
        assert!(k.to_string().contains("rows of 640 values"), "{k}");
    }

    /// A layer count of its own writes that many blocks of the shape's sizes (block_count, the
    /// tensors of the last block and none past it); 0 and counts past the cap are refused before
    /// a file is made.
    #[test]
    fn a_layer_count_of_its_own_keeps_every_matrix_size() {
        let dir = std::env::temp_dir().join(format!("onepass-synth-layers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("two.gguf");
        let spec = |layers| SynthSpec {
            shape: SynthShape::SmolLm2,
            quant: DType::Q4_0.into(),
            seed: 3,
            rope_freqs: false,
            layers,
        };
        write_synthetic(&spec(Some(2)), None, &out, &mut |_, _| {}).unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        let full = SynthShape::SmolLm2.params();
        let down = f.tensor("blk.1.ffn_down.weight").unwrap();
        assert_eq!(down.dims_row_major(), vec![full.dim, full.ffn_dim]);
        assert!(!f.has_tensor("blk.2.attn_q.weight"));
        for bad in [0, MAX_SYNTH_LAYERS + 1] {
            let never = dir.join(format!("never-{bad}.gguf"));
            let e = write_synthetic(&spec(Some(bad)), None, &never, &mut |_, _| {}).unwrap_err();
            assert!(e.to_string().contains("1 to 512"), "{e}");
            assert!(!never.exists());
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
