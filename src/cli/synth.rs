//! `onepass synth`: write a GGUF of a known shape with random weights.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use onepass::kernels::WEIGHT_FORMATS;
use onepass::model::gguf::GgufFile;
use onepass::model::synth::{
    write_synthetic, MatrixFormats, SynthShape, SynthSpec, MAX_SYNTH_LAYERS,
};
use onepass::DType;

use super::common::{check_output_path, model_path, seed};

/// The matrix formats `synth` writes.
#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum SynthQuant {
    /// GGML Q4_0.
    #[value(name = "q4_0")]
    Q4_0,
    /// GGML Q4_1 (the default model's format).
    #[value(name = "q4_1")]
    Q4_1,
    /// GGML Q5_0.
    #[value(name = "q5_0")]
    Q5_0,
    /// GGML Q8_0.
    #[value(name = "q8_0")]
    Q8_0,
    /// GGML Q4_K (matrices whose width is not a multiple of 256 fall back to Q4_1).
    #[value(name = "q4_k")]
    Q4K,
    /// The mix of a llama.cpp Q4_K_M file (Q4_K and Q6_K; Q5_0 and Q8_0 where rows are not
    /// whole 256-value super-blocks).
    #[value(name = "q4_k_m")]
    Q4KM,
}

/// Parses `--head`: a block format of the weights (`q4_0`, `q4_1`, `q5_0`, `q8_0`, `q4_k`, `q6_k`)
/// by its name.
pub fn head_format(s: &str) -> Result<DType, String> {
    let formats = WEIGHT_FORMATS.into_iter().filter(|d| d.is_block());
    formats.clone().find(|d| d.name() == s).ok_or_else(|| {
        let names: Vec<&str> = formats.map(|d| d.name()).collect();
        format!("expected one of {}, got {s:?}", names.join(", "))
    })
}

impl SynthQuant {
    /// The matrices' formats, the output head's `head` where given (not with `q4_k_m`, whose
    /// head is Q6_K).
    pub fn formats_with(self, head: Option<DType>) -> anyhow::Result<MatrixFormats> {
        match (self.formats(), head) {
            (f, None) => Ok(f),
            (MatrixFormats::All(matrices), Some(head)) => {
                Ok(MatrixFormats::WithHead { matrices, head })
            }
            (f, Some(_)) => anyhow::bail!("--head: the {f} mix sets its own head format (q6_k)"),
        }
    }

    /// The matrices' formats.
    pub fn formats(self) -> MatrixFormats {
        match self {
            SynthQuant::Q4_0 => DType::Q4_0.into(),
            SynthQuant::Q4_1 => DType::Q4_1.into(),
            SynthQuant::Q5_0 => DType::Q5_0.into(),
            SynthQuant::Q8_0 => DType::Q8_0.into(),
            SynthQuant::Q4K => DType::Q4K.into(),
            SynthQuant::Q4KM => MatrixFormats::Q4KM,
        }
    }
}

/// Flags of `synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// The shape to copy.
    #[arg(long, value_enum)]
    pub like: SynthShape,
    /// Format of the matrices.
    #[arg(long, value_enum, default_value_t = SynthQuant::Q4_1)]
    pub quant: SynthQuant,
    /// Format of the output head, where it differs from the matrices' (q4_0, q4_1, q5_0, q8_0,
    /// q4_k or q6_k; shapes whose head is not their embedding: llama-3.1-8b).
    #[arg(long, value_name = "FORMAT", value_parser = head_format)]
    pub head: Option<DType>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = seed)]
    pub seed: u64,
    /// Where to copy the tokenizer from: a GGUF path or `smollm2`; without it, the default
    /// model's tokenizer is used when it is already in the cache, else a byte-level vocabulary.
    #[arg(long, value_name = "MODEL")]
    pub tokenizer_from: Option<String>,
    /// Write Llama 3's RoPE frequency factors (`rope_freqs.weight`, its scaling of factor 8 over
    /// an original context of 8,192), as llama.cpp's Llama 3.1 and 3.2 files carry them (the Llama
    /// shapes only).
    #[arg(long)]
    pub rope_freqs: bool,
    /// Transformer blocks to write in place of the shape's own count, every matrix at the shape's
    /// size (the same kernels at the same sizes in a fraction of the time, as under
    /// compute-sanitizer); 1 to 512.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=MAX_SYNTH_LAYERS as i64))]
    pub layers: Option<u16>,
    /// Output file.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

/// Runs `synth`.
pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let quant = args.quant.formats_with(args.head)?;
    check_output_path("-o", &args.output)?;
    let config = onepass::RuntimeConfig::from_env();
    let source = match &args.tokenizer_from {
        Some(spec) => Some(GgufFile::open(model_path(spec, &config)?)?),
        None => super::common::cached_default_model(&config).and_then(|p| GgufFile::open(p).ok()),
    };
    if source.is_none() {
        eprintln!("note: the default model is not in the cache; writing a byte-level vocabulary");
    }
    let spec = SynthSpec {
        shape: args.like,
        quant,
        seed: args.seed,
        rope_freqs: args.rope_freqs,
        layers: args.layers.map(usize::from),
    };
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("writing {}", args.output.display()));
    write_synthetic(&spec, source.as_ref(), &args.output, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let size = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    let layers = match args.layers {
        Some(1) => ", 1 layer".to_string(),
        Some(n) => format!(", {n} layers"),
        None => String::new(),
    };
    eprintln!(
        "wrote {} ({:.1} MB, {quant} like {}{layers})",
        args.output.display(),
        size as f64 / 1e6,
        args.like.params().name
    );
    Ok(())
}
