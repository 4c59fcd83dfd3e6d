//! The host's cost of one sampled token: `Sampler::sample` over a vocabulary of logits, for
//! SmolLM2's 49,152 and Llama 3's 128,256 entries, at the settings `generate` and `serve` take
//! (temperature alone; top-k with top-p; the server's temperature with top-p; a repetition
//! penalty over 64 tokens of history), and logits spread over hundreds at temperature 0.8. A
//! decode step of the 8B shape takes about 2.1 ms of GPU time on an H200 and SmolLM2's 0.6 ms,
//! so a sample that costs milliseconds is most of a sampled step.
//!
//! Run: `cargo bench --bench sampler`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use onepass::model::sampler::{Sampler, SamplerConfig};

/// Seeded logits shaped like a model's: most far below the top, a few near it.
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut unit = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 / (1u64 << 53) as f64) as f32
    };
    (0..n)
        .map(|_| {
            // The sum of four uniforms: a bell of spread about 1.2, scaled to logits' range.
            let g = unit() + unit() + unit() + unit() - 2.0;
            4.0 * g + if unit() < 0.001 { 8.0 } else { 0.0 }
        })
        .collect()
}

fn bench_sampler(c: &mut Criterion) {
    let configs = [
        (
            "t0.8",
            SamplerConfig {
                temperature: 0.8,
                ..SamplerConfig::default()
            },
        ),
        (
            "t0.8_k40_p0.95",
            SamplerConfig {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                ..SamplerConfig::default()
            },
        ),
        (
            "t1_p0.95",
            SamplerConfig {
                temperature: 1.0,
                top_p: 0.95,
                ..SamplerConfig::default()
            },
        ),
        (
            "t0.8_penalty1.1",
            SamplerConfig {
                temperature: 0.8,
                repetition_penalty: 1.1,
                ..SamplerConfig::default()
            },
        ),
    ];
    let history: Vec<u32> = (0..200u32).map(|i| (i * 7919) % 40_000).collect();
    for vocab in [49_152usize, 128_256] {
        let rows: Vec<Vec<f32>> = (0..8).map(|i| logits(vocab, 17 + i)).collect();
        // Logits spread over hundreds (a synthetic model's random weights): most weights
        // underflow, which a draw must not pay for.
        let wide: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| r.iter().map(|v| 12.0 * v).collect())
            .collect();
        let mut sampler = Sampler::new(configs[0].1.clone()).expect("valid settings");
        let mut i = 0usize;
        c.bench_function(&format!("sample/{vocab}/t0.8_wide"), |b| {
            b.iter(|| {
                i += 1;
                black_box(
                    sampler
                        .sample(&wide[i % wide.len()], &history)
                        .expect("a token"),
                )
            })
        });
        for (label, config) in &configs {
            let mut sampler = Sampler::new(config.clone()).expect("valid settings");
            let mut i = 0usize;
            c.bench_function(&format!("sample/{vocab}/{label}"), |b| {
                b.iter(|| {
                    i += 1;
                    black_box(
                        sampler
                            .sample(&rows[i % rows.len()], &history)
                            .expect("a token"),
                    )
                })
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench_sampler
}
criterion_main!(benches);
