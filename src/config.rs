//! One typed runtime configuration, built once (by the CLI from its flags) and passed down: the
//! backend and its threads, the run mode, the optimizer plan, the cache root and the CUDA
//! compiler settings. [`Mode`] and [`Plan`], the arguments of the session API, are derived from
//! it. Also the logging setup.

use std::path::{Path, PathBuf};

use crate::backend::cuda::{self, CudaOptions};
use crate::backend::Device;
use crate::cache_dir;
use crate::error::Result;
use crate::graph::passes::{self, DEFAULT_LOOKAHEAD};

/// How a session treats its dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Encode every dispatch at once, with a barrier only where it conflicts with the current
    /// concurrent group.
    Direct,
    /// Record the dispatches into a [`ComputeGraph`](crate::graph::ComputeGraph); optimize and run it at `finish`.
    Recorded,
}

/// What `finish` does with a session's work. Fusion and reordering apply to recorded sessions;
/// a direct session has already encoded its dispatches in program order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Run the fusion pass.
    pub fuse: bool,
    /// Run the reorder pass with this lookahead window.
    pub reorder: Option<usize>,
    /// Submit the first `max(64, n/10)` dispatches before encoding the rest.
    pub split: bool,
    /// Measure encode and wait times.
    pub timing: bool,
}

impl Plan {
    /// No optimization: dispatches in program order, one submission.
    pub const SEQUENTIAL: Plan = Plan {
        fuse: false,
        reorder: None,
        split: false,
        timing: false,
    };
    /// Every optimization with the default lookahead.
    pub const OPTIMIZED: Plan = Plan {
        fuse: true,
        reorder: Some(passes::DEFAULT_LOOKAHEAD),
        split: true,
        timing: false,
    };
}

/// Which backend runs the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// CUDA when a device is present, else the CPU.
    #[default]
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// An NVIDIA GPU (the first one).
    Cuda,
}

/// How passes are executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunMode {
    /// Every pass in a direct session: dispatches encoded as they come, barriers from ranges.
    Direct,
    /// Every pass recorded, optimized (fusion, reorder) and then run.
    Recorded,
    /// The decode step recorded and optimized once, instantiated (a CUDA graph with dependency
    /// edges, or a precomputed CPU schedule) and launched for every step.
    #[default]
    Graph,
    /// For comparison: every dispatch in its own submission, waited for before the next (CUDA:
    /// a direct session whose encoder synchronizes after every launch; CPU: one submission per
    /// dispatch, in program order).
    PerOpSync,
}

impl RunMode {
    /// The mode's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            RunMode::Direct => "direct",
            RunMode::Recorded => "recorded",
            RunMode::Graph => "graph",
            RunMode::PerOpSync => "per-op-sync",
        }
    }

    /// The session mode a pass of this run mode begins: direct for [`RunMode::Direct`], recorded
    /// for the others (a per-op-sync pass on the CPU is recorded, then submitted one dispatch at
    /// a time; on CUDA the engine runs it as a direct session that waits after every launch).
    pub fn session_mode(self) -> Mode {
        match self {
            RunMode::Direct => Mode::Direct,
            RunMode::Recorded | RunMode::Graph | RunMode::PerOpSync => Mode::Recorded,
        }
    }
}

/// How onepass runs: the backend and its threads, the run mode, the optimizer switches, the cache
/// root and the CUDA compiler settings. Built once (from CLI flags, over [`RuntimeConfig::from_env`])
/// and passed down; nothing on a hot path reads the environment.
///
/// [`RuntimeConfig::default`] reads nothing: no cache, headers found by nobody, the optimized
/// plan, graph mode, automatic backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// The backend [`RuntimeConfig::open_device`] opens.
    pub backend: BackendChoice,
    /// CPU pool threads (0: one per core; more than 4 per core are capped).
    pub threads: usize,
    /// How passes are executed.
    pub mode: RunMode,
    /// Fuse dispatches (RMSNorm x multiply, ...).
    pub fusion: bool,
    /// Reorder dispatches for concurrency.
    pub reorder: bool,
    /// Lookahead window of the reorder pass.
    pub lookahead: usize,
    /// Submit the first part of a pass before encoding the rest.
    pub split: bool,
    /// The cache root, for the model files (`models/`) and the compiled CUDA kernels (`kernels/`)
    /// alike; `None`: nothing is cached (kernels compile on every run, a model must be a path).
    pub cache_dir: Option<PathBuf>,
    /// Directory of the CUDA headers (`cuda_fp16.h`) for NVRTC.
    pub cuda_include: Option<PathBuf>,
    /// Architecture NVRTC compiles for (`sm_90`); `None` asks the device.
    pub cuda_arch: Option<String>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            backend: BackendChoice::Auto,
            threads: 0,
            mode: RunMode::Graph,
            fusion: true,
            reorder: true,
            lookahead: DEFAULT_LOOKAHEAD,
            split: true,
            cache_dir: None,
            cuda_include: None,
            cuda_arch: None,
        }
    }
}

