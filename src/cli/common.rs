//! Flags shared by several commands, and loading a model from them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use onepass::backend::BackendKind;
use onepass::config::{BackendChoice, RunMode};
use onepass::model::engine::Engine;
use onepass::model::fetch;
use onepass::model::gguf::GgufFile;
use onepass::model::tokenizer::Tokenizer;
use onepass::model::transformer::{KvCache, LoadOptions, Transformer};
use onepass::{Device, Executor, RuntimeConfig};

/// Which model to use.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file, or a known model fetched on first use: `smollm2` (the default) or `gemma3`.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
}

/// Backend and optimizer flags (the [`RuntimeConfig`]), and the model's sizes.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// CPU threads (0: one per core; more than 4 per core are capped).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count)]
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
    #[arg(long, default_value_t = onepass::graph::passes::DEFAULT_LOOKAHEAD,
          allow_negative_numbers = true, value_parser = count)]
    pub lookahead: usize,
    /// Submit every pass in one piece instead of splitting it.
    #[arg(long)]
    pub no_split: bool,
    /// KV-cache size in tokens.
    #[arg(long, default_value_t = 2048, allow_negative_numbers = true, value_parser = count)]
    pub ctx: usize,
    /// Most prompt tokens per prefill pass [default: 512 on the CPU; 4096 on CUDA, or 512 where
    /// the GPU's memory does not hold passes that large]
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub batch: Option<usize>,
    /// KV-cache element type: auto (f16 on CUDA, f32 on the CPU), f32 or f16.
    #[arg(long, default_value = "auto", value_parser = kv_cache)]
    pub kv_cache: KvCache,
}

/// Parses `--kv-cache`.
fn kv_cache(s: &str) -> Result<KvCache, String> {
    KvCache::parse(s).map_err(|e| e.to_string())
}

/// Prompt tokens per prefill pass on the CPU unless `--batch` says otherwise.
pub const CPU_PREFILL_ROWS: usize = 512;
/// Prompt tokens per prefill pass on a GPU unless `--batch` says otherwise: on an H100 a
/// 4096-token prompt in passes of 4096 ran 3.0x (SmolLM2), 1.4x (Llama 3.2 1B) and 1.3x (Llama
/// 3.1 8B) as fast as in passes of 512 (more blocks a product and an attention).
pub const GPU_PREFILL_ROWS: usize = 4096;

/// The prefill pass sizes to try for `--batch` (`batch`) on a backend of `kind`, first choice
/// first: the flag's value; without it [`CPU_PREFILL_ROWS`] on the CPU, and on a GPU
/// [`GPU_PREFILL_ROWS`], then [`CPU_PREFILL_ROWS`] where the scratch and logits of 4096 rows do
/// not fit.
pub fn prefill_rows_to_try(batch: Option<usize>, kind: BackendKind) -> Vec<usize> {
    match (batch, kind) {
        (Some(rows), _) => vec![rows],
        (None, BackendKind::Cpu) => vec![CPU_PREFILL_ROWS],
        (None, BackendKind::Cuda) => vec![GPU_PREFILL_ROWS, CPU_PREFILL_ROWS],
    }
}

/// Loads a model through `load` (given a prefill pass size) with the first of
/// [`prefill_rows_to_try`] that loads, noting each that did not; the last one's error is the
/// error.
pub fn load_with_prefill_rows<T>(
    run: &RunArgs,
    device: &Device,
    load: impl FnMut(usize) -> onepass::Result<T>,
) -> onepass::Result<T> {
    first_that_loads(&prefill_rows_to_try(run.batch, device.kind()), load)
}

fn first_that_loads<T>(
    sizes: &[usize],
    mut load: impl FnMut(usize) -> onepass::Result<T>,
) -> onepass::Result<T> {
    let (last, rest) = sizes.split_last().expect("at least one pass size");
    for &rows in rest {
        match load(rows) {
            Ok(t) => return Ok(t),
            Err(e) => tracing::info!("prompt passes of {rows} tokens did not load ({e})"),
        }
    }
    load(*last)
}

impl RunArgs {
    /// The model's load options: one sequence of `ctx` positions, prefill passes of `rows`
    /// tokens, `--kv-cache`'s type.
    pub fn load_options(&self, ctx: usize, rows: usize) -> LoadOptions {
        LoadOptions::new(ctx, rows).with_kv_cache(self.kv_cache)
    }

