//! The device draw on the CPU backend against the host's sampler: the same tokens, generator
//! state and window over several steps; its state's words; its argument checks.

use super::*;
use crate::backend::Device;
use crate::ops::copy::float_io::run_direct;
use crate::sampler::{Sampler, SamplerConfig};
use crate::testutil::random_f32;

/// Settings a device draw takes: temperature, top-k, top-p, min-p, penalty (window 16).
fn configs() -> Vec<SamplerConfig> {
    let c = |temperature, top_k, top_p, min_p, repetition_penalty| SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        penalty_window: 16,
        seed: 0,
    };
    vec![
        c(0.8, 0, 1.0, 0.0, 1.0),
        c(1.0, 40, 0.95, 0.0, 1.0),
        c(0.7, 0, 0.9, 0.05, 1.3),
        c(1.5, 3, 1.0, 0.0, 0.8),
        c(0.0, 0, 1.0, 0.0, 1.2),
    ]
}

/// Runs `steps` device draws over `row` after `history` with the settings of `cfg` and the
/// generator at `rng`; returns the ring's tokens in step order and the state after.
fn device_draws(
    dev: &Device,
    row: &[f32],
    cfg: &SamplerConfig,
    rng: u64,
    history: &[u32],
    steps: usize,
) -> (Vec<i32>, DrawState) {
    let n = row.len();
    let state = DrawState::new(cfg, rng, history.len()).unwrap();
    let x = dev.upload(row, &[n]).unwrap();
    let ring = dev.upload(&vec![-7i32; steps], &[steps]).unwrap();
    let inputs = dev.upload(&[0i32, 5, 0], &[3]).unwrap();
    let words = dev.upload(&state.words(), &[DRAW_STATE_WORDS]).unwrap();
    let window = dev
        .upload(&state.window_of(history), &[DRAW_WINDOW])
        .unwrap();
    let scratch = dev.alloc(DType::U32, &[draw_scratch_len(n)]).unwrap();
    run_direct(dev, |s| {
        (0..steps).try_for_each(|_| s.draw_advance(&x, &ring, &inputs, &words, &window, &scratch))
    });
    let after: [u32; DRAW_STATE_WORDS] = dev.download::<u32>(&words).unwrap().try_into().unwrap();
    assert_eq!(
        dev.download::<i32>(&inputs).unwrap()[0],
        steps as i32,
        "the step's position advanced once a draw"
    );
    (
        dev.download::<i32>(&ring).unwrap(),
        DrawState::from_words(&after),
    )
}

#[test]
fn the_device_draw_is_the_samplers_draw_step_after_step() {
    let dev = Device::cpu(2).unwrap();
    for (case, cfg) in configs().into_iter().enumerate() {
        for n in [7usize, 1000, 49_152] {
            let mut row = random_f32(n, 6.0, 40 + case as u64);
            row[n / 2] = f32::NAN;
            let history: Vec<u32> = (0..24).map(|i| (i * 31 % n) as u32).collect();
            let rng = 0x1234_5678_9ABC_DEF0 ^ case as u64;
            let (ring, after) = device_draws(&dev, &row, &cfg, rng, &history, 6);
            let mut host = Sampler::with_state(cfg.clone(), rng).unwrap();
            let mut seen = history.clone();
            let want: Vec<i32> = (0..6)
                .map(|_| {
                    let t = host.sample(&row, &seen).unwrap();
                    seen.push(t);
                    t as i32
                })
                .collect();
            assert_eq!(ring, want, "case {case}, n {n}: {cfg:?}");
            assert_eq!(after.rng, host.state(), "case {case}, n {n}: generator");
            assert_eq!(after.history as usize, seen.len(), "case {case}: history");
            if cfg.temperature == 0.0 {
                assert_eq!(after.rng, rng, "a greedy draw advanced the generator");
            }
        }
    }
}

