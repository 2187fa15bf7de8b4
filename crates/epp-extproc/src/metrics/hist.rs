//! Histogram bucket bounds, per metric (the reference's), and the
//! lock-free histogram they are recorded in.

pub(crate) use epp_core::{AtomicHistogram, HistogramValue};

// === bucket bounds (the reference's, per metric) ===

/// `N` bounds doubling from 2^`from`, after a leading `1` when `one` (the
/// reference's byte and token buckets).
const fn doubling<const N: usize>(one: bool, from: u32) -> [f64; N] {
    let mut out = [1.0; N];
    let mut i = if one { 1 } else { 0 };
    let mut v = (1u64 << from) as f64;
    while i < N {
        out[i] = v;
        v *= 2.0;
        i += 1;
    }
    out
}

/// Request latency: 5 ms … 1 h.
pub(crate) const LATENCY: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];
/// Time to first token: 5 ms … 2 min.
pub(crate) const TTFT: &[f64] = LATENCY.split_at(24).0;
/// Request bodies: 64 B … 1 GiB.
pub(crate) const REQUEST_BYTES: &[f64] = &doubling::<25>(false, 6);
/// Response bodies: 1 B … 64 KiB (the reference writes 32778 for 32768; we
/// do not copy the typo).
pub(crate) const RESPONSE_BYTES: &[f64] = &doubling::<15>(true, 3);
/// Prompt (and cached prompt) tokens: 1 … 1 Mi.
pub(crate) const INPUT_TOKENS: &[f64] = &doubling::<19>(true, 3);
/// Output tokens: 1 … 8 Ki.
pub(crate) const OUTPUT_TOKENS: &[f64] = &doubling::<12>(true, 3);
/// Latency per output token: 1 ms … 10 s.
pub(crate) const NTPOT: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];
/// Streaming time per output token after the first: 0.5 ms … 2 s.
pub(crate) const TPOT: &[f64] = &[
    0.0005, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6,
    0.8, 1.0, 2.0,
];
/// Between two streamed body chunks: 1 ms … 2 s.
pub(crate) const ITL: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0,
];
/// Time in flow control, enqueue to outcome: 0.1 ms … 60 s.
pub(crate) const QUEUE: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// Flow control's enqueues and dispatch cycles: 0.1 ms … 100 ms.
pub(crate) const FLOW_STEP: &[f64] = &[
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
];
/// Request processing, headers to the decision's answer: 0.5 ms … 10 s.
pub(crate) const REQUEST_PROCESSING: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];
/// Response processing: 0.1 ms … 5 s.
pub(crate) const RESPONSE_PROCESSING: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// How long an ext_proc stream stays open: 1 ms … 10 min.
pub(crate) const STREAM: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Share of the prompt the picked endpoint has cached.
pub(crate) const RATIO: &[f64] = &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
/// Bytes of the prompt the picked endpoint has cached.
pub(crate) const HIT_BYTES: &[f64] = &[
    0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
    65536.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_and_token_bounds_are_the_references() {
        let pow = |e: i32| 2f64.powi(e);
        assert_eq!(REQUEST_BYTES.first(), Some(&64.0));
        assert_eq!(REQUEST_BYTES.last(), Some(&pow(30)));
        assert_eq!(RESPONSE_BYTES[..3], [1.0, 8.0, 16.0]);
        assert_eq!(RESPONSE_BYTES.last(), Some(&65536.0));
        assert_eq!(INPUT_TOKENS.last(), Some(&pow(20)));
        assert_eq!(OUTPUT_TOKENS.last(), Some(&8192.0));
        for b in [REQUEST_BYTES, RESPONSE_BYTES, INPUT_TOKENS, OUTPUT_TOKENS] {
            assert!(b.windows(2).skip(1).all(|w| w[1] == 2.0 * w[0]), "{b:?}");
        }
    }
}