    /// The one runtime configuration these flags choose, over what the environment says (the
    /// cache root, the CUDA headers: [`RuntimeConfig::from_env`]). Commands build it once, open
    /// its device ([`RuntimeConfig::open_device`]) before any long work, so that a missing
    /// backend is reported at once, and pass it down.
    pub fn config(&self) -> RuntimeConfig {
        RuntimeConfig {
            backend: self.backend,
            threads: self.threads,
            mode: self.mode,
            fusion: !self.no_fusion,
            reorder: !self.no_reorder,
            lookahead: self.lookahead,
            split: !self.no_split,
            ..RuntimeConfig::from_env()
        }
    }
}

/// Parses a count flag (`-n`, `--top-k`, `--ctx`, ...): a whole number of 0 or more. Negative
/// numbers reach this parser (the flags allow them) so that clap names the flag, instead of
/// taking `-1` for an unknown flag.
pub fn count(s: &str) -> Result<usize, String> {
    if s.trim_start().starts_with('-') {
        return Err("must be 0 or more".into());
    }
    s.trim()
        .parse()
        .map_err(|e| format!("not a whole number ({e})"))
}

/// Parses a seed flag: a whole number from 0 to 2^64-1.
pub fn seed(s: &str) -> Result<u64, String> {
    if s.trim_start().starts_with('-') {
        return Err("must be 0 or more".into());
    }
    s.trim()
        .parse()
        .map_err(|e| format!("not a whole number below 2^64 ({e})"))
}

/// Checks, before any long work, that a file can be written at `path` (given with `flag`): its
/// folder exists and takes new files, and the path is not a folder. Leaves nothing behind.
pub fn check_output_path(flag: &str, path: &Path) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fail = |why: String| anyhow::anyhow!("{flag} {}: {why}", path.display());
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail(format!("{} is not a folder", parent.display()))),
        Err(e) => return Err(fail(format!("folder {}: {e}", parent.display()))),
    }
    if path.is_dir() {
        return Err(fail("is a folder".into()));
    }
    let probe = parent.join(format!(".onepass-write-check.{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(fail(format!(
                "cannot create files in {}: {e}",
                parent.display()
            )))
        }
    }
    if path.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| fail(format!("cannot be overwritten: {e}")))?;
    }
    Ok(())
}

/// The path of the model `spec` names, fetching the default model into the configuration's
/// cache if needed.
pub fn model_path(spec: &str, config: &RuntimeConfig) -> anyhow::Result<PathBuf> {
    let cache = config.cache_root()?;
    Ok(fetch::resolve_model(spec, cache, true)?)
}

/// Writes `bytes` to the file at `path` (given with `flag`), naming the flag and the path on error.
pub fn write_output(flag: &str, path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("{flag} {}", path.display()))
}

/// The default model's path when it is already in the configuration's cache (nothing is
/// fetched).
pub fn cached_default_model(config: &RuntimeConfig) -> Option<PathBuf> {
    let path = fetch::cached_path(config.cache_root().ok()?, &fetch::SMOLLM2);
    path.is_file().then_some(path)
}

/// Opens a model file.
pub fn open_model(spec: &str, config: &RuntimeConfig) -> anyhow::Result<Arc<GgufFile>> {
    let path = model_path(spec, config)?;
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

/// Opens the device `config` asks for, then compiles ahead, on several threads, the kernels it
/// would otherwise compile one by one while the first pass is recorded (a CUDA device's first
/// run, or the first after onepass or NVRTC changed: minutes on one thread), with a progress bar
/// on standard error and a line saying what it did. Nothing to compile: no output.
pub fn open_device(config: &RuntimeConfig) -> anyhow::Result<Device> {
    warm_device(config.open_device()?)
}

/// Compiles ahead the kernels `device` lacks, as [`open_device`] does, and returns it.
pub fn warm_device(device: Device) -> anyhow::Result<Device> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bar = ProgressBar::hidden();
    let report = device.warm_kernels(threads, &|done, total, family| {
        if done == 0 {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} families, {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_length(total as u64);
            bar.set_message(format!("compiling kernels for {}", device.name()));
            bar.enable_steady_tick(std::time::Duration::from_millis(500));
        } else {
            bar.set_position(done as u64);
            tracing::debug!("compiled the {family} kernels ({done} of {total})");
        }
    });
    bar.finish_and_clear();
    let report = report.with_context(|| format!("compiling the kernels of {}", device.name()))?;
    if report.compiled > 0 {
        eprintln!(
            "compiled {} of {} kernel families for {} in {:.1} s on {} threads (cached for later runs)",
            report.compiled,
            report.families,
            device.name(),
            report.seconds,
            report.threads
        );
    }
    Ok(device)
}

