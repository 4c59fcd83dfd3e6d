//! The scheduler against a test double of [`SlotModel`]: a small deterministic model whose next
//! token depends only on its own slot's history, which checks every call against the trait's
//! contract and logs what it was asked to do.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;
use crate::model::sampler::{Sampler, SamplerConfig};
use crate::serve::sequence::{FinishReason, Sampling};

/// The double's vocabulary: 0 ends a generation, 1 to 26 are `a` to `z`, 27 is a space, 28 and
/// 29 are the two bytes of `é`, 30 makes the next token 0, 31 fails a prefill, 32 fails every decode
/// step of a slot that holds it; the rest are `.`.
const VOCAB: usize = 40;
const END: u32 = 0;
const THEN_END: u32 = 30;
const BAD_PREFILL: u32 = 31;
const BAD_DECODE: u32 = 32;

/// One call the double received.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Prefill { slot: usize, tokens: usize },
    Decode { slots: Vec<usize> },
}

/// The test double.
struct Double {
    slots: Vec<Vec<u32>>,
    slot_ctx: usize,
    max_chunk: usize,
    max_rows: usize,
    step_delay: Duration,
    log: Arc<Mutex<Vec<Call>>>,
    /// Whether rows that ask for a device draw get one (as a model that draws on the device
    /// answers), or their logits (as one that cannot).
    draws: bool,
    /// How many rows it drew.
    drawn: Arc<AtomicUsize>,
}

/// The double's next token after `history`: a hash of the whole history, never the end token
/// unless the last token asks for it.
fn next_token(history: &[u32]) -> u32 {
    if history.last() == Some(&THEN_END) {
        return END;
    }
    let mut h: u64 = 7;
    for &t in history {
        h = h.wrapping_mul(31).wrapping_add(u64::from(t) + 1);
    }
    1 + (h % 29) as u32 // letters, the space and the two halves of `é`
}

/// Logits whose largest value is the next token's.
fn logits_for(history: &[u32]) -> Vec<f32> {
    let next = next_token(history) as usize;
    (0..VOCAB)
        .map(|i| if i == next { 8.0 } else { -(i as f32) / 10.0 })
        .collect()
}

impl SlotModel for Double {
    fn slots(&self) -> usize {
        self.slots.len()
    }
    fn slot_ctx(&self) -> usize {
        self.slot_ctx
    }
    fn vocab(&self) -> usize {
        VOCAB
    }
    fn max_chunk(&self) -> usize {
        self.max_chunk
    }
    fn max_rows(&self) -> usize {
        self.max_rows
    }
    fn prefill(&mut self, slot: usize, tokens: &[u32], pos0: usize) -> Result<Vec<f32>> {
        self.log.lock().unwrap().push(Call::Prefill {
            slot,
            tokens: tokens.len(),
        });
        assert!(!tokens.is_empty() && tokens.len() <= self.max_chunk);
        if pos0 == 0 {
            self.slots[slot].clear();
        }
        assert_eq!(pos0, self.slots[slot].len(), "prefill at the slot's length");
        assert!(pos0 + tokens.len() <= self.slot_ctx);
        if tokens.contains(&BAD_PREFILL) {
            return Err(Error::InvalidArgument(
                "the double's bad prefill token".into(),
            ));
        }
        std::thread::sleep(self.step_delay);
        self.slots[slot].extend_from_slice(tokens);
        Ok(logits_for(&self.slots[slot]))
    }
    fn decode(&mut self, rows: &[StepRow]) -> Result<Vec<RowOutput>> {
        self.log.lock().unwrap().push(Call::Decode {
            slots: rows.iter().map(|r| r.slot).collect(),
        });
        assert!(!rows.is_empty() && rows.len() <= self.max_rows);
        // Rows of one slot (a prompt's tokens) come in position order; a row at position 0
        // starts the slot afresh, as a prefill from position 0 does.
        let mut seen: Vec<(usize, usize)> = rows.iter().map(|r| (r.slot, r.pos)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            rows.len(),
            "each row a different slot or position"
        );
        if rows
            .iter()
            .any(|r| self.slots[r.slot].contains(&BAD_DECODE))
        {
            return Err(Error::InvalidArgument(
                "the double's bad decode token".into(),
            ));
        }
        std::thread::sleep(self.step_delay);
        let mut out = Vec::new();
        for r in rows {
            let history = &mut self.slots[r.slot];
            if r.pos == 0 {
                history.clear();
            }
            assert_eq!(r.pos, history.len(), "decode at the slot's length");
            assert!(r.pos < self.slot_ctx);
            history.push(r.token);
            out.push(match &r.pick {
                Pick::Greedy => RowOutput::Token(next_token(history)),
                // Drawn as the device draws: the sequence's sampler, from the state it sent.
                Pick::Draw(d) if self.draws => {
                    assert_eq!(
                        d.state.history as usize,
                        history.len(),
                        "the draw's history"
                    );
                    let mut sampler = Sampler::with_state(d.state.config(), d.state.rng)?;
                    let token = sampler.sample(&logits_for(history), history)?;
                    self.drawn.fetch_add(1, Ordering::SeqCst);
                    RowOutput::Drawn {
                        token,
                        rng: sampler.state(),
                    }
                }
                Pick::Logits | Pick::Draw(_) => RowOutput::Logits(logits_for(history)),
            });
        }
        Ok(out)
    }
}

