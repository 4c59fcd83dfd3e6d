//! `onepass graph`: record one decode step and show what the optimizer did.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use onepass::backend::{BackendKind, Device};
use onepass::config::BackendChoice;
use onepass::executable::DagShape;
use onepass::graph::export;
use onepass::model::tokenizer::Tokenizer;
use onepass::model::transformer::{Logits, Transformer};
use onepass::sanitize::prefill_and_sanitize_decode;
use onepass::{Executor, Mode};

use super::common::{check_output_path, open_model, write_output, ModelArgs, RunArgs};

/// Flags of `graph`.
#[derive(Args, Debug)]
pub struct GraphArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the optimizer's figures.
    #[arg(long)]
    pub stats: bool,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write the optimized graph as Graphviz DOT.
    #[arg(long, value_name = "FILE")]
    pub dot: Option<PathBuf>,
    /// Write the optimized graph as an SVG picture (no Graphviz needed).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// After a short prefill, run one decode step serially and optimized with dead scratch
    /// poisoned, compare the outputs bitwise and print a one-line verdict (exit 1 on mismatch).
    #[arg(long)]
    pub sanitize: bool,
    /// List the fusion rules of the chosen backend (`--backend cpu|cuda`; no GPU needed) and
    /// exit.
    #[arg(long)]
    pub rules: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The prompt `--sanitize` prefills before the checked decode step.
const SANITIZE_PROMPT: &str = "The schedule sanitizer checks one decode step of this model.";
/// Most tokens per prefill pass when sanitizing.
const SANITIZE_PROMPT_BATCH: usize = 32;

