//! `program-aware-fairness` (llm-d's): a flow-control fairness policy that
//! serves the program (fairness id, `x-gateway-inference-fairness-id`) that
//! has received the least service lately — Least Attained Service (`las`,
//! llm-d's only strategy).
//!
//! ```text
//! attained service S(p) = Σ over p's completed requests of
//!                         (prompt tokens + 2 · completion tokens),
//!                         halved every lasHalfLifeSeconds of wall-clock time
//!                         (0: never decays)
//! among the band's non-empty flows, with W = how long the flow's head request
//! has waited, and norm(x) = (x − min) / (max − min) over those flows
//! (0.5 when all are equal):
//! score = lasWeightService · (1 − norm(S)) + lasWeightHeadWait · norm(W)
//! the highest score dispatches (ties: the first flow by id)
//! ```
//!
//! Service is learned from the token usage of each response (a response
//! hook). A program with no completion for `evictionTtlSeconds` (0: never)
//! is forgotten, checked every `evictionSweepSeconds` as picks and
//! completions happen (no timer of its own; llm-d also skips programs with
//! requests in flight, this one does not track them).
//!
//! Metrics (llm-d's names, read at scrape time):
//! - `llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id}`: the
//!   cumulative mean of a program's queue wait, its head request's wait each
//!   time the policy picks its flow;
//! - `llm_d_epp_program_aware_jains_fairness_index`: Jain's index over those
//!   means, `(Σx)² / (n · Σx²)` over the n programs with a wait observed (1
//!   when n < 2 or all waits are 0);
//! - `llm_d_epp_program_aware_attained_service_tokens{program_id}`: S(p),
//!   decayed to the scrape (llm-d's gauge holds the value of the last
//!   completion).
//!
//! Program ids come from requests: the first
//! [`MAX_LABEL_VALUES`](epp_core::MAX_LABEL_VALUES) get series of their own,
//! later ones still count in the index.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use epp_core::{
    BuildError, Endpoint, FOLDED_LABEL, InferenceRequest, LabelCap, MetricFamily, MetricSink,
    Plugin, PluginMetrics, ResponseHooks, Usage,
    flow::{FairnessCursor, FairnessPolicy, FlowHead},
};
use parking_lot::Mutex;

use crate::{Builtin, invalid};

/// Parameters of `program-aware-fairness` (llm-d's names and defaults).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProgramAwareParams {
    /// `las` (the only strategy).
    #[serde(default = "las")]
    pub strategy: String,
    /// Weight of the inverted attained service. Default 0.8; ≥ 0.
    #[serde(default = "w_service")]
    pub las_weight_service: f64,
    /// Weight of the head request's wait. Default 0.2; ≥ 0.
    #[serde(default = "w_wait")]
    pub las_weight_head_wait: f64,
    /// Half-life of attained service in seconds. Default 60; 0 = no decay.
    #[serde(default = "half_life")]
    pub las_half_life_seconds: f64,
    /// A program with no completion for this long is forgotten. Default
    /// 3600; 0 = never.
    #[serde(default = "ttl")]
    pub eviction_ttl_seconds: f64,
    /// How often forgotten programs are looked for. Default 300; > 0.
    #[serde(default = "sweep")]
    pub eviction_sweep_seconds: f64,
}

fn las() -> String {
    "las".into()
}
fn w_service() -> f64 {
    0.8
}
fn w_wait() -> f64 {
    0.2
}
fn half_life() -> f64 {
    60.0
}
fn ttl() -> f64 {
    3600.0
}
fn sweep() -> f64 {
    300.0
}

const AVG_WAIT: MetricFamily = MetricFamily {
    name: "llm_d_epp_program_aware_avg_wait_time_milliseconds",
    help: "Cumulative mean of flow-control queue wait time per program in milliseconds",
};
const FAIRNESS_INDEX: MetricFamily = MetricFamily {
    name: "llm_d_epp_program_aware_jains_fairness_index",
    help: "Jain's fairness index over average wait time across active programs",
};
const ATTAINED_SERVICE: MetricFamily = MetricFamily {
    name: "llm_d_epp_program_aware_attained_service_tokens",
    help: "Time-decayed attained service (weighted tokens consumed) per program",
};

/// One program's attained service and queue waits.
#[derive(Debug, Clone, Copy)]
struct Program {
    service: f64,
    /// When `service` was last decayed.
    anchor: Instant,
    last_completion: Instant,
    /// Cumulative mean wait of its picked heads, in ms, over `waits` picks.
    mean_wait_ms: f64,
    waits: u64,
}

impl Program {
    fn new(now: Instant) -> Self {
        Self {
            service: 0.0,
            anchor: now,
            last_completion: now,
            mean_wait_ms: 0.0,
            waits: 0,
        }
    }
}