/// The double's text side.
struct Letters;

impl TextCodec for Letters {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(|b| u32::from(b % 26) + 1).collect())
    }
    fn token_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        match id {
            0 => {}
            1..=26 => out.push(b'a' + (id - 1) as u8),
            27 => out.push(b' '),
            28 => out.push(0xC3),
            29 => out.push(0xA9),
            _ if (id as usize) < VOCAB => out.push(b'.'),
            _ => return Err(Error::InvalidArgument(format!("token {id} out of range"))),
        }
        Ok(())
    }
    fn is_special(&self, id: u32) -> bool {
        id == END
    }
    fn end_ids(&self) -> Vec<u32> {
        vec![END]
    }
}

/// What the double generates for `prompt` alone: up to `max` tokens, stopping at the end token.
fn expected_tokens(prompt: &[u32], max: usize) -> Vec<u32> {
    let mut history = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max {
        let t = next_token(&history);
        history.push(t);
        out.push(t);
        if t == END {
            break;
        }
    }
    out
}

/// What the double generates for `prompt` alone, `max` tokens, end tokens included.
fn expected_past_end(prompt: &[u32], max: usize) -> Vec<u32> {
    let mut history = prompt.to_vec();
    for _ in 0..max {
        history.push(next_token(&history));
    }
    history[prompt.len()..].to_vec()
}

/// The text of tokens, as the codec gives it.
fn text_of(tokens: &[u32]) -> String {
    let mut bytes = Vec::new();
    for &t in tokens {
        Letters.token_bytes(t, &mut bytes).unwrap();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

struct Setup {
    handle: SchedulerHandle,
    metrics: Arc<Metrics>,
    log: Arc<Mutex<Vec<Call>>>,
}

/// A scheduler over the double whose prompts all take prefill passes.
fn setup(slots: usize, max_chunk: usize, queue: usize, step_delay: Duration) -> Setup {
    setup_mixed(slots, max_chunk, queue, step_delay, 0)
}

/// A scheduler over the double that prefills prompts of at most `mix` tokens in decode steps.
fn setup_mixed(
    slots: usize,
    max_chunk: usize,
    queue: usize,
    step_delay: Duration,
    mix: usize,
) -> Setup {
    let log = Arc::new(Mutex::new(Vec::new()));
    let double = Double {
        slots: vec![Vec::new(); slots],
        slot_ctx: 64,
        max_chunk,
        max_rows: slots,
        step_delay,
        log: log.clone(),
        draws: true,
        drawn: Arc::new(AtomicUsize::new(0)),
    };
    let metrics = Arc::new(Metrics::new(slots));
    let handle = spawn(
        Box::new(double),
        Arc::new(Letters),
        metrics.clone(),
        queue,
        mix,
    )
    .unwrap();
    Setup {
        handle,
        metrics,
        log,
    }
}

fn job(prompt: &[u32], max_tokens: usize) -> (Job, UnboundedReceiver<Event>) {
    let (events, rx) = unbounded_channel();
    let job = Job {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: Sampling::Greedy,
        stop: Vec::new(),
        ignore_eos: false,
        events,
        arrived: Instant::now(),
    };
    (job, rx)
}

/// Waits (at most 10 s) for a job's events to end; gives the text and the last event.
fn collect(rx: &mut UnboundedReceiver<Event>) -> (String, Event) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "no end after 10 s; text so far {text:?}"
        );
        match rx.try_recv() {
            Ok(Event::Text(t)) => {
                assert!(!t.is_empty());
                text.push_str(&t);
            }
            Ok(end) => return (text, end),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("events ended without an end event: {e}"),
        }
    }
}

