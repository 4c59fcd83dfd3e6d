//! The slotted side of [`Transformer`]: a KV cache of several sequences, the per-row inputs of a
//! batched decode step, and its recording (the buffers of batched steps, `record_decode_rows`,
//! the slot and row accessors).

use super::*;

/// The buffers of batched decode steps: scratch for `rows` rows, one single-row decode
/// attention scratch per row, the per-row inputs (one i32 allocation laid out
/// `[tokens[rows], positions[rows], slots[rows]]`, written by one copy per step) and outputs.
pub(super) struct BatchBuffers {
    rows: usize,
    scratch: Scratch,
    partials: Buffer,
    inputs: Buffer,
    tokens: Buffer,
    positions: Buffer,
    slots: Buffer,
    norm_out: Buffer,
    logits: Buffer,
    next_tokens: Buffer,
}

impl BatchBuffers {
    pub(super) fn new(
        device: &Device,
        c: &ModelConfig,
        rows: usize,
        partial_len: usize,
    ) -> Result<Self> {
        let inputs = device.alloc(DType::I32, &[3 * rows])?;
        Ok(BatchBuffers {
            rows,
            scratch: Scratch::new(device, c, rows, None)?,
            partials: device.alloc(DType::F32, &[rows, partial_len])?,
            tokens: inputs.view(0, DType::I32, &[rows])?,
            positions: inputs.view(4 * rows, DType::I32, &[rows])?,
            slots: inputs.view(8 * rows, DType::I32, &[rows])?,
            inputs,
            norm_out: device.alloc(DType::F32, &[rows, c.dim])?,
            logits: device.alloc(DType::F32, &[rows, c.vocab])?,
            next_tokens: device.alloc(DType::I32, &[rows])?,
        })
    }

    /// Every buffer, named.
    pub(super) fn named(&self) -> Vec<(String, Buffer)> {
        let mut v: Vec<(String, Buffer)> = self
            .scratch
            .named()
            .into_iter()
            .map(|(n, b)| (format!("batch.{n}"), b))
            .collect();
        for (n, b) in [
            ("partials", &self.partials),
            ("inputs", &self.inputs),
            ("norm_out", &self.norm_out),
            ("logits", &self.logits),
            ("next_tokens", &self.next_tokens),
        ] {
            v.push((format!("batch.{n}"), b.clone()));
        }
        v
    }
}