#[derive(Debug)]
struct State {
    programs: HashMap<String, Program>,
    last_sweep: Instant,
}

/// `program-aware-fairness`: see the module docs.
#[derive(Debug)]
pub struct ProgramAwareFairness {
    name: String,
    weight_service: f64,
    weight_wait: f64,
    half_life: f64,
    ttl: Option<Duration>,
    sweep: Duration,
    state: Mutex<State>,
    program_labels: LabelCap,
}

impl Builtin for ProgramAwareFairness {
    const TYPE: &'static str = "program-aware-fairness";
    type Params = ProgramAwareParams;

    /// # Errors
    /// A strategy other than `las`, a negative weight, half-life or TTL, or
    /// a sweep period that is not positive (llm-d's checks).
    fn build(name: impl Into<String>, p: ProgramAwareParams) -> Result<Self, BuildError> {
        if p.strategy != "las" {
            return Err(invalid(
                Self::TYPE,
                "strategy",
                &p.strategy,
                "only las is supported",
            ));
        }
        for (field, v) in [
            ("lasWeightService", p.las_weight_service),
            ("lasWeightHeadWait", p.las_weight_head_wait),
            ("lasHalfLifeSeconds", p.las_half_life_seconds),
            ("evictionTtlSeconds", p.eviction_ttl_seconds),
        ] {
            if v < 0.0 || !v.is_finite() {
                return Err(invalid(Self::TYPE, field, v, "must be >= 0"));
            }
        }
        if p.eviction_sweep_seconds <= 0.0 || !p.eviction_sweep_seconds.is_finite() {
            return Err(invalid(
                Self::TYPE,
                "evictionSweepSeconds",
                p.eviction_sweep_seconds,
                "must be > 0",
            ));
        }
        // Finite is not enough: a Duration holds at most ~5.8e11 years.
        let seconds = |field: &str, v: f64| {
            Duration::try_from_secs_f64(v)
                .map_err(|_| invalid(Self::TYPE, field, v, "is too long a duration"))
        };
        let ttl = (p.eviction_ttl_seconds > 0.0)
            .then(|| seconds("evictionTtlSeconds", p.eviction_ttl_seconds))
            .transpose()?;
        let sweep = seconds("evictionSweepSeconds", p.eviction_sweep_seconds)?;
        Ok(Self {
            name: name.into(),
            weight_service: p.las_weight_service,
            weight_wait: p.las_weight_head_wait,
            half_life: p.las_half_life_seconds,
            ttl,
            sweep,
            state: Mutex::new(State {
                programs: HashMap::new(),
                last_sweep: Instant::now(),
            }),
            program_labels: LabelCap::default(),
        })
    }
}

impl ProgramAwareFairness {
    /// `program`'s attained service at `now`, decayed.
    fn service(&self, st: &mut State, program: &str, now: Instant) -> f64 {
        let Some(p) = st.programs.get_mut(program) else {
            return 0.0;
        };
        self.decay(p, now);
        p.service
    }

    fn decay(&self, p: &mut Program, now: Instant) {
        let elapsed = now.saturating_duration_since(p.anchor).as_secs_f64();
        if elapsed > 0.0 && self.half_life > 0.0 {
            p.service *= (-elapsed / self.half_life).exp2();
        }
        p.anchor = p.anchor.max(now);
    }

    /// Forgets programs idle past the TTL, at most once per sweep period.
    fn sweep(&self, st: &mut State, now: Instant) {
        let Some(ttl) = self.ttl else { return };
        if now.saturating_duration_since(st.last_sweep) < self.sweep {
            return;
        }
        st.last_sweep = now;
        st.programs
            .retain(|_, p| now.saturating_duration_since(p.last_completion) < ttl);
    }

    /// Adds a completed request's cost to `program` at `now`.
    fn record(&self, program: &str, usage: &Usage, now: Instant) {
        let cost = usage.prompt_tokens as f64 + 2.0 * usage.completion_tokens as f64;
        let mut st = self.state.lock();
        self.sweep(&mut st, now);
        let p = st
            .programs
            .entry(program.to_owned())
            .or_insert_with(|| Program::new(now));
        self.decay(p, now);
        p.service += cost;
        p.last_completion = p.last_completion.max(now);
    }