/// Waits (at most 10 s) until `cond` holds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn sequences_join_and_leave_between_steps_and_each_gets_its_solo_output() {
    let s = setup(3, 4, 8, Duration::from_millis(1));
    let prompts: Vec<(Vec<u32>, usize)> = vec![
        (vec![1, 2, 3], 12),
        (vec![5, 6, 7, 8, 9, 10, 11, 12, 13, 14], 4),
        (vec![20], 20),
        (vec![3, 3], 7),
        (vec![9, 8, 7, 6, 5], 9),
    ];
    let mut receivers = Vec::new();
    for (p, max) in &prompts {
        let (j, rx) = job(p, *max);
        s.handle.submit(j).unwrap();
        receivers.push(rx);
    }
    for ((p, max), rx) in prompts.iter().zip(&mut receivers) {
        let (text, end) = collect(rx);
        let want = expected_tokens(p, *max);
        assert_eq!(text, text_of(&want), "prompt {p:?}");
        let reason = if want.last() == Some(&END) {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        assert_eq!(
            end,
            Event::Done {
                reason,
                prompt_tokens: p.len(),
                completion_tokens: want.len(),
                token_ids: want.clone(),
            }
        );
    }
    let log = s.log.lock().unwrap().clone();
    let widths: Vec<usize> = log
        .iter()
        .filter_map(|c| match c {
            Call::Decode { slots } => Some(slots.len()),
            _ => None,
        })
        .collect();
    assert!(
        widths.contains(&3),
        "three sequences shared a step: {widths:?}"
    );
    assert!(
        widths.contains(&1),
        "steps shrank as sequences left: {widths:?}"
    );
    for call in &log {
        if let Call::Prefill { tokens, .. } = call {
            assert!(*tokens <= 4, "a prefill beyond the chunk size: {log:?}");
        }
    }
    wait_for("the slots to empty", || s.metrics.slots_in_use() == 0);
}

