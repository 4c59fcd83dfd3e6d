//! `onepass graph`: record one decode step and show what the optimizer did.

use std::path::PathBuf;

use clap::Args;
use onepass::model::llama::{Llama, Logits};
use onepass::{Executor, Mode};

use super::common::{open_model, ModelArgs, RunArgs};

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
    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs `graph`.
pub fn run(args: GraphArgs) -> anyhow::Result<()> {
    let file = open_model(&args.model.model)?;
    let device = args.run.device()?;
    let llama = Llama::load(file, &device, args.run.ctx, 1)?;
    let executor = Executor::new(device).with_config(args.run.config());
    let mut session = executor.begin(Mode::Recorded);
    llama.record(&mut session, 1, Logits::Last, true)?;
    let mut graph = session.into_graph()?;
    let report = Executor::optimize(&mut graph, &executor.config().plan());
    if args.dot.is_some() || args.svg.is_some() {
        anyhow::bail!("--dot and --svg are not available in this build yet");
    }
    let groups: serde_json::Map<String, serde_json::Value> =
        report.group_sizes.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
    if args.json {
        let obj = serde_json::json!({
            "dispatches": report.dispatches,
            "barriers_sequential": report.barriers_sequential,
            "barriers_optimized": report.barriers,
            "fusions": report.fusions,
            "reordered": report.reordered,
            "groups": groups,
        });
        println!("{obj}");
    } else if args.stats || (args.dot.is_none() && args.svg.is_none()) {
        println!("decode step of {} ({} layers)", args.model.model, llama.config().n_layer);
        println!("  dispatches            {}", report.dispatches);
        println!("  barriers, in order    {}", report.barriers_sequential);
        println!("  barriers, optimized   {}", report.barriers);
        println!("  fusions               {}", report.fusions);
        println!("  dispatches reordered  {}", report.reordered);
        let hist: Vec<String> = report.group_sizes.iter().map(|(k, v)| format!("{k}x{v}")).collect();
        println!("  group sizes (size x count)  {}", hist.join(" "));
    }
    Ok(())
}
