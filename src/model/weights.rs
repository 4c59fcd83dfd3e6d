//! A model's weights as device buffers: zero-copy views of the mapped GGUF where the backend can
//! use host mappings (the CPU), uploads elsewhere; every shape checked against the configuration.

use crate::backend::{Buffer, DType, Device};
use crate::error::Result;
use crate::model::arch::ModelConfig;
use crate::model::gguf::GgufFile;

/// The weights of one block. The optional ones exist where the configuration asks for them.
pub(crate) struct LayerWeights {
    pub attn_norm: Buffer,
    pub wq: Buffer,
    pub wk: Buffer,
    pub wv: Buffer,
    pub wo: Buffer,
    pub ffn_norm: Buffer,
    pub w_gate: Buffer,
    pub w_up: Buffer,
    pub w_down: Buffer,
    /// Per-head query and key norms (`[head_dim]` each).
    pub qk_norm: Option<(Buffer, Buffer)>,
    /// Norms of the attention and feed-forward outputs (`[dim]` each).
    pub post_norms: Option<(Buffer, Buffer)>,
}

impl LayerWeights {
    /// Every weight of the block with its GGUF name (without `blk.N.` and `.weight`).
    pub fn named(&self) -> Vec<(&'static str, &Buffer)> {
        let mut v = vec![
            ("attn_norm", &self.attn_norm),
            ("attn_q", &self.wq),
            ("attn_k", &self.wk),
            ("attn_v", &self.wv),
            ("attn_output", &self.wo),
            ("ffn_norm", &self.ffn_norm),
            ("ffn_gate", &self.w_gate),
            ("ffn_up", &self.w_up),
            ("ffn_down", &self.w_down),
        ];
        if let Some((q, k)) = &self.qk_norm {
            v.push(("attn_q_norm", q));
            v.push(("attn_k_norm", k));
        }
        if let Some((a, f)) = &self.post_norms {
            v.push(("post_attention_norm", a));
            v.push(("post_ffw_norm", f));
        }
        v
    }
}

/// All weights of a model.
pub(crate) struct Weights {
    pub embed: Buffer,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Buffer,
    /// The output head: `output.weight`, or the embedding when the file ties them.
    pub lm_head: Buffer,
    /// Llama 3.1's per-frequency RoPE divisors.
    pub rope_freqs: Option<Buffer>,
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

/// Loads every weight `c` needs from `file` onto `device`.
pub(crate) fn load(file: &GgufFile, device: &Device, c: &ModelConfig) -> Result<Weights> {
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
        let qk_norm = if c.qk_norm {
            Some((
                get(&n("attn_q_norm"), &[hd])?,
                get(&n("attn_k_norm"), &[hd])?,
            ))
        } else {
            None
        };
        let post_norms = if c.post_norms {
            Some((
                get(&n("post_attention_norm"), &[d])?,
                get(&n("post_ffw_norm"), &[d])?,
            ))
        } else {
            None
        };
        layers.push(LayerWeights {
            attn_norm: get(&n("attn_norm"), &[d])?,
            wq: get(&n("attn_q"), &[c.q_width(), d])?,
            wk: get(&n("attn_k"), &[c.kv_width(), d])?,
            wv: get(&n("attn_v"), &[c.kv_width(), d])?,
            wo: get(&n("attn_output"), &[d, c.q_width()])?,
            ffn_norm: get(&n("ffn_norm"), &[d])?,
            w_gate: get(&n("ffn_gate"), &[c.ffn_dim, d])?,
            w_up: get(&n("ffn_up"), &[c.ffn_dim, d])?,
            w_down: get(&n("ffn_down"), &[d, c.ffn_dim])?,
            qk_norm,
            post_norms,
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
