//! One typed runtime configuration, set from CLI flags, and the logging setup.

use crate::graph::passes::DEFAULT_LOOKAHEAD;
use crate::session::Plan;

/// How onepass runs: optimizer switches and threads. Built once (from CLI flags) and passed down;
/// nothing on a hot path reads the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Fuse dispatches (RMSNorm x multiply, ...).
    pub fusion: bool,
    /// Reorder dispatches for concurrency.
    pub reorder: bool,
    /// Lookahead window of the reorder pass.
    pub lookahead: usize,
    /// Submit the first part of a pass before encoding the rest.
    pub split: bool,
    /// CPU pool threads (0: one per core).
    pub threads: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            fusion: true,
            reorder: true,
            lookahead: DEFAULT_LOOKAHEAD,
            split: true,
            threads: 0,
        }
    }
}

impl RuntimeConfig {
    /// The finish plan these settings choose.
    pub fn plan(&self) -> Plan {
        Plan {
            fuse: self.fusion,
            reorder: self.reorder.then_some(self.lookahead),
            split: self.split,
            timing: false,
        }
    }
}

/// Installs the `tracing` subscriber, with its filter read once from `ONEPASS_LOG`
/// (default `warn`). Calling it twice is harmless.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ONEPASS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
