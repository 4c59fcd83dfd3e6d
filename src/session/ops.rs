//! The op methods of a [`Session`]: each records what an op builder of [`crate::ops`] makes
//! (the builders check the arguments and pick the declared kernel; the session places barriers or
//! records). One block per op family, in the families' order.

mod argmax {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::argmax::*;
    use crate::session::Session;
    impl Session {
        /// Index of the largest value of each row (see [`argmax`]).
        pub fn argmax(&mut self, x: &Buffer, out: &Buffer) -> Result<()> {
            self.push(argmax(x, out)?)
        }

        /// Index of the largest value of one row, kept in `ring` at the step's position, with
        /// `inputs` advanced to the next greedy step (see [`argmax_advance`]).
        pub fn argmax_advance(&mut self, x: &Buffer, ring: &Buffer, inputs: &Buffer) -> Result<()> {
            self.push(argmax_advance(x, ring, inputs)?)
        }
    }
}

mod draw {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::draw::*;
    use crate::session::Session;
    impl Session {
        /// A sampled token of one row, drawn on the device and kept in `ring` at the step's
        /// position, with `inputs` advanced to the next step (see [`draw_advance`]).
        pub fn draw_advance(
            &mut self,
            x: &Buffer,
            ring: &Buffer,
            inputs: &Buffer,
            state: &Buffer,
            window: &Buffer,
            scratch: &Buffer,
        ) -> Result<()> {
            self.push(draw_advance(x, ring, inputs, state, window, scratch)?)
        }

        /// A sampled token for each row of `x`, drawn on the device with that row's state and
        /// window, into `out` (see [`draw_rows`]).
        pub fn draw_rows(
            &mut self,
            x: &Buffer,
            state: &Buffer,
            window: &Buffer,
            scratch: &Buffer,
            out: &Buffer,
        ) -> Result<()> {
            self.push(draw_rows(x, state, window, scratch, out)?)
        }
    }
}

mod attention {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::attention::*;
    use crate::session::Session;
    impl Session {
        /// Prefill attention over the KV cache; see [`attention`].
        pub fn attention(
            &mut self,
            q: &Buffer,
            k_cache: &Buffer,
            v_cache: &Buffer,
            step: &Buffer,
            out: &Buffer,
            params: AttentionParams,
        ) -> Result<()> {
            self.push(attention(q, k_cache, v_cache, step, out, params)?)
        }

        /// Split-KV decode attention for one query row (two dispatches on the CPU, one on CUDA); see
        /// [`attention_decode`].
        #[allow(clippy::too_many_arguments)] // mirrors `attention_decode`
        pub fn attention_decode(
            &mut self,
            q: &Buffer,
            k_cache: &Buffer,
            v_cache: &Buffer,
            step: &Buffer,
            partials: &Buffer,
            out: &Buffer,
            params: AttentionParams,
            chunk_len: usize,
        ) -> Result<()> {
            let single = self.device.capabilities().single_dispatch_decode_attention;
            let dispatches = crate::ops::attention::attention_decode_as(
                q, k_cache, v_cache, step, partials, out, params, chunk_len, single,
            )?;
            for d in dispatches {
                self.push(d)?;
            }
            Ok(())
        }
    }
}

mod batch {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::attention::AttentionParams;
    use crate::ops::attention_slots::attention_slots;
    use crate::ops::kv_slots::kv_write_slots;
    use crate::ops::matmul_rows::matmul_rows;
    use crate::session::Session;
    impl Session {
        /// The product with each row computed as it would be alone (see [`matmul_rows`]).
        pub fn matmul_rows(&mut self, x: &Buffer, w: &Buffer, out: &Buffer) -> Result<()> {
            self.push(matmul_rows(x, w, out)?)
        }

        /// K or V rows written each into its own slot and position (see [`kv_write_slots`]).
        pub fn kv_write_slots(
            &mut self,
            new: &Buffer,
            cache: &Buffer,
            slots: &Buffer,
            positions: &Buffer,
        ) -> Result<()> {
            self.push(kv_write_slots(new, cache, slots, positions)?)
        }

        /// Decode attention of each row over its own slot (see [`attention_slots`]).
        #[allow(clippy::too_many_arguments)] // mirrors `attention_slots`
        pub fn attention_slots(
            &mut self,
            q: &Buffer,
            k_cache: &Buffer,
            v_cache: &Buffer,
            slots: &Buffer,
            positions: &Buffer,
            partials: &Buffer,
            out: &Buffer,
            params: AttentionParams,
            chunk_len: usize,
        ) -> Result<()> {
            self.push(attention_slots(
                q, k_cache, v_cache, slots, positions, partials, out, params, chunk_len,
            )?)
        }
    }
}

mod copy {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::copy::*;
    use crate::session::Session;
    impl Session {
        /// `dst = src`, converting the dtype (see [`copy`]).
        pub fn copy(&mut self, src: &Buffer, dst: &Buffer) -> Result<()> {
            self.push(copy(src, dst)?)
        }
    }
}

