//! SmolLM2-135M end to end on the CPU against the reference outputs of Hugging Face transformers
//! (float32, dequantized weights) in `tests/fixtures/smollm2/`: token ids exactly, logits within
//! 2e-3 absolute, greedy continuations identical, final hidden-state norms within 1e-3 relative.

mod smollm2_fixtures;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::sampler::SamplerConfig;
use onepass::model::tokenizer::Tokenizer;
use onepass::model::transformer::{Logits, Transformer};
use onepass::{Device, Executor, RuntimeConfig};
use serde_json::Value;

const LOGIT_TOL: f32 = 2e-3;
const NORM_RTOL: f64 = 1e-3;

fn fixture_json() -> &'static Value {
    static J: OnceLock<Value> = OnceLock::new();
    J.get_or_init(smollm2_fixtures::json)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

struct Model {
    file: Arc<GgufFile>,
    tokenizer: Tokenizer,
}

fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let cache = std::env::var_os("ONEPASS_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dirs::cache_dir().expect("cache dir").join("onepass"));
        let path =
            onepass::model::fetch::resolve_model("smollm2", &cache, false).expect("default model");
        let file = Arc::new(GgufFile::open(&path).expect("open model"));
        let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
        Model { file, tokenizer }
    })
}

fn engine(mode: RunMode, config: RuntimeConfig) -> Engine {
    let device = Device::cpu(0).expect("cpu device");
    let llama = Transformer::load(model().file.clone(), &device, 512, 512).expect("load llama");
    Engine::new(llama, Executor::new(device).with_config(config), mode)
}

fn shared_engine() -> &'static Mutex<Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    E.get_or_init(|| Mutex::new(engine(RunMode::Graph, RuntimeConfig::default())))
}

fn prompts() -> Vec<&'static Value> {
    fixture_json()["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> (f32, usize) {
    a.iter()
        .zip(b)
        .enumerate()
        .fold((0.0, 0), |(m, at), (i, (x, y))| {
            let d = (x - y).abs();
            if d > m {
                (d, i)
            } else {
                (m, at)
            }
        })
}

#[test]
fn token_ids_equal_the_reference_exactly() {
    for p in prompts() {
        let got = model()
            .tokenizer
            .encode(p["text"].as_str().unwrap(), true)
            .unwrap();
        assert_eq!(got, ids(&p["prompt_ids"]), "prompt {}", p["name"]);
    }
}

#[test]
fn logits_of_every_position_of_the_shortest_prompt() {
    let j = fixture_json();
    let name = j["all_positions_logits_prompt"].as_str().unwrap();
    let p = prompts().into_iter().find(|p| p["name"] == name).unwrap();
    let want = smollm2_fixtures::f32s(&format!("{name}.all_logits.f32.bin"));
    let prompt = ids(&p["prompt_ids"]);
    let mut e = shared_engine().lock().unwrap();
    e.prefill(&prompt, Logits::All).unwrap();
    let got = e.logits(prompt.len()).unwrap();
    let (diff, at) = max_abs(&got, &want);
    assert!(
        diff <= LOGIT_TOL,
        "{name}: max |diff| {diff} at row {} token {}",
        at / 49152,
        at % 49152
    );
}

#[test]
fn last_logits_and_hidden_norms_of_every_prompt() {
    let mut e = shared_engine().lock().unwrap();
    for p in prompts() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        e.prefill(&prompt, Logits::Last).unwrap();
        let got = e.logits(1).unwrap();
        let want = smollm2_fixtures::f32s(p["last_logits"]["file"].as_str().unwrap());
        let (diff, at) = max_abs(&got, &want);
        assert!(diff <= LOGIT_TOL, "{name}: max |diff| {diff} at token {at}");
        let norms = e
            .model()
            .final_hidden_norms(prompt.len(), Logits::Last)
            .unwrap();
        let before = p["final_hidden_l2_norm_last_pos"]["before_final_rmsnorm"]
            .as_f64()
            .unwrap();
        let after = p["final_hidden_l2_norm_last_pos"]["after_final_rmsnorm"]
            .as_f64()
            .unwrap();
        assert!(
            (norms.0 - before).abs() <= NORM_RTOL * before,
            "{name}: norm before {} vs {before}",
            norms.0
        );
        assert!(
            (norms.1 - after).abs() <= NORM_RTOL * after,
            "{name}: norm after {} vs {after}",
            norms.1
        );
    }
}

#[test]
fn greedy_continuations_equal_the_reference() {
    let mut e = shared_engine().lock().unwrap();
    for p in prompts() {
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["greedy"]["ids"]);
        let stats = e
            .generate(&prompt, want.len(), &SamplerConfig::default(), &[], |_| {
                Ok(())
            })
            .unwrap();
        assert_eq!(stats.generated_ids, want, "prompt {}", p["name"]);
    }
}

#[test]
fn every_mode_and_plan_gives_bitwise_the_same_logits() {
    let p = prompts()
        .into_iter()
        .find(|p| p["name"] == "list_numbers")
        .unwrap();
    let prompt = ids(&p["prompt_ids"]);
    let run = |mode: RunMode, config: RuntimeConfig| {
        let mut e = engine(mode, config);
        e.prefill(&prompt, Logits::Last).unwrap();
        let mut out = e.logits(1).unwrap();
        let mut token = prompt[prompt.len() - 1];
        for i in 0..4 {
            token = e.decode(token, prompt.len() + i, true).unwrap().unwrap();
            out.extend(e.logits(1).unwrap());
        }
        out
    };
    let plain = RuntimeConfig {
        fusion: false,
        reorder: false,
        split: false,
        ..RuntimeConfig::default()
    };
    let base = run(RunMode::Direct, plain.clone());
    for (mode, cfg) in [
        (RunMode::Recorded, plain.clone()),
        (RunMode::Recorded, RuntimeConfig::default()),
        (RunMode::Graph, RuntimeConfig::default()),
        (RunMode::Direct, RuntimeConfig::default()),
    ] {
        let got = run(mode, cfg.clone());
        let same = got
            .iter()
            .zip(&base)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{mode:?} with {cfg:?} differs from direct sequential (max |diff| {})",
            max_abs(&got, &base).0
        );
    }
}