#[test]
fn short_prompts_ride_in_decode_steps_and_answer_as_alone() {
    // Four slots (steps of 4 rows), prompts of at most 5 tokens in decode steps (a prompt of 5
    // spans two steps at least), longer ones in passes of 4.
    let s = setup_mixed(4, 4, 8, Duration::from_millis(1), 5);
    let prompts: Vec<(Vec<u32>, usize)> = vec![
        (vec![1, 2, 3], 10),
        (vec![7], 6),
        (vec![5, 6, 7, 8, 9, 10], 5),
        (vec![3, 30], 4),
        (vec![2, 4, 8, 16, 1], 9),
        (vec![11, 12, 13], 3),
    ];
    let mut receivers = Vec::new();
    for (p, max) in &prompts {
        let (j, rx) = job(p, *max);
        s.handle.submit(j).unwrap();
        receivers.push(rx);
    }
    for ((p, max), rx) in prompts.iter().zip(&mut receivers) {
        let (text, end) = collect(rx);
        let want = expected_tokens(p, *max);
        assert_eq!(text, text_of(&want), "prompt {p:?}");
        match end {
            Event::Done {
                prompt_tokens,
                token_ids,
                ..
            } => {
                assert_eq!(prompt_tokens, p.len(), "prompt {p:?}");
                assert_eq!(token_ids, want, "prompt {p:?}");
            }
            other => panic!("prompt {p:?} ended with {other:?}"),
        }
    }
    let log = s.log.lock().unwrap().clone();
    // Only the 6-token prompt took prefill passes (4 + 2 tokens); the short ones rode in steps.
    let passes: Vec<usize> = log
        .iter()
        .filter_map(|c| match c {
            Call::Prefill { tokens, .. } => Some(*tokens),
            _ => None,
        })
        .collect();
    assert_eq!(passes, vec![4, 2], "{log:?}");
    // Some step held two rows of one slot (a prompt's tokens beside each other).
    assert!(
        log.iter().any(|c| match c {
            Call::Decode { slots } => {
                let mut v = slots.clone();
                v.sort_unstable();
                v.windows(2).any(|w| w[0] == w[1])
            }
            _ => false,
        }),
        "{log:?}"
    );
    wait_for("the slots to empty", || s.metrics.slots_in_use() == 0);
}

#[test]
fn a_long_prompt_delays_running_streams_by_at_most_one_chunk_per_step() {
    let s = setup(2, 4, 8, Duration::from_millis(1));
    let (short, mut short_rx) = job(&[1, 2], 30);
    s.handle.submit(short).unwrap();
    // Wait until the short one decodes, then send a 40-token prompt (10 chunks).
    wait_for("the first stream's text", || !short_rx.is_empty());
    let long: Vec<u32> = (0..40).map(|i| 1 + i % 26).collect();
    let (long_job, mut long_rx) = job(&long, 3);
    s.handle.submit(long_job).unwrap();
    let (long_text, _) = collect(&mut long_rx);
    assert_eq!(long_text, text_of(&expected_tokens(&long, 3)));
    let (short_text, _) = collect(&mut short_rx);
    assert_eq!(short_text, text_of(&expected_tokens(&[1, 2], 30)));
    let log = s.log.lock().unwrap().clone();
    let long_prefills: Vec<usize> = log
        .iter()
        .enumerate()
        .filter_map(|(i, c)| matches!(c, Call::Prefill { tokens: 4, .. }).then_some(i))
        .collect();
    assert_eq!(long_prefills.len(), 10, "{log:?}");
    for pair in long_prefills.windows(2) {
        // Between two chunks of the long prompt, the short stream got a decode step.
        assert!(
            log[pair[0] + 1..pair[1]]
                .iter()
                .any(|c| matches!(c, Call::Decode { .. })),
            "{log:?}"
        );
    }
}

#[test]
fn a_full_queue_refuses_with_429_and_a_free_slot_takes_the_next_job() {
    let s = setup(1, 8, 1, Duration::from_millis(5));
    let (a, mut a_rx) = job(&[1], 30);
    s.handle.submit(a).unwrap();
    wait_for("the first job to take the slot", || {
        s.metrics.slots_in_use() == 1
    });
    let (b, mut b_rx) = job(&[2], 3);
    s.handle.submit(b).unwrap();
    let (c, _c_rx) = job(&[3], 3);
    let refused = s.handle.submit(c).unwrap_err();
    assert_eq!(refused.status.as_u16(), 429);
    assert!(refused.message.contains("queue"), "{refused}");
    assert_eq!(s.metrics.queue_length().load(Ordering::SeqCst), 1);
    assert_eq!(collect(&mut a_rx).0, text_of(&expected_tokens(&[1], 30)));
    assert_eq!(collect(&mut b_rx).0, text_of(&expected_tokens(&[2], 3)));
    assert_eq!(s.metrics.queue_length().load(Ordering::SeqCst), 0);
}