mod custom {
    use crate::error::Result;
    use crate::graph::{Arg, Grid};
    use crate::ops::custom::*;
    use crate::session::Session;
    impl Session {
        /// Dispatches a user kernel with `args` (each buffer's access declared through
        /// [`Arg::read`], [`Arg::write`] or [`Arg::read_write`]) over `grid`. The first call
        /// registers the kernel with the session's device.
        pub fn custom(&mut self, kernel: &CustomKernel, args: Vec<Arg>, grid: Grid) -> Result<()> {
            let dispatch = custom(kernel, args, grid)?;
            register(self.device(), kernel)?;
            self.push(dispatch)
        }
    }
}

mod elementwise {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::elementwise::*;
    use crate::session::Session;
    impl Session {
        /// `out = a + b` (see [`add`]).
        pub fn add(&mut self, a: &Buffer, b: &Buffer, out: &Buffer) -> Result<()> {
            self.push(add(a, b, out)?)
        }

        /// `acc += b` in place (`b` full or one broadcast row).
        pub fn add_inplace(&mut self, acc: &Buffer, b: &Buffer) -> Result<()> {
            self.push(add(acc, b, acc)?)
        }

        /// `out = a * b` (see [`mul`]).
        pub fn mul(&mut self, a: &Buffer, b: &Buffer, out: &Buffer) -> Result<()> {
            self.push(mul(a, b, out)?)
        }

        /// `acc *= b` in place (`b` full or one broadcast row).
        pub fn mul_inplace(&mut self, acc: &Buffer, b: &Buffer) -> Result<()> {
            self.push(mul(acc, b, acc)?)
        }

        /// `out = silu(gate) * up` (see [`swiglu`]).
        pub fn swiglu(&mut self, gate: &Buffer, up: &Buffer, out: &Buffer) -> Result<()> {
            self.push(swiglu(gate, up, out)?)
        }

        /// `out = gelu_tanh(gate) * up` (see [`geglu`]).
        pub fn geglu(&mut self, gate: &Buffer, up: &Buffer, out: &Buffer) -> Result<()> {
            self.push(geglu(gate, up, out)?)
        }

        /// `out = x * s` (see [`scale`]).
        pub fn scale(&mut self, x: &Buffer, s: f32, out: &Buffer) -> Result<()> {
            self.push(scale(x, s, out)?)
        }

        /// GELU, tanh approximation (see [`gelu_tanh`]).
        pub fn gelu_tanh(&mut self, x: &Buffer, out: &Buffer) -> Result<()> {
            self.push(gelu_tanh(x, out)?)
        }

        /// GELU, erf form (see [`gelu_erf`]).
        pub fn gelu_erf(&mut self, x: &Buffer, out: &Buffer) -> Result<()> {
            self.push(gelu_erf(x, out)?)
        }

        /// SiLU (see [`silu`]).
        pub fn silu(&mut self, x: &Buffer, out: &Buffer) -> Result<()> {
            self.push(silu(x, out)?)
        }

        /// `out = cap * tanh(x / cap)` (see [`softcap`]).
        pub fn softcap(&mut self, x: &Buffer, cap: f32, out: &Buffer) -> Result<()> {
            self.push(softcap(x, cap, out)?)
        }
    }
}

mod embedding {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::embedding::*;
    use crate::session::Session;
    impl Session {
        /// Pushes [`embedding`]: `out[r, :] = table[ids[r], :]` as f32.
        pub fn embedding(&mut self, table: &Buffer, ids: &Buffer, out: &Buffer) -> Result<()> {
            self.push(embedding(table, ids, out)?)
        }
    }
}

mod fused_block {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::fused_block::*;
    use crate::session::Session;
    impl Session {
        /// The fused attention input of a block; see [`norm_qkv_rope`].
        pub fn norm_qkv_rope(&mut self, p: &QkvRope<'_>) -> Result<()> {
            self.push(norm_qkv_rope(p)?)
        }

        /// The fused norm and q, k and v products of a block, without the RoPE; see
        /// [`norm_qkv`](crate::ops::norm_qkv::norm_qkv).
        pub fn norm_qkv(&mut self, p: &crate::ops::norm_qkv::Qkv<'_>) -> Result<()> {
            self.push(crate::ops::norm_qkv::norm_qkv(p)?)
        }

        /// The query and key norms with their RoPE and the KV cache writes in one dispatch; see
        /// [`rms_norm_rope_kv`](crate::ops::norm_rope_kv::rms_norm_rope_kv).
        pub fn rms_norm_rope_kv(
            &mut self,
            p: &crate::ops::norm_rope_kv::NormRopeKv<'_>,
        ) -> Result<()> {
            self.push(crate::ops::norm_rope_kv::rms_norm_rope_kv(p)?)
        }