/// Runs `graph`.
pub fn run(args: GraphArgs) -> anyhow::Result<()> {
    for (flag, path) in [("--dot", &args.dot), ("--svg", &args.svg)] {
        if let Some(path) = path {
            check_output_path(flag, path)?;
        }
    }
    let config = args.run.config();
    if args.rules {
        return print_rules(config.backend, args.json);
    }
    let device = open_or_stand_in(&config, args.sanitize)?;
    let file = open_model(&args.model.model, &config)?;
    // The sanitizer prefills a short prompt first, so it needs prefill passes of a few tokens.
    let batch = if args.sanitize {
        SANITIZE_PROMPT_BATCH
    } else {
        1
    };
    let options = args.run.load_options(args.run.ctx, batch);
    let llama = Transformer::load_with(file.clone(), &device, &options)?;
    let executor = Executor::new(device).with_config(config);
    let sanitized = if args.sanitize {
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let prompt = tokenizer.encode(SANITIZE_PROMPT, true)?;
        Some(prefill_and_sanitize_decode(
            &llama,
            &executor,
            &executor.config().plan(),
            &prompt,
        )?)
    } else {
        None
    };
    let mut out = std::io::stdout().lock();
    if let Some(report) = &sanitized {
        if !report.passed() {
            anyhow::bail!("{}", report.verdict());
        }
        if !args.json {
            writeln!(out, "{}", report.verdict())?;
            if !args.stats {
                return Ok(());
            }
        }
    }
    let mut session = executor.begin(Mode::Recorded);
    llama.record(&mut session, 1, Logits::Last, true)?;
    let mut graph = session.into_graph()?;
    let report = Executor::optimize(
        &mut graph,
        &executor.config().plan(),
        executor.device().capabilities(),
    );
    let dag = DagShape::of(&graph);
    if let Some(path) = &args.dot {
        write_output("--dot", path, export::to_dot(&graph).as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        write_output("--svg", path, export::to_svg(&graph).as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    let groups: serde_json::Map<String, serde_json::Value> = report
        .group_sizes
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    if args.json {
        let obj = serde_json::json!({
            "dispatches": report.dispatches,
            "barriers_sequential": report.barriers_sequential,
            "barriers_optimized": report.barriers,
            "fusions": report.fusions,
            "fusions_by_rule": report.fusions_by_rule,
            "reordered": report.reordered,
            "groups": groups,
            "edges": dag.edges,
            "critical_path": dag.critical_path,
            "widest_level": dag.widest_level,
        });
        let obj = match (obj, &sanitized) {
            (serde_json::Value::Object(mut map), Some(report)) => {
                map.insert("sanitize".into(), serde_json::to_value(report)?);
                serde_json::Value::Object(map)
            }
            (obj, _) => obj,
        };
        writeln!(out, "{obj}")?;
    } else if args.stats || (args.dot.is_none() && args.svg.is_none()) {
        writeln!(
            out,
            "decode step of {} ({} layers) on {}",
            args.model.model,
            llama.config().n_layer,
            executor.device().name()
        )?;
        writeln!(out, "  dispatches            {}", report.dispatches)?;
        writeln!(
            out,
            "  barriers, in order    {}",
            report.barriers_sequential
        )?;
        writeln!(out, "  barriers, optimized   {}", report.barriers)?;
        writeln!(out, "  fusions               {}", report.fusions)?;
        for (rule, count) in &report.fusions_by_rule {
            writeln!(out, "    {rule:<26} {count}")?;
        }
        writeln!(out, "  dispatches reordered  {}", report.reordered)?;
        let hist: Vec<String> = report
            .group_sizes
            .iter()
            .map(|(k, v)| format!("{k}x{v}"))
            .collect();
        writeln!(out, "  group sizes (size x count)  {}", hist.join(" "))?;
        writeln!(
            out,
            "  dependency DAG        {} edges, critical path {} dispatches, widest level {}",
            dag.edges, dag.critical_path, dag.widest_level
        )?;
    }
    Ok(())
}

/// The device `--backend` asks for; for `--backend cuda` on a machine without a usable GPU, a CPU
/// device standing in for CUDA (the graph records and optimizes as on CUDA; nothing runs), unless
/// the command must run the step (`--sanitize`).
fn open_or_stand_in(config: &onepass::config::RuntimeConfig, runs: bool) -> anyhow::Result<Device> {
    match config.open_device() {
        Ok(d) => Ok(d),
        Err(e) if config.backend == BackendChoice::Cuda && !runs => {
            eprintln!(
                "no CUDA device ({e}); recording on the CPU with CUDA's declarations \
                 (its fusion rules and kernel forms)"
            );
            Ok(Device::cpu_standing_in_for(BackendKind::Cuda, 1)?)
        }
        Err(e) if config.backend == BackendChoice::Cuda => Err(anyhow::anyhow!(
            "--sanitize runs the decode step, which needs a CUDA device: {e}"
        )),
        Err(e) => Err(e.into()),
    }
}

/// Prints the fusion rules of the backend `choice` names (`auto`: the one this machine opens).
fn print_rules(choice: BackendChoice, json: bool) -> anyhow::Result<()> {
    let kind = match choice {
        BackendChoice::Cpu => BackendKind::Cpu,
        BackendChoice::Cuda => BackendKind::Cuda,
        BackendChoice::Auto => onepass::config::RuntimeConfig::default()
            .open_device()
            .map_or(BackendKind::Cpu, |d| d.kind()),
    };
    let caps = onepass::backend::capabilities_of(kind);
    let mut out = std::io::stdout().lock();
    let rows: Vec<serde_json::Value> = caps
        .fusions
        .iter()
        .map(|u| {
            let rule = onepass::ops::fusion_rule(u.fusion, caps);
            serde_json::json!({
                "rule": rule.name,
                "pattern": rule.describe(),
                "max_rows": u.max_rows,
                "exact": u.exact,
                "after_narrowing": rule.after_narrowing,
            })
        })
        .collect();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::json!({ "backend": kind.to_string(), "rules": rows })
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "fusion rules of the {kind} backend, tried in this order (a rule marked after the f16 \
         narrowing runs in a second stage, on what the narrowing made):"
    )?;
    for u in caps.fusions {
        let rule = onepass::ops::fusion_rule(u.fusion, caps);
        let rows = u
            .max_rows
            .map_or("any rows".to_string(), |m| format!("up to {m} rows"));
        let bits = if u.exact {
            "bit-exact"
        } else {
            "within f32 rounding"
        };
        let stage = if rule.after_narrowing {
            ", after the f16 narrowing"
        } else {
            ""
        };
        writeln!(out, "  {:<26} {rows}, {bits}{stage}", rule.name)?;
        writeln!(out, "    {}", rule.describe())?;
    }
    Ok(())
}
