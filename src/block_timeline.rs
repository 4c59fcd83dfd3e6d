//! A pass as the GPU ran it, from block stamps (`backend::cuda::stamps`): the stamps grouped into
//! kernel launches, written as a Chrome trace (Perfetto) with one row of launches, one of the
//! time each launch's blocks waited for the kernels before it (programmatic launch lets them
//! start early), and one row per SM with its blocks; and a per-kernel summary.
//!
//! Unlike [`crate::trace`], whose kernels are timed one by one, nothing here is serialized: the
//! overlap between kernels, the gaps between them and the waits are the real ones (each block
//! pays a barrier and a few atomics for its stamp).

use std::collections::BTreeMap;
use std::path::Path;

use crate::backend::cuda::stamps::BlockStamp;
use crate::error::{Error, Result};

/// One kernel launch: its blocks' stamps together.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The kernel.
    pub kernel: String,
    /// Its blocks (the grid's size).
    pub blocks: u32,
    /// When its first block arrived (ns).
    pub arrive_ns: u64,
    /// When its first block's grid wait returned (ns).
    pub start_ns: u64,
    /// When its last block left (ns).
    pub end_ns: u64,
    /// Its blocks, by index.
    pub stamps: Vec<BlockStamp>,
}

/// Groups stamps into launches, in order of start. Each kernel's stamps are taken in order of
/// arrival and cut into grids from the newest back (a kernel's launches in one decode step run
/// one after another); a group that is not one whole grid (the oldest, where the ring wrapped)
/// is dropped.
pub fn launches(stamps: &[BlockStamp]) -> Vec<Launch> {
    let mut by_kernel: BTreeMap<&str, Vec<&BlockStamp>> = BTreeMap::new();
    for s in stamps {
        by_kernel.entry(s.kernel.as_str()).or_default().push(s);
    }
    let mut out = Vec::new();
    for (kernel, mut ss) in by_kernel {
        ss.sort_by_key(|s| (s.arrive_ns, s.block));
        let mut end = ss.len();
        while end > 0 {
            let grid = ss[end - 1].grid as usize;
            if grid == 0 || grid > end {
                break;
            }
            let group = &ss[end - grid..end];
            end -= grid;
            let mut seen = vec![false; grid];
            let whole = group.iter().all(|s| {
                (s.block as usize) < grid && !std::mem::replace(&mut seen[s.block as usize], true)
            });
            if !whole {
                continue;
            }
            let mut blocks: Vec<BlockStamp> = group.iter().map(|s| (*s).clone()).collect();
            blocks.sort_by_key(|s| s.block);
            out.push(Launch {
                kernel: kernel.to_string(),
                blocks: grid as u32,
                arrive_ns: blocks.iter().map(|s| s.arrive_ns).min().unwrap_or(0),
                start_ns: blocks.iter().map(|s| s.start_ns).min().unwrap_or(0),
                end_ns: blocks.iter().map(|s| s.end_ns).max().unwrap_or(0),
                stamps: blocks,
            });
        }
    }
    out.sort_by_key(|l| (l.start_ns, l.end_ns));
    out
}

/// Time of one kernel over a pass's launches.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelSpan {
    /// The kernel.
    pub kernel: String,
    /// Its launches.
    pub launches: usize,
    /// The blocks of its largest launch (its grid; launches of one kernel in a step share it).
    pub blocks: u32,
    /// Summed from each launch's first start to its last end (µs).
    pub run_us: f64,
    /// Summed time between the end of the launch before and this launch's start (µs), where
    /// positive: the gap a kernel boundary costs.
    pub gap_us: f64,
}

impl KernelSpan {
    /// A launch's mean run, first start to last end (µs).
    pub fn run_us_a_launch(&self) -> f64 {
        self.run_us / self.launches.max(1) as f64
    }
    /// The mean gap before a launch (µs).
    pub fn gap_us_a_launch(&self) -> f64 {
        self.gap_us / self.launches.max(1) as f64
    }
}

/// The pass's length (first arrival to last end, µs) and each kernel's spans, longest first.
pub fn summary(launches: &[Launch]) -> (f64, Vec<KernelSpan>) {
    let Some(first) = launches.iter().map(|l| l.arrive_ns).min() else {
        return (0.0, Vec::new());
    };
    let last = launches.iter().map(|l| l.end_ns).max().unwrap_or(first);
    let mut spans: BTreeMap<&str, KernelSpan> = BTreeMap::new();
    let mut prev_end: Option<u64> = None;
    for l in launches {
        let s = spans
            .entry(l.kernel.as_str())
            .or_insert_with(|| KernelSpan {
                kernel: l.kernel.clone(),
                launches: 0,
                blocks: 0,
                run_us: 0.0,
                gap_us: 0.0,
            });
        s.launches += 1;
        s.blocks = s.blocks.max(l.blocks);
        s.run_us += l.end_ns.saturating_sub(l.start_ns) as f64 / 1e3;
        if let Some(p) = prev_end {
            s.gap_us += l.start_ns.saturating_sub(p) as f64 / 1e3;
        }
        prev_end = Some(prev_end.map_or(l.end_ns, |p| p.max(l.end_ns)));
    }
    let mut v: Vec<KernelSpan> = spans.into_values().collect();
    v.sort_by(|a, b| b.run_us.total_cmp(&a.run_us));
    ((last - first) as f64 / 1e3, v)
}

