//! `soft-reflective-ceiling-policy`: lower bands slow down gradually as the
//! pool fills.
//!
//! Rule (llm-d): with `N` bands known to the controller and saturation `s`,
//! band `i` (0 = highest) has the reflective ceiling `1 − i·s/(N − 1)`.
//! Below it the band is open (ceiling 1.0). At or past it, a band other
//! than the highest is closed (0.0) when `s ≥ 1`; otherwise it opens on one
//! call in `period = round(s/(1 − s))` (its own counter), so its dispatch
//! rate falls as saturation rises. The highest band is never held back by
//! this policy. No parameters.

use std::sync::Mutex;

use epp_core::{BuildError, Plugin, flow::UsageLimitPolicy};

use crate::{Builtin, NoParams};

/// `soft-reflective-ceiling-policy`.
#[derive(Debug)]
pub struct SoftReflectiveCeilingPolicy {
    name: String,
    /// Calls seen while gated, per band rank.
    ticks: Mutex<Vec<u64>>,
}

impl Builtin for SoftReflectiveCeilingPolicy {
    const TYPE: &'static str = "soft-reflective-ceiling-policy";
    type Params = NoParams;
    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self {
            name: name.into(),
            ticks: Mutex::new(Vec::new()),
        })
    }
}

impl Plugin for SoftReflectiveCeilingPolicy {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_usage_limit_policy(&self) -> Option<&dyn UsageLimitPolicy> {
        Some(self)
    }
}

impl UsageLimitPolicy for SoftReflectiveCeilingPolicy {
    fn ceilings(&self, saturation: f64, priorities: &[i32], out: &mut Vec<f64>) {
        out.clear();
        let n = priorities.len();
        let mut ticks = self
            .ticks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ticks.len() < n {
            ticks.resize(n, 0);
        }
        let s = if saturation.is_nan() { 1.0 } else { saturation };
        for i in 0..n {
            let reflective = if n > 1 {
                1.0 - i as f64 * s / (n - 1) as f64
            } else {
                1.0
            };
            let open = if i == 0 || s < reflective {
                true
            } else if s >= 1.0 {
                false
            } else {
                let period = (s / (1.0 - s)).round().max(1.0) as u64;
                let t = ticks[i];
                ticks[i] = t.wrapping_add(1);
                t.is_multiple_of(period)
            };
            out.push(if open { 1.0 } else { 0.0 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &SoftReflectiveCeilingPolicy, s: f64, n: usize) -> Vec<f64> {
        let prios: Vec<i32> = (0..n as i32).rev().collect();
        let mut out = Vec::new();
        p.ceilings(s, &prios, &mut out);
        out
    }

    #[test]
    fn open_below_the_reflective_ceiling_closed_when_saturated() {
        let p = SoftReflectiveCeilingPolicy::build("s", NoParams {}).unwrap();
        // N = 3, s = 0.3: ceilings 1, 0.85, 0.7: all open.
        assert_eq!(run(&p, 0.3, 3), [1.0, 1.0, 1.0]);
        // s = 1: only the highest band stays open.
        assert_eq!(run(&p, 1.0, 3), [1.0, 0.0, 0.0]);
        // One band: never gated by the policy.
        assert_eq!(run(&p, 1.0, 1), [1.0]);
    }

    #[test]
    fn past_its_ceiling_a_band_opens_once_per_period() {
        let p = SoftReflectiveCeilingPolicy::build("s", NoParams {}).unwrap();
        // N = 2, s = 0.75: band 1's ceiling is 0.25 ≤ s; period = round(3) = 3.
        let opens: Vec<f64> = (0..9).map(|_| run(&p, 0.75, 2)[1]).collect();
        assert_eq!(opens, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        // The highest band is always open.
        assert_eq!(run(&p, 0.75, 2)[0], 1.0);
    }
}
