//! The MLX affine format: a row of `cols` values is cut into groups of `group_size`; each group has
//! a scale and a bias and `x = scale * q + bias` with unsigned `bits`-bit `q`. Quants are packed
//! little-endian into u32 words, lowest bits first (4 bits: 8 values per word; 8 bits: 4).

use crate::error::{Error, Result};

/// The parameters of an affine-quantized matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineParams {
    /// Bits per value: 4 or 8.
    pub bits: u32,
    /// Values per group: 32, 64 or 128.
    pub group_size: usize,
}

impl AffineParams {
    /// Checks the parameters and that `cols` is a whole number of groups.
    pub fn new(bits: u32, group_size: usize) -> Result<Self> {
        if bits != 4 && bits != 8 {
            return Err(Error::InvalidArgument(format!(
                "affine bits must be 4 or 8, got {bits}"
            )));
        }
        if ![32, 64, 128].contains(&group_size) {
            return Err(Error::InvalidArgument(format!(
                "affine group size must be 32, 64 or 128, got {group_size}"
            )));
        }
        Ok(AffineParams { bits, group_size })
    }

    /// Values packed into one u32 word.
    pub const fn per_word(&self) -> usize {
        32 / self.bits as usize
    }

    /// u32 words holding one row of `cols` values.
    pub const fn words_per_row(&self, cols: usize) -> usize {
        cols / self.per_word()
    }

    /// Groups in one row of `cols` values.
    pub const fn groups_per_row(&self, cols: usize) -> usize {
        cols / self.group_size
    }

    fn check_cols(&self, cols: usize) -> Result<()> {
        if cols == 0 || !cols.is_multiple_of(self.group_size) {
            return Err(Error::InvalidArgument(format!(
                "affine rows of {cols} values are not a whole number of groups of {}",
                self.group_size
            )));
        }
        Ok(())
    }
}

/// An affine-quantized `[rows, cols]` matrix on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct AffineMatrix {
    /// The format's parameters.
    pub params: AffineParams,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Packed quants, `[rows, cols * bits / 32]`.
    pub packed: Vec<u32>,
    /// Per-group scales, `[rows, cols / group_size]`.
    pub scales: Vec<f32>,
    /// Per-group biases, `[rows, cols / group_size]`.
    pub biases: Vec<f32>,
}

/// Quantizes a row-major `[rows, cols]` matrix: each group gets `scale = (max - min) / (2^bits - 1)`
/// and `bias = min`, and `q = round((x - bias) / scale)`.
pub fn quantize_affine(values: &[f32], cols: usize, params: AffineParams) -> Result<AffineMatrix> {
    params.check_cols(cols)?;
    if !values.len().is_multiple_of(cols) {
        return Err(Error::InvalidArgument(format!(
            "{} values are not whole rows of {cols}",
            values.len()
        )));
    }
    let rows = values.len() / cols;
    let levels = ((1u32 << params.bits) - 1) as f32;
    let mut packed = vec![0u32; rows * params.words_per_row(cols)];
    let mut scales = Vec::with_capacity(rows * params.groups_per_row(cols));
    let mut biases = Vec::with_capacity(scales.capacity());
    let per_word = params.per_word();
    for (i, group) in values.chunks_exact(params.group_size).enumerate() {
        let min = group.iter().copied().fold(f32::INFINITY, f32::min);
        let max = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let scale = (max - min) / levels;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        scales.push(scale);
        biases.push(min);
        let first = i * params.group_size;
        for (k, &v) in group.iter().enumerate() {
            let q = ((v - min) * inv).round().clamp(0.0, levels) as u32;
            let idx = first + k;
            packed[idx / per_word] |= q << (params.bits as usize * (idx % per_word));
        }
    }
    Ok(AffineMatrix {
        params,
        rows,
        cols,
        packed,
        scales,
        biases,
    })
}

/// Dequantizes one row: `packed` holds the row's words, `scales` and `biases` its groups.
pub fn dequantize_affine_row(
    packed: &[u32],
    scales: &[f32],
    biases: &[f32],
    params: AffineParams,
    out: &mut [f32],
) {
    let per_word = params.per_word();
    let mask = (1u32 << params.bits) - 1;
    for (g, chunk) in out.chunks_mut(params.group_size).enumerate() {
        let (s, b) = (scales[g], biases[g]);
        let first = g * params.group_size;
        for (k, o) in chunk.iter_mut().enumerate() {
            let idx = first + k;
            let q = (packed[idx / per_word] >> (params.bits as usize * (idx % per_word))) & mask;
            *o = s * q as f32 + b;
        }
    }
}

impl AffineMatrix {
    /// All values, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        let wpr = self.params.words_per_row(self.cols);
        let gpr = self.params.groups_per_row(self.cols);
        for (r, row) in out.chunks_mut(self.cols.max(1)).enumerate() {
            dequantize_affine_row(
                &self.packed[r * wpr..(r + 1) * wpr],
                &self.scales[r * gpr..(r + 1) * gpr],
                &self.biases[r * gpr..(r + 1) * gpr],
                self.params,
                row,
            );
        }
        out
    }
}
