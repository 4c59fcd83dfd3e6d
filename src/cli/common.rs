//! Flags shared by several commands, and loading a model from them.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use onepass::model::engine::{Engine, RunMode};
use onepass::model::fetch;
use onepass::model::gguf::GgufFile;
use onepass::model::llama::Llama;
use onepass::model::tokenizer::Tokenizer;
use onepass::{Device, Executor, RuntimeConfig};

/// Which model to use.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file, or `smollm2` for the default model (fetched on first use).
    #[arg(long, default_value = "smollm2")]
    pub model: String,
}

/// Which backend runs the work.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// CUDA when a device is present, else the CPU.
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// An NVIDIA GPU (the first one).
    Cuda,
}

/// Backend and optimizer flags.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// CPU threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Execution mode.
    #[arg(long, value_enum, default_value_t = RunMode::Graph)]
    pub mode: RunMode,
    /// Turn off the fusion pass.
    #[arg(long)]
    pub no_fusion: bool,
    /// Turn off the reorder pass.
    #[arg(long)]
    pub no_reorder: bool,
    /// Lookahead window of the reorder pass.
    #[arg(long, default_value_t = onepass::graph::passes::DEFAULT_LOOKAHEAD)]
    pub lookahead: usize,
    /// Submit every pass in one piece instead of splitting it.
    #[arg(long)]
    pub no_split: bool,
    /// KV-cache size in tokens.
    #[arg(long, default_value_t = 2048)]
    pub ctx: usize,
    /// Most prompt tokens per prefill pass.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
}

impl RunArgs {
    /// The runtime configuration these flags choose.
    pub fn config(&self) -> RuntimeConfig {
        RuntimeConfig {
            fusion: !self.no_fusion,
            reorder: !self.no_reorder,
            lookahead: self.lookahead,
            split: !self.no_split,
            threads: self.threads,
        }
    }

    /// The device these flags choose.
    pub fn device(&self) -> anyhow::Result<Device> {
        Ok(match self.backend {
            BackendChoice::Auto => Device::auto(self.threads)?,
            BackendChoice::Cpu => Device::cpu(self.threads)?,
            BackendChoice::Cuda => Device::cuda(0)?,
        })
    }
}

/// The path of the model `spec` names, fetching the default model if needed.
pub fn model_path(spec: &str) -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    Ok(fetch::resolve_model(spec, &cache, true)?)
}

/// The cache directory: `ONEPASS_CACHE_DIR`, else the user's cache directory.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    Ok(fetch::default_cache_dir()?)
}

/// The default model's path when it is already in the cache (nothing is fetched).
pub fn cached_default_model() -> Option<PathBuf> {
    let path = fetch::cached_path(&cache_dir().ok()?, &fetch::SMOLLM2);
    path.is_file().then_some(path)
}

/// Opens a model file.
pub fn open_model(spec: &str) -> anyhow::Result<Arc<GgufFile>> {
    let path = model_path(spec)?;
    Ok(Arc::new(GgufFile::open(&path)?))
}

/// A loaded model with its tokenizer, ready to run.
pub struct Loaded {
    /// The model file.
    pub file: Arc<GgufFile>,
    /// The engine.
    pub engine: Engine,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

/// Loads the model and tokenizer and builds an engine for `run`.
pub fn load(model: &ModelArgs, run: &RunArgs) -> anyhow::Result<Loaded> {
    let file = open_model(&model.model)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let device = run.device()?;
    let llama = Llama::load(file.clone(), &device, run.ctx, run.batch)?;
    let executor = Executor::new(device).with_config(run.config());
    Ok(Loaded {
        file,
        engine: Engine::new(llama, executor, run.mode),
        tokenizer,
    })
}
