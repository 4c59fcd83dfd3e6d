//! Compiling the kernel families ahead of a run, several at once.
//!
//! Without it, the first run on a GPU (or after onepass or NVRTC changed) compiles each family at
//! the first use of one of its kernels, one after another while the first pass is recorded, and
//! says nothing for minutes. [`KernelCompiler::warm`] compiles the families the cubin cache lacks
//! on several threads, reporting each one done, so that the registry's loads that follow read the
//! cache. NVRTC compiles distinct programs concurrently.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::nvrtc::nvrtc_version;
use super::registry::{KernelCompiler, KernelSource};
use crate::backend::WarmReport;
use crate::error::{Error, Result};

/// The most compiles run at once: each holds NVRTC's working memory (hundreds of MB for the
/// largest family), so a many-core host does not get one a core.
pub const MAX_WARM_THREADS: usize = 8;

impl KernelCompiler {
    /// The families of `sources` whose cubin for this compiler's options is not in the disk cache
    /// (none without a cache: nothing compiled ahead could be kept).
    pub fn missing<'a>(&self, sources: &'a [KernelSource]) -> Result<Vec<&'a KernelSource>> {
        let Some(cache) = self.cache() else {
            return Ok(Vec::new());
        };
        let version = nvrtc_version().ok_or_else(|| {
            Error::Unavailable(
                "libnvrtc not found: install the CUDA NVRTC library (see the README)".into(),
            )
        })?;
        Ok(sources
            .iter()
            .filter(|src| {
                let key = super::cache::cache_key(&src.full_text(), self.options(), version);
                !cache.contains(src.family, &key)
            })
            .collect())
    }

    /// Compiles into the disk cache every family of `sources` it lacks, on up to `threads`
    /// threads (at least 1, at most [`MAX_WARM_THREADS`]). `progress(done, total, family)` is
    /// called with `(0, total, "")` before the first compile when there is any, then after each
    /// family. The first failure is returned once the compiles under way have finished (no new
    /// one starts after it).
    pub fn warm(
        &self,
        sources: &[KernelSource],
        threads: usize,
        progress: &(dyn Fn(usize, usize, &str) + Sync),
    ) -> Result<WarmReport> {
        let start = Instant::now();
        let mut todo = self.missing(sources)?;
        // The longest sources first (the matrix family takes most of the time): the last
        // compile to start is a short one, so the threads finish together.
        todo.sort_by_key(|src| std::cmp::Reverse(src.source.len()));
        let total = todo.len();
        let threads = threads.clamp(1, MAX_WARM_THREADS).min(total.max(1));
        if total == 0 {
            return Ok(WarmReport {
                families: sources.len(),
                compiled: 0,
                threads: 0,
                seconds: 0.0,
            });
        }
        progress(0, total, "");
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(src) = todo.get(i) else { break };
                        match self.cubin(src) {
                            Ok(_) => {
                                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                                progress(d, total, src.family);
                            }
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                if let Ok(mut slot) = first_error.lock() {
                                    slot.get_or_insert(e);
                                }
                            }
                        }
                    }
                });
            }
        });
        let error = first_error
            .into_inner()
            .map_err(|_| Error::Backend("a kernel compile thread panicked".into()))?;
        if let Some(e) = error {
            return Err(e);
        }
        Ok(WarmReport {
            families: sources.len(),
            compiled: total,
            threads,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}