#[test]
fn a_client_that_goes_frees_its_slot_within_one_decode_step() {
    let s = setup(2, 8, 4, Duration::from_millis(2));
    let (a, mut a_rx) = job(&[4, 4], 60);
    let (b, mut b_rx) = job(&[5], 40);
    s.handle.submit(a).unwrap();
    s.handle.submit(b).unwrap();
    wait_for("both to decode", || {
        s.log
            .lock()
            .unwrap()
            .iter()
            .any(|c| matches!(c, Call::Decode { slots } if slots.len() == 2))
    });
    assert!(matches!(a_rx.blocking_recv(), Some(Event::Text(_))));
    drop(a_rx);
    let steps_at_drop = s.log.lock().unwrap().len();
    assert_eq!(collect(&mut b_rx).0, text_of(&expected_tokens(&[5], 40)));
    let log = s.log.lock().unwrap().clone();
    let with_a = log[steps_at_drop..]
        .iter()
        .filter(|c| matches!(c, Call::Decode { slots } if slots.contains(&0)))
        .count();
    assert!(with_a <= 1, "the abandoned slot ran {with_a} more steps");
    wait_for("the slots to empty", || s.metrics.slots_in_use() == 0);
    // The freed slot serves the next job.
    let (c, mut c_rx) = job(&[6], 5);
    s.handle.submit(c).unwrap();
    assert_eq!(collect(&mut c_rx).0, text_of(&expected_tokens(&[6], 5)));
}

#[test]
fn a_failing_request_fails_alone() {
    let s = setup(3, 8, 8, Duration::from_millis(1));
    let (good, mut good_rx) = job(&[7, 8, 9], 15);
    let (bad_prefill, mut bad_prefill_rx) = job(&[1, BAD_PREFILL, 2], 5);
    // Its first token comes from the prefill; its first decode step fails.
    let (bad_decode, mut bad_decode_rx) = job(&[3, BAD_DECODE], 5);
    let (too_long, mut too_long_rx) = job(&[1; 60], 10);
    let (bad_token, mut bad_token_rx) = job(&[1, 999], 5);
    for j in [good, bad_prefill, bad_decode, too_long, bad_token] {
        s.handle.submit(j).unwrap();
    }
    let (_, end) = collect(&mut bad_prefill_rx);
    assert!(
        matches!(end, Event::Failed(e) if e.status.as_u16() == 500 && e.message.contains("prefill"))
    );
    let (_, end) = collect(&mut too_long_rx);
    assert!(
        matches!(&end, Event::Failed(e) if e.status.as_u16() == 400
        && e.code == Some("context_length_exceeded")),
        "{end:?}"
    );
    let (_, end) = collect(&mut bad_token_rx);
    assert!(
        matches!(&end, Event::Failed(e) if e.message.contains("999")),
        "{end:?}"
    );
    // Only the bad decode row fails: the first token came from its prefill.
    let (text, end) = collect(&mut bad_decode_rx);
    assert_eq!(text, text_of(&expected_tokens(&[3, BAD_DECODE], 1)));
    assert!(
        matches!(&end, Event::Failed(e) if e.message.contains("decode")),
        "{end:?}"
    );
    let (text, end) = collect(&mut good_rx);
    assert_eq!(text, text_of(&expected_tokens(&[7, 8, 9], 15)));
    assert!(matches!(end, Event::Done { .. }));
    wait_for("the slots to empty", || s.metrics.slots_in_use() == 0);
}

