//! The named side of [`Transformer`]: every buffer it owns, by name (what an instantiated graph
//! may rely on), the step inputs, and the scratch and outputs of a pass (for the schedule
//! sanitizer, `crate::sanitize`).

use super::*;

impl Transformer {
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
            for (n, b) in l.named() {
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
            if let Some((q_raw, k_raw)) = &sc.qk_raw {
                v.push((format!("{which}.q_raw"), q_raw.clone()));
                v.push((format!("{which}.k_raw"), k_raw.clone()));
            }
            if let Some(p) = &sc.partials {
                v.push((format!("{which}.partials"), p.clone()));
            }
        }
        v.push(("norm_out".into(), self.norm_out.clone()));
        v.push(("logits".into(), self.logits.clone()));
        v.push(("next_token".into(), self.next_token.clone()));
        v.extend(self.draw.named());
        if let Some(b) = &self.batch {
            v.extend(b.named());
        }
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
        if let Some((q_raw, k_raw)) = &sc.qk_raw {
            v.push(q_raw.clone());
            v.push(k_raw.clone());
        }
        // The attention records only: the counters after them stay zero between passes.
        let params = self.config.full_attention();
        v.extend(
            sc.partials
                .as_ref()
                .and_then(|p| crate::ops::attention::attention_decode_records(p, params).ok()),
        );
        v.push(self.norm_out.clone());
        v
    }

    /// What a pass of `rows` tokens leaves for its caller, named: its logits, the next token (with
    /// `argmax`; a one-row pass also its advanced step inputs) and every layer's K and V cache.
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
        if argmax && rows == 1 {
            out.push(("step_inputs".to_string(), self.inputs.all.clone()));
        }
        for (i, (k, v)) in self.kv.iter().enumerate() {
            out.push((format!("blk.{i}.k_cache"), k.clone()));
            out.push((format!("blk.{i}.v_cache"), v.clone()));
        }
        Ok(out)
    }
}
