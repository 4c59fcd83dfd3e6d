//! Kernel timelines as Chrome-trace JSON (the "Trace Event" format that Perfetto and
//! `chrome://tracing` open), and per-op-kind and per-kernel summaries of where a step's time goes.
//!
//! One complete event (`"ph": "X"`) per kernel: its name is the kernel, its category the op kind,
//! its track the CPU pool thread (or the CUDA stream), and its arguments the dispatch index and
//! its level (concurrent group).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::executable::KernelTiming;

/// One named timeline (a profiled pass) of a trace, as a separate process row in the viewer.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Name shown for the row ("decode step, graph mode").
    pub name: String,
    /// The kernels, as the profiling run timed them.
    pub kernels: Vec<KernelTiming>,
}

/// The trace JSON of several timelines.
pub fn chrome_trace(timelines: &[Timeline]) -> serde_json::Value {
    let mut events = Vec::new();
    for (pid, t) in timelines.iter().enumerate() {
        events.push(serde_json::json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": { "name": t.name },
        }));
        for k in &t.kernels {
            events.push(serde_json::json!({
                "name": k.kernel,
                "cat": k.op,
                "ph": "X",
                "ts": k.start_us,
                "dur": k.dur_us,
                "pid": pid,
                "tid": k.track,
                "args": { "index": k.index, "op": k.op, "level": k.level },
            }));
        }
    }
    serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ns" })
}

/// Writes the trace of `timelines` to `path`.
pub fn write_chrome_trace(path: &Path, timelines: &[Timeline]) -> Result<()> {
    let text = serde_json::to_string(&chrome_trace(timelines))
        .map_err(|e| Error::Backend(format!("serializing the trace: {e}")))?;
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// Time of one op kind (or of one kernel) in a profiled pass.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpTime {
    /// Op kind name.
    pub op: &'static str,
    /// The kernel, in a [`kernel_summary`]; `None` in an [`op_summary`].
    pub kernel: Option<&'static str>,
    /// Kernels of that kind (launches of that kernel).
    pub count: usize,
    /// Their summed time in microseconds.
    pub total_us: f64,
    /// Their summed declared bytes ([`KernelTiming::bytes`]).
    pub bytes: u64,
    /// Their summed floating-point operations ([`KernelTiming::flops`]).
    pub flops: u64,
}

impl OpTime {
    /// Achieved GB/s over the declared bytes, where those are what the kernels move: `None` for
    /// attention, gathers and cache writes, which declare a whole cache or table.
    pub fn gb_per_s(&self) -> Option<f64> {
        let bounded = matches!(self.op, "attention" | "kv_write" | "gather");
        (!bounded && self.total_us > 0.0).then(|| self.bytes as f64 / self.total_us / 1e3)
    }

    /// Achieved TFLOP/s of the matrix products; `None` for kinds that count no operations.
    pub fn tflop_per_s(&self) -> Option<f64> {
        (self.flops > 0 && self.total_us > 0.0).then(|| self.flops as f64 / self.total_us / 1e6)
    }
}

/// Summed kernel time per op kind, largest first.
pub fn op_summary(kernels: &[KernelTiming]) -> Vec<OpTime> {
    summarize(kernels, false)
}

/// Summed time per kernel (by name, with its op kind), largest first.
pub fn kernel_summary(kernels: &[KernelTiming]) -> Vec<OpTime> {
    summarize(kernels, true)
}

/// The groups of `kernels` by op kind, or by kernel where `per_kernel`, largest first.
fn summarize(kernels: &[KernelTiming], per_kernel: bool) -> Vec<OpTime> {
    type Key = (&'static str, Option<&'static str>);
    let mut groups: BTreeMap<Key, (usize, f64, u64, u64)> = BTreeMap::new();
    for k in kernels {
        let key = (k.op, per_kernel.then_some(k.kernel));
        let e = groups.entry(key).or_insert((0, 0.0, 0, 0));
        e.0 += 1;
        e.1 += k.dur_us;
        e.2 += k.bytes;
        e.3 += k.flops;
    }
    let mut v: Vec<OpTime> = groups
        .into_iter()
        .map(|((op, kernel), (count, total_us, bytes, flops))| OpTime {
            op,
            kernel,
            count,
            total_us,
            bytes,
            flops,
        })
        .collect();
    v.sort_by(|a, b| {
        b.total_us
            .total_cmp(&a.total_us)
            .then(a.op.cmp(b.op))
            .then(a.kernel.cmp(&b.kernel))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(index: usize, op: &'static str, start: f64, dur: f64) -> KernelTiming {
        KernelTiming {
            index,
            kernel: "kern",
            op,
            level: index,
            track: index % 2,
            start_us: start,
            dur_us: dur,
            bytes: 1000,
            flops: 0,
        }
    }

    #[test]
    fn given_kernels_when_traced_should_emit_one_complete_event_each_with_its_track() {
        let t = Timeline {
            name: "step".into(),
            kernels: vec![k(0, "matmul", 0.0, 5.0), k(1, "add", 5.0, 1.5)],
        };
        let v = chrome_trace(&[t]);
        let events = v["traceEvents"].as_array().expect("array");
        let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[1]["cat"], "add");
        assert_eq!(slices[1]["tid"], 1);
        assert_eq!(slices[1]["dur"], 1.5);
        assert_eq!(events[0]["args"]["name"], "step");
    }

    #[test]
    fn given_kernels_when_summarized_should_sum_per_op_largest_first() {
        let s = op_summary(&[
            k(0, "add", 0.0, 1.0),
            k(1, "matmul", 1.0, 4.0),
            k(2, "add", 5.0, 2.0),
        ]);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].op, s[0].count, s[0].total_us), ("matmul", 1, 4.0));
        assert_eq!((s[1].op, s[1].count, s[1].total_us), ("add", 2, 3.0));
        // 2000 bytes in 3 us: 0.667 GB/s; attention declares its whole cache, so no figure.
        assert!((s[1].gb_per_s().unwrap() - 2.0 / 3.0).abs() < 1e-9);
        let a = op_summary(&[k(0, "attention", 0.0, 1.0)]);
        assert_eq!(a[0].gb_per_s(), None);
    }

    #[test]
    fn given_kernels_when_summarized_per_kernel_should_group_by_name_within_the_kind() {
        let mut a = k(0, "matmul", 0.0, 1.0);
        a.kernel = "matmul_q4_0";
        let mut b = k(1, "matmul", 1.0, 5.0);
        b.kernel = "matmul_add_q4_0";
        let mut c = a.clone();
        c.index = 2;
        c.dur_us = 2.0;
        let s = kernel_summary(&[a, b, c]);
        let got: Vec<_> = s.iter().map(|t| (t.kernel, t.count, t.total_us)).collect();
        assert_eq!(
            got,
            [
                (Some("matmul_add_q4_0"), 1, 5.0),
                (Some("matmul_q4_0"), 2, 3.0)
            ]
        );
        assert!(s.iter().all(|t| t.op == "matmul"));
        assert_eq!(op_summary(&[k(0, "add", 0.0, 1.0)])[0].kernel, None);
    }
}