impl Transformer {
    /// Records one batched decode step of `rows` rows (1 to the `max_rows` of
    /// [`Transformer::load_slots`]): row `r` feeds token `tokens[r]` at position `positions[r]`
    /// of slot `slots[r]`, as [`Transformer::set_rows`] wrote them. Every row's logits land in
    /// [`Transformer::batch_logits`]; with `argmax`, each row's most likely next token lands in
    /// [`Transformer::batch_next_tokens`].
    ///
    /// Batch invariance: every op of the step computes each row as it would compute it alone
    /// (per-row norms, RoPE and activations; [`Session::matmul_rows`] for the products, never the
    /// plain product whose reduction order follows the row count, nor the fused block kernels;
    /// [`Session::attention_slots`], which runs the one-row decode attention per row), so a row's
    /// logits do not depend on the bucket or on the other rows; on the CPU they are the bits of
    /// the single-sequence decode step over the same cache contents.
    pub fn record_decode_rows(&self, s: &mut Session, rows: usize, argmax: bool) -> Result<()> {
        let b = self.batch()?;
        if rows == 0 || rows > b.rows {
            return Err(Error::InvalidArgument(format!(
                "a batched step takes 1 to {} rows, got {rows}",
                b.rows
            )));
        }
        let positions = b.positions.rows(0, rows)?;
        let slots = b.slots.rows(0, rows)?;
        let partials = b
            .partials
            .rows(0, rows)?
            .reshape(&[b.partials.elems() / b.rows * rows])?;
        let chunk = self.decode_chunk;
        let pass = Pass {
            rows,
            sc: ScratchViews::of(&b.scratch, rows)?,
            tokens: b.tokens.rows(0, rows)?,
            positions: positions.clone(),
            row_invariant: true,
        };
        let mut attend = |s: &mut Session, i: usize, io: &AttentionIo<'_>| {
            let (kc, vc) = &self.kv[i];
            s.kv_write_slots(io.k, kc, &slots, &positions)?;
            s.kv_write_slots(io.v, vc, &slots, &positions)?;
            s.attention_slots(
                io.q, kc, vc, &slots, &positions, &partials, io.out, io.params, chunk,
            )
        };
        let x = self.record_layers(s, &pass, &mut attend)?;
        let normed = b.norm_out.rows(0, rows)?;
        let out = b.logits.rows(0, rows)?;
        self.record_head(s, &x, &normed, &out, true)?;
        if argmax {
            s.argmax(&out, &b.next_tokens.rows(0, rows)?)?;
        }
        pass.sc.mark_scratch(s);
        s.mark_scratch(&normed);
        Ok(())
    }

    /// The K and V caches of `slot` (`[n_kv_head, max_ctx, head_dim]` views), layer by layer.
    pub fn slot_kv(&self, slot: usize) -> Result<Vec<(Buffer, Buffer)>> {
        let cache_slots = self.kv.first().map_or(0, |(k, _)| k.dims()[0]);
        if slot >= cache_slots {
            return Err(Error::InvalidArgument(format!(
                "slot {slot} is outside the cache's {cache_slots} slots"
            )));
        }
        let c = &self.config;
        let dims = [c.n_kv_head, self.max_ctx, c.head_dim];
        let view = |b: &Buffer| {
            let bytes = b.len_bytes() / cache_slots;
            b.view(slot * bytes, b.dtype(), &dims)
        };
        self.kv
            .iter()
            .map(|(k, v)| Ok((view(k)?, view(v)?)))
            .collect()
    }

    /// Sequences the KV cache holds (without the padding slot of batched steps).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The slot the padding rows of a batched step use: the one after the sequences' slots.
    pub fn padding_slot(&self) -> usize {
        self.slots
    }

    /// Most rows of a batched decode step (0 without them).
    pub fn max_rows(&self) -> usize {
        self.batch.as_ref().map_or(0, |b| b.rows)
    }

    fn batch(&self) -> Result<&BatchBuffers> {
        self.batch.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "this model was loaded without batched decode steps (Transformer::load_slots \
                 with max_rows > 0)"
                    .into(),
            )
        })
    }

    /// Writes the per-row inputs of a batched step of `rows` rows (`tokens.len()` live rows, the
    /// rest padding): live row `r` feeds `tokens[r]` at `positions[r]` of slot `slots[r]`; a
    /// padding row feeds token 0 at position 0 of the padding slot. One host-to-device copy.
    /// Checks the values (token in the vocabulary, slot a sequence's, position inside the slot,
    /// no slot and position twice). Several rows of one slot (a prompt's tokens, in position
    /// order) are one sequence's consecutive tokens: each writes its keys and values before any
    /// row attends, so a row sees those of the rows before it.
    pub fn set_rows(
        &self,
        rows: usize,
        tokens: &[u32],
        positions: &[usize],
        slots: &[usize],
    ) -> Result<()> {
        let b = self.batch()?;
        let live = tokens.len();
        if live == 0 || live > rows || rows > b.rows {
            return Err(Error::InvalidArgument(format!(
                "a batched step takes 1 to {} rows, got {live} live rows in a bucket of {rows}",
                b.rows
            )));
        }
        if positions.len() != live || slots.len() != live {
            return Err(Error::InvalidArgument(format!(
                "{live} tokens need as many positions and slots, got {} and {}",
                positions.len(),
                slots.len()
            )));
        }
        let mut words = vec![0i32; 3 * b.rows];
        let mut seen: Vec<(usize, usize)> = Vec::with_capacity(live);
        for r in 0..rows {
            let (t, p, sl) = if r < live {
                (tokens[r], positions[r], slots[r])
            } else {
                (0, 0, self.padding_slot())
            };
            if r < live {
                if t as usize >= self.config.vocab {
                    return Err(Error::InvalidArgument(format!(
                        "row {r}: token id {t} is out of range for a vocabulary of {}",
                        self.config.vocab
                    )));
                }
                if sl >= self.slots {
                    return Err(Error::InvalidArgument(format!(
                        "row {r}: slot {sl} is outside the cache's {} slots",
                        self.slots
                    )));
                }
                if seen.contains(&(sl, p)) {
                    return Err(Error::InvalidArgument(format!(
                        "row {r}: slot {sl} already has a row at position {p} in this step"
                    )));
                }
                seen.push((sl, p));
                if p >= self.max_ctx {
                    return Err(Error::InvalidArgument(format!(
                        "row {r}: position {p} is past the slot's context of {} tokens",
                        self.max_ctx
                    )));
                }
            }
            words[r] = t as i32;
            words[b.rows + r] = p as i32;
            words[2 * b.rows + r] = sl as i32;
        }
        self.device.write(&b.inputs, &words)
    }

    /// The logits of the last batched step: `[rows, vocab]`.
    pub fn batch_logits(&self, rows: usize) -> Result<Buffer> {
        self.batch()?.logits.rows(0, rows)
    }

    /// The next tokens (i32, one per row) a batched step with argmax wrote.
    pub fn batch_next_tokens(&self, rows: usize) -> Result<Buffer> {
        self.batch()?.next_tokens.rows(0, rows)
    }
}