    /// The flow to dispatch from at `now`.
    fn pick_at(&self, flows: &[FlowHead<'_>], now: Instant) -> Option<usize> {
        if flows.is_empty() {
            return None;
        }
        let mut st = self.state.lock();
        self.sweep(&mut st, now);
        let range = |it: &mut dyn Iterator<Item = f64>| {
            it.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
        };
        let norm = |v: f64, (lo, hi): (f64, f64)| if hi == lo { 0.5 } else { (v - lo) / (hi - lo) };
        let wait = |f: &FlowHead<'_>| now.saturating_duration_since(f.head_enqueued).as_secs_f64();
        let services: Vec<f64> = flows
            .iter()
            .map(|f| self.service(&mut st, f.id, now))
            .collect();
        let s_range = range(&mut services.iter().copied());
        let w_range = range(&mut flows.iter().map(wait));
        let mut best = (0, f64::NEG_INFINITY);
        for (i, (f, &s)) in flows.iter().zip(&services).enumerate() {
            let score = self.weight_service * (1.0 - norm(s, s_range))
                + self.weight_wait * norm(wait(f), w_range);
            if score > best.1 {
                best = (i, score);
            }
        }
        // The picked head leaves the queue now: its wait is observed.
        let picked = &flows[best.0];
        let waited_ms = wait(picked) * 1e3;
        let p = match st.programs.get_mut(&**picked.id) {
            Some(p) => p,
            None => st
                .programs
                .entry(picked.id.to_string())
                .or_insert_with(|| Program::new(now)),
        };
        p.waits += 1;
        p.mean_wait_ms += (waited_ms - p.mean_wait_ms) / p.waits as f64;
        Some(best.0)
    }

    /// Jain's fairness index over the programs' mean waits (1 when fewer
    /// than two have one, or all are 0).
    fn fairness_index(st: &State) -> f64 {
        let (mut sum, mut sum_sq, mut n) = (0.0, 0.0, 0.0);
        for p in st.programs.values().filter(|p| p.waits > 0) {
            sum += p.mean_wait_ms;
            sum_sq += p.mean_wait_ms * p.mean_wait_ms;
            n += 1.0;
        }
        if n < 2.0 || sum_sq == 0.0 {
            1.0
        } else {
            sum * sum / (n * sum_sq)
        }
    }
}

impl PluginMetrics for ProgramAwareFairness {
    fn report(&self, out: &mut dyn MetricSink) {
        let now = Instant::now();
        let mut st = self.state.lock();
        out.gauge(FAIRNESS_INDEX, &[], Self::fairness_index(&st));
        for (id, p) in &mut st.programs {
            let label = self.program_labels.label(id);
            if label == FOLDED_LABEL {
                continue;
            }
            self.decay(p, now);
            out.gauge(ATTAINED_SERVICE, &[("program_id", label)], p.service);
            if p.waits > 0 {
                out.gauge(AVG_WAIT, &[("program_id", label)], p.mean_wait_ms);
            }
        }
    }
}

impl Plugin for ProgramAwareFairness {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_fairness_policy(&self) -> Option<&dyn FairnessPolicy> {
        Some(self)
    }
    fn as_response_hooks(&self) -> Option<&dyn ResponseHooks> {
        Some(self)
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        Some(self)
    }
}

impl FairnessPolicy for ProgramAwareFairness {
    fn pick(&self, flows: &[FlowHead<'_>], _cursor: &mut FairnessCursor) -> Option<usize> {
        self.pick_at(flows, Instant::now())
    }
}

impl ResponseHooks for ProgramAwareFairness {
    fn response_usage(&self, request: &InferenceRequest, _endpoint: &Endpoint, usage: &Usage) {
        self.record(&request.fairness_id, usage, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::test_sink::Sink;

    fn policy(yaml: &str) -> ProgramAwareFairness {
        ProgramAwareFairness::build("p", serde_yaml_ng::from_str(yaml).unwrap()).unwrap()
    }

    fn usage(prompt: u64, completion: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Usage::default()
        }
    }

    fn heads<'a>(ids: &'a [Arc<str>], enqueued: &[Instant]) -> Vec<FlowHead<'a>> {
        ids.iter()
            .zip(enqueued)
            .map(|(id, &e)| FlowHead {
                id,
                len: 1,
                bytes: 0,
                head: (0, 0),
                head_enqueued: e,
            })
            .collect()
    }

    #[test]
    fn the_least_served_program_goes_first() {
        let p = policy("{}");
        let t0 = Instant::now();
        // a: 100 + 2·50 = 200 weighted tokens; b: 10 + 2·5 = 20.
        p.record("a", &usage(100, 50), t0);
        p.record("b", &usage(10, 5), t0);
        let ids: Vec<Arc<str>> = ["a", "b", "c"].map(Arc::from).to_vec();
        let same = [t0; 3];
        // c has received nothing: 0.8 · 1 + 0.2 · 0.5 beats b (0.8 · 0.9 + 0.1).
        assert_eq!(p.pick_at(&heads(&ids, &same), t0), Some(2));
        assert_eq!(p.pick_at(&heads(&ids[..2], &same[..2]), t0), Some(1));
        assert!((p.service(&mut p.state.lock(), "a", t0) - 200.0).abs() < 1e-9);
    }

