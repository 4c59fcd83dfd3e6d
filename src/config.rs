//! One typed runtime configuration, set from CLI flags, and the logging setup.

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