#[test]
fn end_tokens_stop_strings_and_sampling_end_sequences_as_asked() {
    let s = setup(2, 8, 8, Duration::ZERO);
    // The end token after the prompt's last token: no text, finish reason stop, one token.
    let (j, mut rx) = job(&[2, THEN_END], 10);
    s.handle.submit(j).unwrap();
    let (text, end) = collect(&mut rx);
    assert_eq!(text, "");
    assert!(matches!(
        end,
        Event::Done {
            reason: FinishReason::Stop,
            completion_tokens: 1,
            ..
        }
    ));
    // The same past the end token: it is generated (as no text) and the text goes on.
    let (mut j, mut rx) = job(&[2, THEN_END], 4);
    j.ignore_eos = true;
    s.handle.submit(j).unwrap();
    let (text, end) = collect(&mut rx);
    assert_eq!(text, text_of(&expected_past_end(&[2, THEN_END], 4)));
    assert!(matches!(
        end,
        Event::Done {
            reason: FinishReason::Length,
            completion_tokens: 4,
            ..
        }
    ));
    // A stop string taken from the middle of the expected text: the text ends before it.
    let prompt = [11, 12];
    let full = text_of(&expected_tokens(&prompt, 30));
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[6..9].iter().collect();
    let (mut j, mut rx) = job(&prompt, 30);
    j.stop = vec![stop.clone()];
    s.handle.submit(j).unwrap();
    let (text, end) = collect(&mut rx);
    assert_eq!(text, full[..full.find(&stop).unwrap()]);
    assert!(matches!(
        end,
        Event::Done {
            reason: FinishReason::Stop,
            ..
        }
    ));
    // Sampling at a low temperature follows the logits' clear favourite.
    let (mut j, mut rx) = job(&prompt, 12);
    j.sampling = Sampling::Sample(SamplerConfig {
        temperature: 0.05,
        seed: 3,
        ..SamplerConfig::default()
    });
    s.handle.submit(j).unwrap();
    assert_eq!(collect(&mut rx).0, text_of(&expected_tokens(&prompt, 12)));
}

#[test]
fn shutting_down_ends_running_jobs_and_refuses_new_ones() {
    let s = setup(1, 8, 4, Duration::from_millis(2));
    let (a, mut a_rx) = job(&[1], 60);
    let (b, mut b_rx) = job(&[2], 60);
    s.handle.submit(a).unwrap();
    s.handle.submit(b).unwrap();
    wait_for("the first job to run", || s.metrics.slots_in_use() == 1);
    s.handle.abort();
    let (c, _c_rx) = job(&[3], 3);
    assert_eq!(s.handle.submit(c).unwrap_err().status.as_u16(), 503);
    for rx in [&mut a_rx, &mut b_rx] {
        let (_, end) = collect(rx);
        assert!(matches!(end, Event::Failed(e) if e.status.as_u16() == 503));
    }
    assert!(s.handle.is_running());
    s.handle.stop().unwrap();
}

#[test]
fn a_character_split_across_tokens_streams_whole_and_stop_text_is_held() {
    let metrics = Metrics::new(1);
    let (mut j, mut rx) = job(&[1], 10);
    j.stop = vec!["bz".into()];
    let mut seq = Sequence::new(j, 0).unwrap();
    // `a`, the two bytes of `é` as two tokens, `b` (held: it may start `bz`), `c`.
    for t in [1, 28, 29, 2, 3] {
        assert_eq!(seq.accept(t, &Letters, &[END], 64, &metrics).unwrap(), None);
    }
    let mut pieces = Vec::new();
    while let Ok(Event::Text(t)) = rx.try_recv() {
        pieces.push(t);
    }
    assert_eq!(pieces, ["a", "é", "bc"]);
    // `b` then `z`: the stop string ends the sequence and none of it is sent.
    let reason = [2, 26]
        .into_iter()
        .find_map(|t| seq.accept(t, &Letters, &[END], 64, &metrics).unwrap());
    assert_eq!(reason, Some(FinishReason::Stop));
    assert!(matches!(
        rx.try_recv(),
        Ok(Event::Done {
            reason: FinishReason::Stop,
            completion_tokens: 7,
            ..
        })
    ));
}