#[test]
fn a_row_without_a_finite_value_draws_minus_one_and_leaves_the_generator() {
    let dev = Device::cpu(2).unwrap();
    let cfg = configs().remove(0);
    let row = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    let (ring, after) = device_draws(&dev, &row, &cfg, 99, &[1], 2);
    assert_eq!(ring, vec![-1, -1]);
    assert_eq!((after.rng, after.history), (99, 1));
}

#[test]
fn state_words_and_window_round_trip() {
    let cfg = SamplerConfig {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.1,
        penalty_window: 4,
        seed: 3,
    };
    let state = DrawState::new(&cfg, u64::MAX - 5, 6).unwrap();
    assert_eq!(DrawState::from_words(&state.words()), state);
    assert_eq!(
        state.config(),
        SamplerConfig {
            seed: 0,
            ..cfg.clone()
        }
    );
    // Tokens 2..6 of the history, each at its index modulo the window of 4.
    let window = state.window_of(&[10, 11, 12, 13, 14, 15]);
    assert_eq!(&window[..5], &[14, 15, 12, 13, 0]);
    assert_eq!(window.len(), DRAW_WINDOW);
    let long = SamplerConfig {
        penalty_window: DRAW_WINDOW + 1,
        ..cfg.clone()
    };
    assert!(DrawState::new(&long, 0, 0).is_err());
    let bad = SamplerConfig { top_p: 0.0, ..cfg };
    assert!(DrawState::new(&bad, 0, 0).is_err());
}

#[test]
fn draw_advance_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let alloc = |dt: DType, n: usize| dev.alloc(dt, &[n]).unwrap();
    let x = alloc(DType::F32, 10);
    let ring = alloc(DType::I32, 4);
    let inputs = alloc(DType::I32, 3);
    let state = alloc(DType::U32, DRAW_STATE_WORDS);
    let window = alloc(DType::I32, DRAW_WINDOW);
    let scratch = alloc(DType::U32, 90);
    assert!(draw_advance(&x, &ring, &inputs, &state, &window, &scratch).is_ok());
    let says = |r: Result<Dispatch>, arg: &str| {
        let e = r.expect_err(arg).to_string();
        assert!(e.contains("draw_advance") && e.contains(arg), "{arg}: {e}");
    };
    says(
        draw_advance(&x, &ring, &inputs, &alloc(DType::I32, 9), &window, &scratch),
        "state",
    );
    says(
        draw_advance(&x, &ring, &inputs, &state, &alloc(DType::I32, 64), &scratch),
        "window",
    );
    says(
        draw_advance(&x, &ring, &inputs, &state, &window, &alloc(DType::U32, 89)),
        "scratch",
    );
    says(
        draw_advance(&x, &ring, &alloc(DType::I32, 4), &state, &window, &scratch),
        "inputs",
    );
    says(
        draw_advance(
            &dev.alloc(DType::F32, &[2, 5]).unwrap(),
            &ring,
            &inputs,
            &state,
            &window,
            &scratch,
        ),
        "x",
    );
    says(
        draw_advance(&x, &ring, &inputs, &state, &window, &ring),
        "scratch",
    );
}