/// The Chrome trace of `launches`, named `name`: process 0 holds the launches (thread 0) and
/// the early starts, each launch's first arrival to its first start (thread 1); process 1 a
/// thread per SM with each block from its start to its end. Times in µs from the first arrival.
pub fn chrome_trace(name: &str, launches: &[Launch]) -> serde_json::Value {
    let t0 = launches.iter().map(|l| l.arrive_ns).min().unwrap_or(0);
    let us = |ns: u64| ns.saturating_sub(t0) as f64 / 1e3;
    let mut ev = vec![
        serde_json::json!({"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
            "args": {"name": name}}),
        serde_json::json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": 0,
            "args": {"name": "kernels (first start to last end)"}}),
        serde_json::json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": 1,
            "args": {"name": "started early, waiting for the kernels before"}}),
        serde_json::json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
            "args": {"name": "blocks by SM"}}),
    ];
    for (i, l) in launches.iter().enumerate() {
        ev.push(serde_json::json!({
            "name": l.kernel, "ph": "X", "pid": 0, "tid": 0,
            "ts": us(l.start_ns), "dur": us(l.end_ns) - us(l.start_ns),
            "args": {"launch": i, "blocks": l.blocks},
        }));
        if l.arrive_ns < l.start_ns {
            ev.push(serde_json::json!({
                "name": format!("{} (waiting)", l.kernel), "ph": "X", "pid": 0, "tid": 1,
                "ts": us(l.arrive_ns), "dur": us(l.start_ns) - us(l.arrive_ns),
                "args": {"launch": i},
            }));
        }
        for s in &l.stamps {
            ev.push(serde_json::json!({
                "name": l.kernel, "ph": "X", "pid": 1, "tid": s.sm,
                "ts": us(s.start_ns), "dur": us(s.end_ns) - us(s.start_ns),
                "args": {"launch": i, "block": s.block, "arrived_us": us(s.arrive_ns)},
            }));
        }
    }
    serde_json::json!({ "traceEvents": ev, "displayTimeUnit": "ns" })
}

/// Writes [`chrome_trace`] of `launches` to `path`.
pub fn write_chrome_trace(path: &Path, name: &str, launches: &[Launch]) -> Result<()> {
    let text = serde_json::to_string(&chrome_trace(name, launches))
        .map_err(|e| Error::Backend(format!("serializing the timeline: {e}")))?;
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(kernel: &str, block: u32, grid: u32, t: u64) -> BlockStamp {
        BlockStamp {
            kernel: kernel.into(),
            sm: block,
            block,
            grid,
            arrive_ns: t,
            start_ns: t + 100,
            end_ns: t + 1000 + 10 * block as u64,
        }
    }

    /// Two launches of one kernel around another's become three launches in start order; the
    /// oldest partial grid (a wrapped ring) is dropped; the summary sums runs and gaps.
    #[test]
    fn given_stamps_of_a_chain_when_grouped_should_give_whole_launches_in_order() {
        let mut s = vec![stamp("a", 1, 2, 0)];
        s.extend([stamp("a", 0, 2, 10_000), stamp("a", 1, 2, 10_005)]);
        s.extend([stamp("b", 0, 1, 12_000)]);
        s.extend([stamp("a", 1, 2, 14_000), stamp("a", 0, 2, 14_001)]);
        let ls = launches(&s);
        let names: Vec<&str> = ls.iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(names, ["a", "b", "a"]);
        assert_eq!(ls[0].blocks, 2);
        assert_eq!(
            (ls[0].arrive_ns, ls[0].start_ns, ls[0].end_ns),
            (10_000, 10_100, 11_015)
        );
        assert_eq!(
            ls[2].stamps.iter().map(|s| s.block).collect::<Vec<_>>(),
            [0, 1]
        );
        let (len, spans) = summary(&ls);
        assert!((len - (15_010 - 10_000) as f64 / 1e3).abs() < 1e-9, "{len}");
        let a = spans.iter().find(|k| k.kernel == "a").unwrap();
        assert_eq!((a.launches, a.blocks), (2, 2));
        assert!((a.run_us - (0.915 + 0.910)).abs() < 1e-9, "{}", a.run_us);
        assert!((a.run_us_a_launch() - 0.9125).abs() < 1e-9);
        assert!((a.gap_us_a_launch() - 0.55).abs() < 1e-9);
        // b starts at 12.1 us after a ended at 11.015; the second a at 14.1 after b's 13.0.
        let b = spans.iter().find(|k| k.kernel == "b").unwrap();
        assert!((b.gap_us - 1.085).abs() < 1e-9 && (a.gap_us - 1.1).abs() < 1e-9);
        let trace = chrome_trace("step", &ls);
        let events = trace["traceEvents"].as_array().unwrap();
        // 4 names, 3 launches, 3 waits, 5 blocks.
        assert_eq!(events.len(), 4 + 3 + 3 + 5);
    }
}
