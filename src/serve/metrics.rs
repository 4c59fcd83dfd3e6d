//! The server's counters, gauges and histograms, and their Prometheus text form (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A Prometheus histogram: counts per bucket (not cumulative here), the sum and the count.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with the given bucket bounds (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Adds one observation.
    pub fn observe(&mut self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            self.counts[i] += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Appends the histogram's lines as metric `name` (cumulative buckets, `+Inf`, sum, count).
    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Everything `/metrics` shows. Shared by the HTTP handlers and the scheduler thread.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    queue_length: AtomicUsize,
    slots_in_use: AtomicUsize,
    slots_total: usize,
    time_to_first_token: Mutex<Histogram>,
    inter_token_latency: Mutex<Histogram>,
}

impl Metrics {
    /// Zeroed metrics for a model of `slots` KV-cache slots.
    pub fn new(slots: usize) -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            queue_length: AtomicUsize::new(0),
            slots_in_use: AtomicUsize::new(0),
            slots_total: slots,
            time_to_first_token: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            inter_token_latency: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
        }
    }

    /// Counts one answered request of `endpoint` (a route, or `other`) with `status`.
    pub fn count_request(&self, endpoint: &'static str, status: u16) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((endpoint, status)).or_insert(0) += 1;
        }
    }

    /// Counts prompt tokens run through the model.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts one generated token, with its latency: from the request's arrival for a first
    /// token, from the token before it otherwise.
    pub fn add_generated_token(&self, first: bool, latency: Duration) {
        self.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let histogram = if first {
            &self.time_to_first_token
        } else {
            &self.inter_token_latency
        };
        if let Ok(mut h) = histogram.lock() {
            h.observe(latency.as_secs_f64());
        }
    }

    /// Requests waiting for a slot (a gauge).
    pub fn queue_length(&self) -> &AtomicUsize {
        &self.queue_length
    }

    /// Sets the number of slots holding a sequence.
    pub fn set_slots_in_use(&self, n: usize) {
        self.slots_in_use.store(n, Ordering::Relaxed);
    }

    /// Slots holding a sequence now.
    pub fn slots_in_use(&self) -> usize {
        self.slots_in_use.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP onepass_requests_total HTTP requests answered, by endpoint and status."
        );
        let _ = writeln!(out, "# TYPE onepass_requests_total counter");
        if let Ok(map) = self.requests.lock() {
            for ((endpoint, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "onepass_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let counters = [
            (
                "onepass_prompt_tokens_total",
                "Prompt tokens run through the model.",
                &self.prompt_tokens,
            ),
            (
                "onepass_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        let gauges = [
            (
                "onepass_queue_length",
                "Requests waiting for a KV-cache slot.",
                self.queue_length.load(Ordering::Relaxed),
            ),
            (
                "onepass_slots_in_use",
                "KV-cache slots holding a sequence.",
                self.slots_in_use(),
            ),
            ("onepass_slots_total", "KV-cache slots.", self.slots_total),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        }
        if let Ok(h) = self.time_to_first_token.lock() {
            h.render(
                "onepass_time_to_first_token_seconds",
                "From a request's arrival to its first generated token.",
                &mut out,
            );
        }
        if let Ok(h) = self.inter_token_latency.lock() {
            h.render(
                "onepass_inter_token_latency_seconds",
                "Between consecutive generated tokens of a sequence.",
                &mut out,
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line that starts with `key ` in a rendered text.
    fn sample(text: &str, key: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no sample {key} in\n{text}"));
        line[key.len() + 1..].parse().unwrap()
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render("lat", "help", &mut out);
        assert_eq!(sample(&out, "lat_bucket{le=\"0.1\"}"), 1.0);
        assert_eq!(sample(&out, "lat_bucket{le=\"1\"}"), 3.0);
        assert_eq!(sample(&out, "lat_bucket{le=\"+Inf\"}"), 4.0);
        assert!((sample(&out, "lat_sum") - 4.25).abs() < 1e-12);
        assert_eq!(sample(&out, "lat_count"), 4.0);
        assert!(out.contains("# TYPE lat histogram"));
    }

    #[test]
    fn every_metric_is_in_the_text_with_its_type() {
        let m = Metrics::new(8);
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 400);
        m.add_prompt_tokens(12);
        m.add_generated_token(true, Duration::from_millis(30));
        m.add_generated_token(false, Duration::from_millis(2));
        m.add_generated_token(false, Duration::from_millis(3));
        m.queue_length().store(3, Ordering::Relaxed);
        m.set_slots_in_use(5);
        let t = m.render();
        let req = "onepass_requests_total{endpoint=\"/v1/completions\",status=\"200\"}";
        assert_eq!(sample(&t, req), 2.0);
        let bad = "onepass_requests_total{endpoint=\"/v1/completions\",status=\"400\"}";
        assert_eq!(sample(&t, bad), 1.0);
        assert_eq!(sample(&t, "onepass_prompt_tokens_total"), 12.0);
        assert_eq!(sample(&t, "onepass_generated_tokens_total"), 3.0);
        assert_eq!(sample(&t, "onepass_queue_length"), 3.0);
        assert_eq!(sample(&t, "onepass_slots_in_use"), 5.0);
        assert_eq!(sample(&t, "onepass_slots_total"), 8.0);
        assert_eq!(sample(&t, "onepass_time_to_first_token_seconds_count"), 1.0);
        assert_eq!(sample(&t, "onepass_inter_token_latency_seconds_count"), 2.0);
        assert_eq!(
            sample(
                &t,
                "onepass_inter_token_latency_seconds_bucket{le=\"0.005\"}"
            ),
            2.0
        );
        // Every sample line belongs to a metric whose type was declared before it.
        let mut declared = Vec::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap().to_owned());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(
                    declared.iter().any(|d| name.starts_with(d.as_str())),
                    "{line}"
                );
            }
        }
    }
}