/// Loads the model and tokenizer (with `run`'s sizes) and builds an engine that runs as `config`
/// says.
pub fn load(model: &ModelArgs, run: &RunArgs, config: &RuntimeConfig) -> anyhow::Result<Loaded> {
    let file = open_model(&model.model, config)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let device = open_device(config)?;
    let llama = load_with_prefill_rows(run, &device, |rows| {
        Transformer::load_with(file.clone(), &device, &run.load_options(run.ctx, rows))
    })?;
    let mode = config.mode;
    let executor = Executor::new(device).with_config(config.clone());
    Ok(Loaded {
        file,
        engine: Engine::new(llama, executor, mode),
        tokenizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use onepass::{Mode, Plan};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    fn config_of(flags: &[&str]) -> RuntimeConfig {
        let args = std::iter::once("onepass").chain(flags.iter().copied());
        Flags::try_parse_from(args)
            .expect("valid flags")
            .run
            .config()
    }

    #[test]
    fn the_flags_build_one_config_and_it_chooses_the_plan_mode_and_device() {
        let default = config_of(&[]);
        assert_eq!(default.backend, BackendChoice::Auto);
        assert_eq!(default.mode, RunMode::Graph);
        assert_eq!(default.session_mode(), Mode::Recorded);
        assert_eq!(default.plan(), Plan::OPTIMIZED);
        assert_eq!(default.cache_dir, onepass::cache_dir::cache_root().ok());

        let config = config_of(&[
            "--backend",
            "cpu",
            "--threads",
            "3",
            "--mode",
            "direct",
            "--no-fusion",
            "--lookahead",
            "7",
            "--no-split",
        ]);
        assert_eq!(config.session_mode(), Mode::Direct);
        assert_eq!(
            config.plan(),
            Plan {
                fuse: false,
                reorder: Some(7),
                split: false,
                timing: false,
            }
        );
        assert_eq!(config.open_device().unwrap().name(), "cpu (3 threads)");
        let plain = config_of(&["--no-fusion", "--no-reorder", "--no-split"]);
        assert_eq!(plain.plan(), Plan::SEQUENTIAL);
        assert_eq!(
            config_of(&["--mode", "per-op-sync"]).mode,
            RunMode::PerOpSync
        );
    }

    /// The pass size is the flag's where given, else 512 on the CPU and 4096 on a GPU with 512
    /// as its fallback; a size that does not load is passed over for the next, and the last
    /// one's error is the error.
    #[test]
    fn prompt_passes_default_by_backend_and_fall_back_where_they_do_not_load() {
        assert_eq!(prefill_rows_to_try(Some(77), BackendKind::Cuda), [77]);
        assert_eq!(prefill_rows_to_try(None, BackendKind::Cpu), [512]);
        assert_eq!(prefill_rows_to_try(None, BackendKind::Cuda), [4096, 512]);
        let mut tried = Vec::new();
        let got = first_that_loads(&[4096, 512], |rows| {
            tried.push(rows);
            if rows > 1000 {
                Err(onepass::Error::InvalidArgument(format!(
                    "{rows} rows do not fit"
                )))
            } else {
                Ok(rows)
            }
        });
        assert_eq!((got.unwrap(), tried), (512, vec![4096, 512]));
        let err = first_that_loads(&[4096, 512], |rows| {
            Err::<usize, _>(onepass::Error::InvalidArgument(format!(
                "{rows} rows do not fit"
            )))
        });
        assert!(err.unwrap_err().to_string().contains("512 rows"));
        let parsed = Flags::try_parse_from(["t", "--batch", "64"]).unwrap();
        assert_eq!(parsed.run.batch, Some(64));
        assert_eq!(Flags::try_parse_from(["t"]).unwrap().run.batch, None);
    }
}
