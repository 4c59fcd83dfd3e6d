//! Compiling the kernel families ahead of a run, several at once.
//!
//! Without it, the first run on a GPU (or after onepass or NVRTC changed) compiles each family at
//! the first use of one of its kernels, one after another while the first pass is recorded, and
//! says nothing for minutes. [`KernelCompiler::warm`] compiles the families the cubin cache lacks
//! on several threads, reporting each one done, so that the registry's loads that follow read the
//! cache; [`KernelCompiler::compile_all`] is the doctor's check of every family, on threads too.
//! NVRTC compiles distinct programs concurrently.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::nvrtc::nvrtc_version;
use super::registry::{KernelCompiler, KernelSource};
use crate::backend::WarmReport;
use crate::error::{Error, Result};

/// The most compiles run at once: each holds NVRTC's working memory (hundreds of MB for the
/// largest family), so a many-core host does not get one a core.
pub const MAX_WARM_THREADS: usize = 8;

/// `f` of every source, computed on up to `threads` threads (1 to [`MAX_WARM_THREADS`]), the
/// longest sources started first (the matrix family takes most of the time, so the threads
/// finish together); the results in the order of `sources`.
fn on_threads<R: Send>(
    sources: &[&KernelSource],
    threads: usize,
    f: &(dyn Fn(&KernelSource) -> R + Sync),
) -> Vec<R> {
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sources[i].source.len()));
    let threads = threads.clamp(1, MAX_WARM_THREADS).min(sources.len().max(1));
    let next = AtomicUsize::new(0);
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        mine.push((i, f(sources[i])));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.sort_by_key(|r| r.0);
    results.into_iter().map(|r| r.1).collect()
}

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
    /// family that compiled. Every family is tried; the first failure (in the order of `sources`)
    /// is returned.
    pub fn warm(
        &self,
        sources: &[KernelSource],
        threads: usize,
        progress: &(dyn Fn(usize, usize, &str) + Sync),
    ) -> Result<WarmReport> {
        let start = Instant::now();
        let todo = self.missing(sources)?;
        let total = todo.len();
        if total == 0 {
            return Ok(WarmReport {
                families: sources.len(),
                ..WarmReport::default()
            });
        }
        progress(0, total, "");
        let done = AtomicUsize::new(0);
        let results = on_threads(&todo, threads, &|src| {
            let cubin = self.cubin(src)?;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total, src.family);
            Ok::<_, Error>(cubin.len())
        });
        for r in results {
            r?;
        }
        Ok(WarmReport {
            families: sources.len(),
            compiled: total,
            threads: threads.clamp(1, MAX_WARM_THREADS).min(total),
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Compiles every family of `sources` without the cache (the doctor's check) on up to
    /// `threads` threads; each family's cubin or error, in the order of `sources`.
    pub fn compile_all(&self, sources: &[KernelSource], threads: usize) -> Vec<Result<Vec<u8>>> {
        let all: Vec<&KernelSource> = sources.iter().collect();
        on_threads(&all, threads, &|src| self.compile(src))
    }
}