impl RuntimeConfig {
    /// The defaults with what the environment says, read once: the cache root
    /// (`$ONEPASS_CACHE_DIR`, else the user's cache directory; see [`cache_dir::cache_root`]) and
    /// the CUDA headers (`$ONEPASS_CUDA_INCLUDE` or the toolkit's; see
    /// [`cuda::include_dir_from_env`]).
    pub fn from_env() -> Self {
        RuntimeConfig {
            cache_dir: cache_dir::cache_root().ok(),
            cuda_include: cuda::include_dir_from_env(),
            ..RuntimeConfig::default()
        }
    }

    /// The finish plan these settings choose for a recorded pass.
    pub fn plan(&self) -> Plan {
        Plan {
            fuse: self.fusion,
            reorder: self.reorder.then_some(self.lookahead),
            split: self.split,
            timing: false,
        }
    }

    /// The session mode a pass of the configured run mode begins ([`RunMode::session_mode`]).
    pub fn session_mode(&self) -> Mode {
        self.mode.session_mode()
    }

    /// The cache root, or the error that says how to set one.
    pub fn cache_root(&self) -> Result<&Path> {
        self.cache_dir
            .as_deref()
            .ok_or_else(cache_dir::no_cache_root)
    }

    /// Where compiled CUDA kernels are cached: `kernels` under the cache root, when there is one.
    pub fn kernel_cache_dir(&self) -> Option<PathBuf> {
        self.cache_dir.as_deref().map(cache_dir::kernel_cache_dir)
    }

    /// The settings of a CUDA device this configuration opens.
    pub fn cuda_options(&self) -> CudaOptions {
        CudaOptions {
            include_dir: self.cuda_include.clone(),
            cache_dir: self.kernel_cache_dir(),
            arch: self.cuda_arch.clone(),
            block_stamps: false,
        }
    }

    /// Opens the device the configuration asks for: the CPU with [`RuntimeConfig::threads`]
    /// threads, CUDA device 0 with [`RuntimeConfig::cuda_options`], or (auto) CUDA device 0 when
    /// a driver and a device are present and it opens, else the CPU.
    pub fn open_device(&self) -> Result<Device> {
        match self.backend {
            BackendChoice::Cpu => Device::cpu(self.threads),
            BackendChoice::Cuda => Device::cuda_with(0, &self.cuda_options()),
            BackendChoice::Auto => {
                if cuda::driver_present() && cuda::device_count().unwrap_or(0) > 0 {
                    if let Ok(d) = Device::cuda_with(0, &self.cuda_options()) {
                        return Ok(d);
                    }
                }
                Device::cpu(self.threads)
            }
        }
    }
}

/// The environment variable that holds the log filter.
pub const LOG_ENV: &str = "ONEPASS_LOG";

/// The filter a log setting chooses: the setting when it parses, else `warn`, with the line that
/// says why the setting was ignored.
pub fn log_filter(setting: Option<&str>) -> (tracing_subscriber::EnvFilter, Option<String>) {
    let default = || tracing_subscriber::EnvFilter::new("warn");
    match setting.map(str::trim).filter(|s| !s.is_empty()) {
        None => (default(), None),
        Some(s) => match tracing_subscriber::EnvFilter::try_new(s) {
            Ok(f) => (f, None),
            Err(e) => (
                default(),
                Some(format!(
                    "warning: {LOG_ENV}={s:?} is not a valid log filter ({e}); logging at `warn`"
                )),
            ),
        },
    }
}

