//! Counters and histograms the engine updates as it runs, with vLLM's
//! bucket boundaries.

/// vLLM's time-to-first-token buckets (seconds).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's request latency buckets (seconds): e2e, queue, prefill, decode,
/// inference time.
pub const LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's inter-token / time-per-output-token buckets (seconds).
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's tokens-per-engine-step buckets.
pub const ITERATION_TOKEN_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// vLLM's `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, … up to `max`.
#[must_use]
pub fn buckets_1_2_5(max: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exp = 1u64;
    'outer: loop {
        for m in [1, 2, 5] {
            let v = m * exp;
            if v > max {
                break 'outer;
            }
            out.push(v as f64);
        }
        exp = match exp.checked_mul(10) {
            Some(e) => e,
            None => break,
        };
    }
    out
}

/// A cumulative histogram with fixed upper bounds.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending; +Inf implied).
    #[must_use]
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of observations.
    #[must_use]
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(upper bound, cumulative count)` per bucket, without +Inf.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds
            .iter()
            .zip(&self.counts)
            .scan(0u64, |acc, (b, c)| {
                *acc += c;
                Some((*b, *acc))
            })
    }
}

/// Why a request left the engine, as vLLM's `finished_reason` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model chose to stop (never: the simulator always generates max tokens).
    Stop,
    /// The output reached max tokens.
    Length,
    /// The client went away.
    Abort,
}

impl FinishReason {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// Everything the engine counts.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Prompt tokens of requests whose prefill finished.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Prompt tokens found in the prefix cache.
    pub prefix_hits: u64,
    /// Requests preempted (blocks freed, recomputed later).
    pub preemptions: u64,
    /// KV event batches dropped because the publisher's queue was full.
    pub kv_events_dropped: u64,
    /// Finished requests by reason: stop, length, abort.
    pub finished: [u64; 3],
    /// Engine steps run.
    pub steps: u64,
    /// Adapter loads.
    pub lora_loads: u64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Inter-token latency (one observation per generated token after the first).
    pub itl: Histogram,
    /// End-to-end latency.
    pub e2e: Histogram,
    /// Time from arrival to first admission.
    pub queue: Histogram,
    /// Time from admission to first token.
    pub prefill: Histogram,
    /// Time from first token to the last.
    pub decode: Histogram,
    /// Time from admission to the last token.
    pub inference: Histogram,
    /// Prompt tokens per request.
    pub request_prompt_tokens: Histogram,
    /// Generated tokens per request.
    pub request_generation_tokens: Histogram,
    /// Tokens per engine step.
    pub iteration_tokens: Histogram,
}

impl Stats {
    /// Empty stats; token histograms get buckets up to `max_model_len`.
    #[must_use]
    pub fn new(max_model_len: u64) -> Self {
        let tokens = buckets_1_2_5(max_model_len);
        Self {
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            preemptions: 0,
            kv_events_dropped: 0,
            finished: [0; 3],
            steps: 0,
            lora_loads: 0,
            ttft: Histogram::new(&TTFT_BUCKETS),
            itl: Histogram::new(&ITL_BUCKETS),
            e2e: Histogram::new(&LATENCY_BUCKETS),
            queue: Histogram::new(&LATENCY_BUCKETS),
            prefill: Histogram::new(&LATENCY_BUCKETS),
            decode: Histogram::new(&LATENCY_BUCKETS),
            inference: Histogram::new(&LATENCY_BUCKETS),
            request_prompt_tokens: Histogram::new(&tokens),
            request_generation_tokens: Histogram::new(&tokens),
            iteration_tokens: Histogram::new(&ITERATION_TOKEN_BUCKETS),
        }
    }

    /// Counts one finished request.
    pub fn finish(&mut self, reason: FinishReason) {
        let i = match reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Abort => 2,
        };
        self.finished[i] += 1;
    }

    /// Requests finished for `reason`.
    #[must_use]
    pub fn finished(&self, reason: FinishReason) -> u64 {
        match reason {
            FinishReason::Stop => self.finished[0],
            FinishReason::Length => self.finished[1],
            FinishReason::Abort => self.finished[2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets_stop_at_the_limit() {
        assert_eq!(buckets_1_2_5(100), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(buckets_1_2_5(30), [1.0, 2.0, 5.0, 10.0, 20.0]);
    }

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let c: Vec<_> = h.cumulative().collect();
        assert_eq!(c, [(0.1, 1), (1.0, 2)]);
        assert_eq!(h.count(), 3);
    }
}
