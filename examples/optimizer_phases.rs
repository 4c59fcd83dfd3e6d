//! What recording and optimizing a decode-shaped graph cost, phase by phase, as percentiles over
//! many steps (criterion reports means; on a shared machine whose core is at times slowed by a
//! neighbour, the low percentiles show the cost on a quiet core and the spread shows the rest).
//!
//! Run: `taskset -c 0 cargo run --release --example optimizer_phases -- [--steps N] [--layers L]
//! [--fresh]`. By default every step is recorded again into the graph of the previous one (a
//! decode loop's case); `--fresh` records into a new graph each step and drops it.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use onepass::graph::passes;
use onepass::graph::synthetic::{norm_mul_rule, DecodeGraph, DecodeShape};
use onepass::graph::ComputeGraph;
use onepass::Device;

struct Options {
    steps: usize,
    layers: usize,
    fresh: bool,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        steps: 5000,
        layers: 30,
        fresh: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            let v = args.next().ok_or(format!("{name} needs a number"))?;
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{name}: '{v}' is not a positive number"))
        };
        match a.as_str() {
            "--steps" => o.steps = number("--steps")?,
            "--layers" => o.layers = number("--layers")?,
            "--fresh" => o.fresh = true,
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(o)
}

/// The 10th, 50th and 90th percentiles of `v` (sorted in place).
fn percentiles(v: &mut [f64]) -> [f64; 3] {
    v.sort_by(f64::total_cmp);
    [0.1, 0.5, 0.9].map(|p| v[((v.len() - 1) as f64 * p).round() as usize])
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("optimizer_phases: {e}");
            eprintln!("usage: optimizer_phases [--steps N] [--layers L] [--fresh]");
            return ExitCode::from(2);
        }
    };
    let run = || -> onepass::Result<()> {
        let device = Device::cpu(1)?;
        let dg = DecodeGraph::new(
            |t, d| device.alloc(t, d),
            DecodeShape::SMOLLM2_135M.with_layers(o.layers),
        )?;
        let rules = [norm_mul_rule()];
        let mut graph = dg.record()?;
        let (mut record, mut optimize, mut total) = (Vec::new(), Vec::new(), Vec::new());
        let mut last = passes::Optimized::default();
        for _ in 0..o.steps {
            let t0 = Instant::now();
            if o.fresh {
                graph = ComputeGraph::new();
            } else {
                graph.clear();
            }
            dg.record_into(&mut graph)?;
            let t1 = Instant::now();
            last = black_box(passes::optimize(
                &mut graph,
                &rules,
                &[],
                passes::DEFAULT_LOOKAHEAD,
            ));
            let t2 = Instant::now();
            record.push((t1 - t0).as_secs_f64() * 1e6);
            optimize.push((t2 - t1).as_secs_f64() * 1e6);
            total.push((t2 - t0).as_secs_f64() * 1e6);
        }
        let case = if o.fresh {
            "a new graph each step, the last one dropped"
        } else {
            "recorded again into the kept graph"
        };
        println!(
            "{} layers, {} steps, {case}: {} dispatches after {} fusions, {} barriers",
            o.layers,
            o.steps,
            graph.dispatch_count(),
            last.fusions,
            last.barriers
        );
        println!(
            "{:<26} {:>8} {:>8} {:>8}",
            "phase (us)", "p10", "p50", "p90"
        );
        for (name, v) in [
            ("record", &mut record),
            ("fuse+reorder+barriers", &mut optimize),
            ("total", &mut total),
        ] {
            let [p10, p50, p90] = percentiles(v);
            println!("{name:<26} {p10:>8.1} {p50:>8.1} {p90:>8.1}");
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("optimizer_phases: {e}");
            ExitCode::FAILURE
        }
    }
}
