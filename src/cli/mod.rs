//! The command line: argument parsing, progress, output formats. Only this layer decides to exit.

mod bench;
mod common;
mod doctor;
mod generate;
mod graph;
mod synth;
mod tokenize;

use clap::{Parser, Subcommand};

/// onepass: record a transformer forward pass as a graph of kernel dispatches, optimize it, and
/// replay it as one submission.
#[derive(Parser)]
#[command(name = "onepass", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it as it is produced.
    Generate(generate::GenerateArgs),
    /// Show the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Record one decode step and show what the optimizer did (stats, DOT, SVG).
    Graph(graph::GraphArgs),
    /// Write a GGUF model of a known shape with random weights.
    Synth(synth::SynthArgs),
    /// Measure prefill and decode speed.
    Bench(bench::BenchArgs),
    /// Show CUDA devices, driver and NVRTC versions, and whether every kernel compiles.
    Doctor {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    onepass::config::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Graph(a) => graph::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Doctor { json } => doctor::run(json),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            1
        }
    }
}