#[test]
fn warming_up_runs_every_bucket_size_once_within_the_contract() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut double = Double {
        slots: vec![Vec::new(); 6],
        slot_ctx: 64,
        max_chunk: 4,
        max_rows: 6,
        step_delay: Duration::ZERO,
        log: log.clone(),
        draws: true,
        drawn: Arc::new(AtomicUsize::new(0)),
    };
    assert_eq!(warm_up(&mut double).unwrap(), 4);
    let widths: Vec<usize> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|c| match c {
            Call::Decode { slots } => Some(slots.len()),
            _ => None,
        })
        .collect();
    // Each size twice: a greedy step, then one whose rows draw on the device.
    assert_eq!(widths, [1, 1, 2, 2, 4, 4, 6, 6]);
    assert_eq!(double.drawn.load(Ordering::SeqCst), 13);
}

#[test]
fn a_burst_fills_every_free_slot_even_with_no_queue_and_the_next_is_refused() {
    let s = setup(3, 8, 0, Duration::from_millis(5));
    let mut receivers = Vec::new();
    for p in [[1u32], [2], [3]] {
        let (j, rx) = job(&p, 20);
        s.handle.submit(j).expect("a free slot takes it");
        receivers.push((p, rx));
    }
    let (j, _rx) = job(&[4], 2);
    assert_eq!(s.handle.submit(j).unwrap_err().status.as_u16(), 429);
    for (p, rx) in &mut receivers {
        assert_eq!(collect(rx).0, text_of(&expected_tokens(p, 20)));
    }
    // Every place is given back when its job ends, however it ends.
    wait_for("the places to be given back", || {
        let (j, _rx) = job(&[5], 1);
        s.handle.submit(j).is_ok()
    });
}

/// The tokens of sampled jobs with `config` (four of them at once, three slots) over a double
/// that draws on the device (`draws`) or gives its logits, and how many rows it drew.
fn sampled_tokens(draws: bool, config: &SamplerConfig) -> (Vec<Vec<u32>>, usize) {
    let drawn = Arc::new(AtomicUsize::new(0));
    let double = Double {
        slots: vec![Vec::new(); 3],
        slot_ctx: 64,
        max_chunk: 8,
        max_rows: 3,
        step_delay: Duration::ZERO,
        log: Arc::new(Mutex::new(Vec::new())),
        draws,
        drawn: drawn.clone(),
    };
    let handle = spawn(
        Box::new(double),
        Arc::new(Letters),
        Arc::new(Metrics::new(3)),
        4,
        4,
    )
    .unwrap();
    let mut receivers = Vec::new();
    for (i, prompt) in [[3u32, 4], [5, 6], [7, 8], [9, 10]].iter().enumerate() {
        let (mut j, rx) = job(prompt, 24);
        j.ignore_eos = true;
        j.sampling = Sampling::Sample(SamplerConfig {
            seed: 100 + i as u64,
            ..config.clone()
        });
        handle.submit(j).unwrap();
        receivers.push(rx);
    }
    let tokens = receivers
        .iter_mut()
        .map(|rx| match collect(rx).1 {
            Event::Done { token_ids, .. } => token_ids,
            other => panic!("the job did not end well: {other:?}"),
        })
        .collect();
    handle.stop().unwrap();
    (tokens, drawn.load(Ordering::SeqCst))
}

#[test]
fn rows_drawn_on_the_device_give_the_host_samplers_tokens() {
    // At most the 20 tokens of the lowest ids besides the favourite: never those that make the
    // double end or fail.
    let hot = SamplerConfig {
        temperature: 5.0,
        top_k: 20,
        ..SamplerConfig::default()
    };
    let penalized = SamplerConfig {
        temperature: 4.0,
        top_k: 12,
        top_p: 0.9,
        repetition_penalty: 1.5,
        penalty_window: 6,
        ..SamplerConfig::default()
    };
    for config in [hot, penalized] {
        let (on_host, none) = sampled_tokens(false, &config);
        let (on_device, drawn) = sampled_tokens(true, &config);
        assert_eq!(none, 0);
        assert_eq!(drawn, 4 * 24, "every token drawn: {config:?}");
        assert_eq!(on_device, on_host, "{config:?}");
        let favourites = expected_tokens(&[3, 4], 24);
        assert_ne!(
            on_host[0], favourites,
            "the temperature made the tokens differ from greedy"
        );
    }
}
