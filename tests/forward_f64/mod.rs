//! A float64 forward pass of a GGUF transformer of any supported family, written from the
//! families' definitions and nothing of the crate but its GGUF reader, its dequantizer and the
//! configuration it reads: the reference the skeleton's CPU logits are checked against.
//!
//! Weights are dequantized to f32 (what the format stores) one matrix at a time and every
//! product, norm, rotation and softmax runs in f64.
#![allow(dead_code)]

use onepass::model::arch::{Activation, ModelConfig};
use onepass::model::gguf::GgufFile;
use onepass::ops::rope::RopeMode;

/// A model read for the reference pass.
pub struct Reference<'a> {
    file: &'a GgufFile,
    /// The configuration the crate reads from the file.
    pub cfg: ModelConfig,
}

impl<'a> Reference<'a> {
    /// Reads the configuration of `file`.
    pub fn new(file: &'a GgufFile) -> Self {
        Reference {
            cfg: ModelConfig::from_gguf(file).expect("configuration"),
            file,
        }
    }

    /// The dequantized values of tensor `name`, row-major.
    fn tensor(&self, name: &str) -> Vec<f32> {
        let info = self.file.tensor(name).expect(name);
        let bytes = self.file.tensor_bytes(info).expect(name);
        onepass::quant::dequantize(info.dtype().expect(name), bytes).expect(name)
    }

    fn vector(&self, name: &str) -> Vec<f64> {
        self.tensor(name).into_iter().map(f64::from).collect()
    }

    /// `x @ W^T` for every row of `xs`, `W` the `[out, in]` matrix `name`, dequantized in blocks
    /// of rows so that no more than a few MB of it is in memory at once.
    fn matmul(&self, name: &str, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let info = self.file.tensor(name).expect(name);
        let dims = info.dims_row_major();
        let (rows, cols) = (dims[0], dims[1]);
        let dtype = info.dtype().expect(name);
        let bytes = self.file.tensor_bytes(info).expect(name);
        let row_bytes = bytes.len() / rows;
        let mut out = vec![vec![0.0f64; rows]; xs.len()];
        let block = 1024;
        for start in (0..rows).step_by(block) {
            let end = (start + block).min(rows);
            let w = onepass::quant::dequantize(dtype, &bytes[start * row_bytes..end * row_bytes])
                .expect(name);
            for (x, o) in xs.iter().zip(out.iter_mut()) {
                for r in start..end {
                    let row = &w[(r - start) * cols..(r - start + 1) * cols];
                    o[r] = row.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum();
                }
            }
        }
        out
    }