/// Runs `steps` row draws over `rows` (one logits row and history each, the settings of
/// `configs()` in turn); returns each step's tokens and the states after.
fn device_row_draws(
    dev: &Device,
    rows: &[Vec<f32>],
    histories: &[Vec<u32>],
    steps: usize,
) -> (Vec<Vec<i32>>, Vec<DrawState>) {
    let (r, n) = (rows.len(), rows[0].len());
    let configs = configs();
    let states: Vec<DrawState> = (0..r)
        .map(|i| {
            DrawState::new(
                &configs[i % configs.len()],
                77 + i as u64,
                histories[i].len(),
            )
        })
        .collect::<Result<_>>()
        .unwrap();
    let words: Vec<u32> = states.iter().flat_map(|s| s.words()).collect();
    let windows: Vec<i32> = states
        .iter()
        .zip(histories)
        .flat_map(|(s, h)| s.window_of(h))
        .collect();
    let x = dev.upload(&rows.concat(), &[r, n]).unwrap();
    let state = dev.upload(&words, &[r, DRAW_STATE_WORDS]).unwrap();
    let window = dev.upload(&windows, &[r, DRAW_WINDOW]).unwrap();
    let scratch = dev.alloc(DType::U32, &[r, draw_scratch_len(n)]).unwrap();
    let out = dev.upload(&vec![-7i32; r], &[r]).unwrap();
    let tokens = (0..steps)
        .map(|_| {
            run_direct(dev, |s| s.draw_rows(&x, &state, &window, &scratch, &out));
            dev.download::<i32>(&out).unwrap()
        })
        .collect();
    let after = dev.download::<u32>(&state).unwrap();
    let after = after
        .chunks_exact(DRAW_STATE_WORDS)
        .map(|w| DrawState::from_words(w.try_into().unwrap()))
        .collect();
    (tokens, after)
}

#[test]
fn each_row_draws_as_its_own_sampler_would() {
    let dev = Device::cpu(2).unwrap();
    let n = 3000;
    let rows: Vec<Vec<f32>> = (0..7).map(|i| random_f32(n, 5.0, 90 + i)).collect();
    let histories: Vec<Vec<u32>> = (0..7u32)
        .map(|i| (0..10 + 3 * i).map(|j| (j * 37 + i) % n as u32).collect())
        .collect();
    let (tokens, after) = device_row_draws(&dev, &rows, &histories, 4);
    let configs = configs();
    for (i, (row, history)) in rows.iter().zip(&histories).enumerate() {
        let cfg = &configs[i % configs.len()];
        let mut host = Sampler::with_state(cfg.clone(), 77 + i as u64).unwrap();
        let mut seen = history.clone();
        for (step, drawn) in tokens.iter().enumerate() {
            let t = host.sample(row, &seen).unwrap();
            seen.push(t);
            assert_eq!(drawn[i], t as i32, "row {i}, step {step}: {cfg:?}");
        }
        assert_eq!(after[i].rng, host.state(), "row {i}: the generator");
        assert_eq!(
            after[i].history as usize,
            seen.len(),
            "row {i}: the history"
        );
    }
}

#[test]
fn draw_rows_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let alloc = |dt: DType, n: usize| dev.alloc(dt, &[n]).unwrap();
    let x = dev.alloc(DType::F32, &[3, 10]).unwrap();
    let state = alloc(DType::U32, 3 * DRAW_STATE_WORDS);
    let window = alloc(DType::I32, 3 * DRAW_WINDOW);
    let scratch = alloc(DType::U32, 270);
    let out = alloc(DType::I32, 3);
    assert!(draw_rows(&x, &state, &window, &scratch, &out).is_ok());
    let says = |r: Result<Dispatch>, arg: &str| {
        let e = r.expect_err(arg).to_string();
        assert!(e.contains("draw_rows") && e.contains(arg), "{arg}: {e}");
    };
    let state2 = alloc(DType::U32, 2 * DRAW_STATE_WORDS);
    says(draw_rows(&x, &state2, &window, &scratch, &out), "state");
    let window2 = alloc(DType::I32, 2 * DRAW_WINDOW);
    says(draw_rows(&x, &state, &window2, &scratch, &out), "window");
    says(
        draw_rows(&x, &state, &window, &alloc(DType::U32, 269), &out),
        "scratch",
    );
    says(
        draw_rows(&x, &state, &window, &scratch, &alloc(DType::I32, 2)),
        "out",
    );
    says(
        draw_rows(&x, &state, &window, &scratch, &alloc(DType::U32, 3)),
        "out",
    );
    says(draw_rows(&x, &state, &window, &scratch, &scratch), "out");
}
