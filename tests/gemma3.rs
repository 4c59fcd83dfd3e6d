//! Gemma 3 270M (Q4_K_M: Q5_0, Q4_K, Q6_K, Q8_0 and F32 tensors) end to end on the CPU against
//! the reference outputs of Hugging Face transformers in `tests/fixtures/gemma3/` (float32 math
//! of the dequantized weights; see its README): last-position logits of every prompt, every
//! position of the shortest, final hidden-state norms, greedy continuations.
//!
//! Tolerances: onepass also computes in f32 from the dequantized weights, so only the summation
//! order differs (the fixture's own float64-vs-float32 check moves the logits by up to 3.9e-5).
//! Logits must agree within `LOGIT_TOL` = 2e-3 absolute, the bound; the measured error is
//! printed. The sliding window is covered by the long prompt (824 tokens, window 512): a window
//! off by one moves its last logits by 0.03 or more, fifteen times the tolerance.
//!
//! Margin rule for greedy continuations: a step whose recorded top-1 minus top-2 margin exceeds
//! twice the logit tolerance cannot change its argmax under an error within the tolerance, so
//! tokens must be equal up to the first step whose margin is below `2 * LOGIT_TOL`, and in full
//! when no step is (all six public prompts: their smallest margin is 0.0057).

mod gemma3_fixtures {
    //! Reading `tests/fixtures/gemma3/`, with the full path in every failure.
    use std::path::PathBuf;

    pub fn read(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gemma3")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
    }

    pub fn json() -> serde_json::Value {
        serde_json::from_slice(&read("gemma3_public.json")).expect("gemma3_public.json")
    }

    pub fn f32s(name: &str) -> Vec<f32> {
        read(name)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use onepass::model::arch::{Family, ModelConfig};
use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::sampler::SamplerConfig;
use onepass::model::transformer::{Logits, Transformer};
use onepass::{Device, Executor};
use serde_json::Value;

const LOGIT_TOL: f32 = 2e-3;
const NORM_RTOL: f64 = 1e-3;
const VOCAB: usize = 262_144;

fn fixture() -> &'static Value {
    static J: OnceLock<Value> = OnceLock::new();
    J.get_or_init(gemma3_fixtures::json)
}

fn prompts() -> Vec<&'static Value> {
    fixture()["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn file() -> Arc<GgufFile> {
    static F: OnceLock<Arc<GgufFile>> = OnceLock::new();
    F.get_or_init(|| {
        let cache = std::env::var_os("ONEPASS_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dirs::cache_dir().expect("cache dir").join("onepass"));
        let path = onepass::model::fetch::resolve_model("gemma3", &cache, false).expect("gemma3");
        Arc::new(GgufFile::open(&path).expect("open gemma3"))
    })
    .clone()
}

fn engine() -> &'static Mutex<Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        let device = Device::cpu(0).expect("cpu");
        let model = Transformer::load(file(), &device, 1024, 1024).expect("load gemma3");
        Mutex::new(Engine::new(model, Executor::new(device), RunMode::Graph))
    })
}

fn max_abs(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len(), "lengths");
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
fn the_configuration_is_read_as_transformers_reads_it() {
    let c = ModelConfig::from_gguf(&file()).unwrap();
    assert_eq!(c.family, Family::Gemma3);
    assert_eq!(
        (c.n_layer, c.dim, c.ffn_dim, c.vocab),
        (18, 640, 2048, VOCAB)
    );
    assert_eq!((c.n_head, c.n_kv_head, c.head_dim), (4, 1, 256));
    assert_eq!(c.attn_scale, 1.0 / 16.0);
    assert_eq!(c.embed_scale, Some(25.298_222));
    let global: Vec<usize> = (0..18).filter(|&l| !c.is_local(l)).collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(c.layer_attention(0).window, Some(512));
    assert_eq!(c.layer_attention(0).rope_base, 10_000.0);
    assert_eq!(c.layer_attention(5).window, None);
    assert_eq!(c.layer_attention(5).rope_base, 1_000_000.0);
}

#[test]
fn last_logits_and_hidden_norms_of_every_prompt() {
    let mut e = engine().lock().unwrap();
    let mut worst = 0.0f32;
    for p in prompts() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        e.prefill(&prompt, Logits::Last).unwrap();
        let got = e.logits(1).unwrap();
        let want = gemma3_fixtures::f32s(p["last_logits"]["file"].as_str().unwrap());
        let (diff, at) = max_abs(&got, &want);
        eprintln!("{name}: {} tokens, max |diff| {diff:e}", prompt.len());
        worst = worst.max(diff);
        assert!(diff <= LOGIT_TOL, "{name}: max |diff| {diff} at token {at}");
        let norms = e
            .model()
            .final_hidden_norms(prompt.len(), Logits::Last)
            .unwrap();
        let h = &p["final_hidden_l2_norm_last_pos"];
        for (got, key) in [
            (norms.0, "before_final_rmsnorm"),
            (norms.1, "after_final_rmsnorm"),
        ] {
            let want = h[key].as_f64().unwrap();
            assert!(
                (got - want).abs() <= NORM_RTOL * want,
                "{name}: {key} {got} vs {want}"
            );
        }
    }
    eprintln!("largest |diff| over every prompt: {worst:e}");
}

#[test]
fn logits_of_every_position_of_the_shortest_prompt() {
    let name = fixture()["all_positions_logits_prompt"].as_str().unwrap();
    let p = prompts().into_iter().find(|p| p["name"] == name).unwrap();
    let want = gemma3_fixtures::f32s(&format!("{name}.all_logits.f32.bin"));
    let prompt = ids(&p["prompt_ids"]);
    let mut e = engine().lock().unwrap();
    e.prefill(&prompt, Logits::All).unwrap();
    let got = e.logits(prompt.len()).unwrap();
    let (diff, at) = max_abs(&got, &want);
    assert!(
        diff <= LOGIT_TOL,
        "{name}: max |diff| {diff} at row {} token {}",
        at / VOCAB,
        at % VOCAB
    );
}

#[test]
fn greedy_continuations_equal_the_reference_where_the_margins_allow() {
    let mut e = engine().lock().unwrap();
    for p in prompts() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["greedy"]["ids"]);
        let margins: Vec<f64> = p["greedy"]["top1_minus_top2_margin_per_step"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let comparable = margins
            .iter()
            .position(|&m| m < 2.0 * f64::from(LOGIT_TOL))
            .unwrap_or(want.len());
        let stats = e
            .generate(&prompt, want.len(), &SamplerConfig::default(), &[], |_| {
                Ok(())
            })
            .unwrap();
        assert_eq!(
            stats.generated_ids[..comparable],
            want[..comparable],
            "{name}: the first {comparable} greedy tokens"
        );
        eprintln!(
            "{name}: {comparable} of {} greedy tokens compared, equal",
            want.len()
        );
    }
}