/// Installs the `tracing` subscriber on standard error, with its filter read once from
/// `ONEPASS_LOG` (default `warn`; an invalid filter is reported on one line and replaced by the
/// default) and colours only when standard error is a terminal. Calling it twice is harmless.
pub fn init_logging() {
    use std::io::IsTerminal;
    let setting = std::env::var(LOG_ENV).ok();
    let (filter, complaint) = log_filter(setting.as_deref());
    if let Some(line) = complaint {
        eprintln!("{line}");
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_mode_chooses_the_session_mode_and_the_switches_the_plan() {
        let config = RuntimeConfig::default();
        assert_eq!(config.plan(), Plan::OPTIMIZED);
        assert_eq!(config.mode, RunMode::Graph);
        assert_eq!(config.session_mode(), Mode::Recorded);
        let direct = RuntimeConfig {
            mode: RunMode::Direct,
            ..RuntimeConfig::default()
        };
        assert_eq!(direct.session_mode(), Mode::Direct);
        for mode in [RunMode::Recorded, RunMode::Graph, RunMode::PerOpSync] {
            assert_eq!(mode.session_mode(), Mode::Recorded, "{}", mode.name());
        }
        let plain = RuntimeConfig {
            fusion: false,
            reorder: false,
            split: false,
            ..RuntimeConfig::default()
        };
        assert_eq!(plain.plan(), Plan::SEQUENTIAL);
        let narrow = RuntimeConfig {
            lookahead: 3,
            ..RuntimeConfig::default()
        };
        assert_eq!(narrow.plan().reorder, Some(3));
    }

    #[test]
    fn the_cpu_device_gets_the_configured_threads() {
        let config = RuntimeConfig {
            backend: BackendChoice::Cpu,
            threads: 3,
            ..RuntimeConfig::default()
        };
        assert_eq!(config.open_device().unwrap().name(), "cpu (3 threads)");
        if !cuda::driver_present() {
            let auto = RuntimeConfig {
                backend: BackendChoice::Auto,
                ..config.clone()
            };
            assert_eq!(auto.open_device().unwrap().name(), "cpu (3 threads)");
            let gpu = RuntimeConfig {
                backend: BackendChoice::Cuda,
                ..config
            };
            let err = gpu.open_device().expect_err("no CUDA driver");
            assert!(matches!(err, crate::Error::Unavailable(_)), "{err}");
        }
    }

    #[test]
    fn the_kernel_cache_lives_under_the_one_cache_root() {
        let root = cache_dir::cache_root_from(Some("/elsewhere/cache".into()), None).unwrap();
        let config = RuntimeConfig {
            cache_dir: Some(root),
            cuda_include: Some("/opt/cuda/include".into()),
            cuda_arch: Some("sm_80".into()),
            ..RuntimeConfig::default()
        };
        assert_eq!(config.cache_root().unwrap(), Path::new("/elsewhere/cache"));
        let options = config.cuda_options();
        assert_eq!(
            options.cache_dir.as_deref(),
            Some(Path::new("/elsewhere/cache/kernels"))
        );
        assert_eq!(
            options.include_dir.as_deref(),
            Some(Path::new("/opt/cuda/include"))
        );
        assert_eq!(options.arch.as_deref(), Some("sm_80"));

        let uncached = RuntimeConfig::default();
        assert_eq!(uncached.cuda_options().cache_dir, None);
        let err = uncached.cache_root().unwrap_err().to_string();
        assert!(err.contains(cache_dir::CACHE_DIR_ENV), "{err}");

        // Read from the environment, the configuration agrees with what `Device::cuda` uses.
        let env = RuntimeConfig::from_env();
        assert_eq!(env.cache_dir, cache_dir::cache_root().ok());
        assert_eq!(env.cuda_options(), CudaOptions::from_env());
    }

    #[test]
    fn invalid_log_filters_are_named_and_valid_ones_kept() {
        assert!(log_filter(None).1.is_none());
        assert!(log_filter(Some("")).1.is_none());
        let (f, none) = log_filter(Some("onepass=debug"));
        assert!(none.is_none());
        assert!(f.to_string().contains("debug"), "{f}");
        let (f, line) = log_filter(Some("onepass=lots"));
        let line = line.expect("a complaint");
        assert!(
            line.contains("ONEPASS_LOG") && line.contains("onepass=lots"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert_eq!(f.to_string(), "warn");
    }
}
