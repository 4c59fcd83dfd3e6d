//! `onepass bench --timeline`: one graph-mode decode step as the GPU ran it, from block stamps.
//!
//! The model is loaded again on a CUDA device whose kernels are compiled with block stamps
//! (`backend::cuda::stamps`); after the prompt and [`WARM_STEPS`] decode steps, the stamps of
//! one more step become a Chrome trace ([`onepass::block_timeline`]) and a summary on stderr.

use std::path::Path;
use std::sync::Arc;

use onepass::block_timeline::{launches, summary, write_chrome_trace};
use onepass::config::{RunMode, RuntimeConfig};
use onepass::model::engine::Engine;
use onepass::model::gguf::GgufFile;
use onepass::model::transformer::{Logits, Transformer};
use onepass::{Device, Executor};

use super::bench::BenchArgs;
use super::common::{load_with_prefill_rows, warm_device};

/// Decode steps run before the one whose stamps are kept (the graph is built at the first).
const WARM_STEPS: usize = 2;

/// Kernels listed in the summary.
const TOP: usize = 10;

/// Runs the stamped step on `file` after `prompt` and writes its timeline to `path`.
pub(super) fn run(
    args: &BenchArgs,
    config: &RuntimeConfig,
    file: Arc<GgufFile>,
    prompt: &[u32],
    path: &Path,
) -> anyhow::Result<()> {
    let mut options = config.cuda_options();
    options.block_stamps = true;
    eprintln!("timeline: loading the model again with block-stamped kernels");
    let device = warm_device(Device::cuda_with(0, &options)?)?;
    let Device::Cuda(cuda) = &device else {
        anyhow::bail!("--timeline needs a CUDA device");
    };
    let ctx = args.run.ctx.max(prompt.len() + WARM_STEPS + 2);
    let llama = load_with_prefill_rows(&args.run, &device, |rows| {
        Transformer::load_with(file.clone(), &device, &args.run.load_options(ctx, rows))
    })?;
    let executor = Executor::new(device.clone()).with_config(config.clone());
    let mut engine = Engine::new(llama, executor, RunMode::Graph);
    engine.prefill(prompt, Logits::Last)?;
    let mut token = prompt[prompt.len() - 1];
    for i in 0..WARM_STEPS {
        token = engine
            .decode(token, prompt.len() + i, true)?
            .unwrap_or(token);
    }
    cuda.take_block_stamps()?;
    engine.decode(token, prompt.len() + WARM_STEPS, true)?;
    let stamps = cuda.take_block_stamps()?;
    let launches = launches(&stamps);
    let name = format!(
        "decode step at {} tokens of context, graph mode, as run on {}",
        prompt.len() + WARM_STEPS + 1,
        device.name()
    );
    write_chrome_trace(path, &name, &launches)?;
    let (len, spans) = summary(&launches);
    eprintln!(
        "timeline: wrote one decode step ({} launches, {} blocks, {len:.1} us from the first \
         block's start to the last one's end, stamps included) to {}",
        launches.len(),
        stamps.len(),
        path.display()
    );
    eprintln!(
        "  kernel                             launches  blocks   us a launch   us (wait to end)   \
         gap before a launch"
    );
    for s in spans.iter().take(TOP) {
        eprintln!(
            "  {:<34} {:>8} {:>7} {:>13.2} {:>10.1} {:>5.1}% {:>14.2} us",
            s.kernel,
            s.launches,
            s.blocks,
            s.run_us_a_launch(),
            s.run_us,
            100.0 * s.run_us / len.max(1e-9),
            s.gap_us_a_launch()
        );
    }
    Ok(())
}