    fn rms_norm(&self, x: &[f64], w: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + f64::from(self.cfg.norm_eps)).sqrt();
        x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
    }

    /// Rotates every head of `x` (`n` heads) at position `pos` with base `base`.
    fn rope(&self, x: &mut [f64], n: usize, pos: usize, base: f64) {
        let (hd, rot) = (self.cfg.head_dim, self.cfg.rope_dim);
        for h in 0..n {
            let head = &mut x[h * hd..(h + 1) * hd];
            for i in 0..rot / 2 {
                let theta = pos as f64 * base.powf(-2.0 * i as f64 / rot as f64);
                let (sin, cos) = theta.sin_cos();
                let (a, b) = match self.cfg.rope_mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::NeoX => (i, i + rot / 2),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }

    /// The logits of every position of a pass over `tokens` from position 0.
    pub fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let c = &self.cfg;
        let embed_info = self.file.tensor("token_embd.weight").expect("embedding");
        let embed_bytes = self.file.tensor_bytes(embed_info).expect("embedding");
        let embed_dtype = embed_info.dtype().expect("embedding");
        let row_bytes = embed_bytes.len() / c.vocab;
        let scale = c.embed_scale.map_or(1.0, f64::from);
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                let t = t as usize;
                let row = &embed_bytes[t * row_bytes..(t + 1) * row_bytes];
                onepass::quant::dequantize(embed_dtype, row)
                    .expect("embedding row")
                    .into_iter()
                    .map(|v| f64::from(v) * scale)
                    .collect()
            })
            .collect();
        let hd = c.head_dim;
        let group = c.n_head / c.n_kv_head;
        for l in 0..c.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let layer = c.layer_attention(l);
            let attn_norm = self.vector(&n("attn_norm"));
            let h: Vec<Vec<f64>> = x.iter().map(|r| self.rms_norm(r, &attn_norm)).collect();
            let mut q = self.matmul(&n("attn_q"), &h);
            let mut k = self.matmul(&n("attn_k"), &h);
            let v = self.matmul(&n("attn_v"), &h);
            if c.qk_norm {
                let (qn, kn) = (
                    self.vector(&n("attn_q_norm")),
                    self.vector(&n("attn_k_norm")),
                );
                for (rows, w) in [(&mut q, &qn), (&mut k, &kn)] {
                    for r in rows.iter_mut() {
                        for head in r.chunks_mut(hd) {
                            let normed = self.rms_norm(head, w);
                            head.copy_from_slice(&normed);
                        }
                    }
                }
            }
            for (t, (qr, kr)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                self.rope(qr, c.n_head, t, f64::from(layer.rope_base));
                self.rope(kr, c.n_kv_head, t, f64::from(layer.rope_base));
            }
            let mut attn = vec![vec![0.0f64; c.n_head * hd]; tokens.len()];
            for (t, out) in attn.iter_mut().enumerate() {
                let first = layer.window.map_or(0, |w| (t + 1).saturating_sub(w));
                for hq in 0..c.n_head {
                    let kvh = hq / group;
                    let qh = &q[t][hq * hd..(hq + 1) * hd];
                    let scores: Vec<f64> = (first..=t)
                        .map(|j| {
                            let kh = &k[j][kvh * hd..(kvh + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>()
                                * f64::from(c.attn_scale)
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    let o = &mut out[hq * hd..(hq + 1) * hd];
                    for (j, p) in (first..=t).zip(&e) {
                        let vh = &v[j][kvh * hd..(kvh + 1) * hd];
                        for (oo, vv) in o.iter_mut().zip(vh) {
                            *oo += p / sum * vv;
                        }
                    }
                }
            }
            let proj = self.matmul(&n("attn_output"), &attn);
            self.residual(&mut x, proj, c.post_norms.then(|| n("post_attention_norm")));
            let ffn_norm = self.vector(&n("ffn_norm"));
            let h: Vec<Vec<f64>> = x.iter().map(|r| self.rms_norm(r, &ffn_norm)).collect();
            let gate = self.matmul(&n("ffn_gate"), &h);
            let up = self.matmul(&n("ffn_up"), &h);
            let hidden: Vec<Vec<f64>> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| {
                    g.iter()
                        .zip(u)
                        .map(|(&g, &u)| act(c.activation, g) * u)
                        .collect()
                })
                .collect();
            let down = self.matmul(&n("ffn_down"), &hidden);
            self.residual(&mut x, down, c.post_norms.then(|| n("post_ffw_norm")));
        }
        let out_norm = self.vector("output_norm.weight");
        let normed: Vec<Vec<f64>> = x.iter().map(|r| self.rms_norm(r, &out_norm)).collect();
        let head = if self.file.has_tensor("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        self.matmul(head, &normed)
    }

    fn residual(&self, x: &mut [Vec<f64>], out: Vec<Vec<f64>>, post_norm: Option<String>) {
        let w = post_norm.map(|name| self.vector(&name));
        for (xr, o) in x.iter_mut().zip(out) {
            let o = match &w {
                Some(w) => self.rms_norm(&o, w),
                None => o,
            };
            for (a, b) in xr.iter_mut().zip(o) {
                *a += b;
            }
        }
    }
}

fn act(a: Activation, g: f64) -> f64 {
    match a {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g * g * g)).tanh())
        }
    }
}

/// The largest absolute difference between `got` and `want`, and the largest `|want|`.
pub fn max_diff(got: &[f32], want: &[f64]) -> (f64, f64) {
    assert_eq!(got.len(), want.len(), "lengths");
    let diff = got
        .iter()
        .zip(want)
        .map(|(&g, w)| (f64::from(g) - w).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|w| w.abs()).fold(0.0, f64::max);
    (diff, scale)
}
