//! The command line: argument parsing, progress, output formats. Only this layer decides to exit.

mod bench;
mod bench_rows;
mod bench_timeline;
mod common;
mod doctor;
mod generate;
mod graph;
mod serve;
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
    /// Serve the model over HTTP with the OpenAI API (completions and chat, streamed or not),
    /// batching concurrent requests.
    Serve(serve::ServeArgs),
    /// Show what this machine offers: the CPU backend; CUDA devices, driver and NVRTC versions,
    /// and whether every kernel compiles. Exits 1 only when something present is broken.
    Doctor {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Compile the kernels for this architecture (`sm_90a`, `sm_89`, ...) rather than the
        /// first device's (without a device: `sm_90a`).
        #[arg(long, value_name = "SM")]
        arch: Option<String>,
        /// Compile through the kernel cache and keep the cubins there (families already cached
        /// are not compiled again), so that a later run on a GPU of that architecture, with the
        /// same NVRTC version and header directory, starts without compiling.
        #[arg(long)]
        fill_cache: bool,
        /// With `--fill-cache`: the block-stamped kernels too, which `bench --timeline` loads
        /// (their own cubins, compiled with stamps).
        #[arg(long, requires = "fill_cache")]
        stamps: bool,
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
        Command::Serve(a) => serve::run(a),
        Command::Doctor {
            json,
            arch,
            fill_cache,
            stamps,
        } => {
            let fill = match (fill_cache, stamps) {
                (false, _) => doctor::Fill::Nothing,
                (true, false) => doctor::Fill::Kernels,
                (true, true) => doctor::Fill::KernelsAndStamped,
            };
            doctor::run(json, arch.as_deref(), fill)
        }
    };
    exit_code(result)
}

/// The exit code of a command's result: 0 for success and for a closed standard output (the
/// reader, such as `head`, has all it wants); otherwise the error's chain on one line and 1.
fn exit_code(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            1
        }
    }
}

/// Whether an error comes from writing to a pipe whose reader has gone.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let kind = c
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| c.downcast_ref::<onepass::Error>().and_then(|e| e.io_kind()));
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stdout_is_success_and_other_errors_are_not() {
        let pipe = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert_eq!(exit_code(Ok(())), 0);
        assert_eq!(exit_code(Err(pipe().into())), 0);
        let wrapped = anyhow::Error::from(pipe()).context("writing the output");
        assert_eq!(exit_code(Err(wrapped)), 0);
        let lib = onepass::Error::io("standard output", pipe());
        assert_eq!(exit_code(Err(lib.into())), 0);
        let other = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(exit_code(Err(other.into())), 1);
    }
}