    #[test]
    fn head_wait_breaks_ties_and_can_outweigh_service() {
        let t0 = Instant::now();
        let ids: Vec<Arc<str>> = ["a", "b"].map(Arc::from).to_vec();
        let now = t0 + Duration::from_secs(10);
        // Equal service: the older head goes first.
        let p = policy("{}");
        assert_eq!(p.pick_at(&heads(&ids, &[now, t0]), now), Some(1));
        // With the weights swapped, b's long wait beats a's lower service.
        let p = policy("{lasWeightService: 0.2, lasWeightHeadWait: 0.8}");
        p.record("b", &usage(1000, 0), t0);
        assert_eq!(p.pick_at(&heads(&ids, &[now, t0]), now), Some(1));
        let p = policy("{}");
        p.record("b", &usage(1000, 0), t0);
        assert_eq!(p.pick_at(&heads(&ids, &[now, t0]), now), Some(0));
    }

    #[test]
    fn service_halves_every_half_life_and_idle_programs_are_forgotten() {
        let p =
            policy("{lasHalfLifeSeconds: 10, evictionTtlSeconds: 100, evictionSweepSeconds: 5}");
        let t0 = Instant::now();
        p.record("a", &usage(400, 0), t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!((p.service(&mut p.state.lock(), "a", at(10)) - 200.0).abs() < 1e-6);
        assert!((p.service(&mut p.state.lock(), "a", at(30)) - 50.0).abs() < 1e-6);
        // New service adds to the decayed value.
        p.record("a", &usage(50, 0), at(30));
        assert!((p.service(&mut p.state.lock(), "a", at(30)) - 100.0).abs() < 1e-6);
        // No completion for 100 s: gone at the next sweep (which another
        // program's pick runs: a picked program is seen again).
        let ids: Vec<Arc<str>> = vec![Arc::from("b")];
        let _ = p.pick_at(&heads(&ids, &[at(120)]), at(120));
        assert!(p.state.lock().programs.contains_key("a"), "70 s idle");
        let _ = p.pick_at(&heads(&ids, &[at(131)]), at(131));
        assert!(!p.state.lock().programs.contains_key("a"), "101 s idle");
        // No decay with a half-life of 0.
        let p = policy("{lasHalfLifeSeconds: 0}");
        p.record("a", &usage(7, 0), t0);
        assert!((p.service(&mut p.state.lock(), "a", at(1000)) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn reports_mean_waits_jains_index_and_service_per_program() {
        let p = policy("{lasHalfLifeSeconds: 0}");
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let index = |p: &ProgramAwareFairness| {
            let mut sink = Sink::default();
            p.report(&mut sink);
            (sink.get(FAIRNESS_INDEX.name, &[]), sink)
        };
        assert_eq!(index(&p).0, Some(1.0), "no program yet: perfectly fair");
        p.record("a", &usage(10, 5), t0);
        let ids: Vec<Arc<str>> = ["a", "b"].map(Arc::from).to_vec();
        // a's head waited 100 ms, then 300 ms; b's 200 ms.
        assert_eq!(p.pick_at(&heads(&ids[..1], &[t0]), at(100)), Some(0));
        assert_eq!(p.pick_at(&heads(&ids[..1], &[at(100)]), at(400)), Some(0));
        assert_eq!(p.pick_at(&heads(&ids[1..], &[at(400)]), at(600)), Some(0));
        let (fairness, sink) = index(&p);
        let wait = |id: &str| sink.get(AVG_WAIT.name, &[id]).unwrap();
        assert!((wait("a") - 200.0).abs() < 1e-6);
        assert!((wait("b") - 200.0).abs() < 1e-6);
        assert!((fairness.unwrap() - 1.0).abs() < 1e-9, "equal means");
        assert_eq!(sink.get(ATTAINED_SERVICE.name, &["a"]), Some(20.0));
        assert_eq!(sink.get(ATTAINED_SERVICE.name, &["b"]), Some(0.0));
        // c waits 800 ms: (200 + 200 + 800)² / (3 · (200² + 200² + 800²)) = 2/3.
        let c: Vec<Arc<str>> = vec![Arc::from("c")];
        let _ = p.pick_at(&heads(&c, &[at(600)]), at(1400));
        assert!((index(&p).0.unwrap() - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn llm_ds_checks() {
        for bad in [
            "{strategy: wfq}",
            "{lasWeightService: -1}",
            "{lasHalfLifeSeconds: -1}",
            "{evictionTtlSeconds: -1}",
            "{evictionSweepSeconds: 0}",
            "{evictionTtlSeconds: 1e300}",
            "{evictionSweepSeconds: 1e300}",
        ] {
            let params: ProgramAwareParams = serde_yaml_ng::from_str(bad).unwrap();
            assert!(ProgramAwareFairness::build("p", params).is_err(), "{bad}");
        }
    }
}
