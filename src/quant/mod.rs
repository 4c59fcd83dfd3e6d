//! Quantized weight formats: GGML block layouts and the MLX affine format, with host
//! quantization and dequantization.