        /// The fused MLP input of a block, SwiGLU or GeGLU; see [`norm_gate_up`].
        #[allow(clippy::too_many_arguments)] // mirrors `norm_gate_up`
        pub fn norm_gate_up(
            &mut self,
            x: &Buffer,
            norm: &Buffer,
            eps: f32,
            w_gate: &Buffer,
            w_up: &Buffer,
            hidden: &Buffer,
            act: GateActivation,
        ) -> Result<()> {
            self.push(norm_gate_up(x, norm, eps, w_gate, w_up, hidden, act)?)
        }
    }
}

mod kv_cache {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::kv_cache::*;
    use crate::session::Session;
    impl Session {
        /// Writes new K or V rows into a cache at `pos0 = step[0]` (see [`kv_write`]).
        pub fn kv_write(&mut self, new: &Buffer, cache: &Buffer, step: &Buffer) -> Result<()> {
            self.push(kv_write(new, cache, step)?)
        }
    }
}

mod matmul {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::matmul::*;
    use crate::session::Session;
    impl Session {
        /// Pushes [`matmul`]: `out = x · wᵀ`.
        pub fn matmul(&mut self, x: &Buffer, w: &Buffer, out: &Buffer) -> Result<()> {
            self.push(matmul(x, w, out)?)
        }

        /// Pushes [`matmul_f32_activations`]: [`matmul`] with x never rounded to int8.
        pub fn matmul_f32_activations(
            &mut self,
            x: &Buffer,
            w: &Buffer,
            out: &Buffer,
        ) -> Result<()> {
            self.push(matmul_f32_activations(x, w, out)?)
        }

        /// Pushes [`matmul_affine`]: the MLX affine product.
        #[allow(clippy::too_many_arguments)]
        pub fn matmul_affine(
            &mut self,
            x: &Buffer,
            w: &Buffer,
            scales: &Buffer,
            biases: &Buffer,
            bits: u32,
            group_size: usize,
            out: &Buffer,
        ) -> Result<()> {
            self.push(matmul_affine(x, w, scales, biases, bits, group_size, out)?)
        }

        /// Pushes [`matmul_id`]: the expert-routed product.
        pub fn matmul_id(
            &mut self,
            x: &Buffer,
            w: &Buffer,
            ids: &Buffer,
            out: &Buffer,
        ) -> Result<()> {
            self.push(matmul_id(x, w, ids, out)?)
        }
    }
}

mod norm {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::norm::*;
    use crate::session::Session;
    impl Session {
        /// RMS normalization with a weight (see [`rms_norm`]).
        pub fn rms_norm(
            &mut self,
            x: &Buffer,
            weight: &Buffer,
            out: &Buffer,
            eps: f32,
        ) -> Result<()> {
            self.push(rms_norm(x, weight, out, eps)?)
        }

        /// RMS normalization without a weight (see [`rms_norm_no_scale`]).
        pub fn rms_norm_no_scale(&mut self, x: &Buffer, out: &Buffer, eps: f32) -> Result<()> {
            self.push(rms_norm_no_scale(x, out, eps)?)
        }

        /// RMS normalization times `m`, fused (see [`rms_norm_mul`]).
        pub fn rms_norm_mul(
            &mut self,
            x: &Buffer,
            weight: Option<&Buffer>,
            m: &Buffer,
            out: &Buffer,
            eps: f32,
        ) -> Result<()> {
            self.push(rms_norm_mul(x, weight, m, out, eps)?)
        }

        /// RMS normalization added into `acc` in place, fused (see [`rms_norm_add`]).
        pub fn rms_norm_add(
            &mut self,
            x: &Buffer,
            weight: &Buffer,
            acc: &Buffer,
            eps: f32,
        ) -> Result<()> {
            self.push(rms_norm_add(x, weight, acc, eps)?)
        }
    }
}

mod rope {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::rope::*;
    use crate::session::Session;
    impl Session {
        /// Rotary position embedding (see [`rope`]); `out` may be `x` itself.
        pub fn rope(
            &mut self,
            x: &Buffer,
            positions: &Buffer,
            out: &Buffer,
            params: &RopeParams<'_>,
        ) -> Result<()> {
            self.push(rope(x, positions, out, params)?)
        }

        /// Per-head RMS norm and RoPE in one dispatch (see
        /// [`rms_norm_rope`](crate::ops::norm_rope::rms_norm_rope)); `out` may not alias `x`.
        pub fn rms_norm_rope(
            &mut self,
            x: &Buffer,
            weight: &Buffer,
            positions: &Buffer,
            out: &Buffer,
            eps: f32,
            params: &RopeParams<'_>,
        ) -> Result<()> {
            self.push(crate::ops::norm_rope::rms_norm_rope(
                x, weight, positions, out, eps, params,
            )?)
        }
    }
}

mod softmax {
    use crate::backend::Buffer;
    use crate::error::Result;
    use crate::ops::softmax::*;
    use crate::session::Session;
    impl Session {
        /// Softmax over rows with a scale and an optional additive mask (see [`softmax`]).
        pub fn softmax(
            &mut self,
            x: &Buffer,
            out: &Buffer,
            scale: f32,
            mask: Option<&Buffer>,
        ) -> Result<()> {
            self.push(softmax(x, out, scale, mask)?)
        }
    }
}
