//! Recording one scheduling cycle for the decision log, and turning what was
//! recorded into a [`DecisionRecord`].

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use epp_core::{
    Candidate, CycleRecorder, Endpoint, EndpointId, EndpointSnapshot, InferenceRequest, Plugin,
    ProfileRun, Scheduler, SchedulingResult,
};

use super::{
    CandidateRecord, DecisionRecord, EndpointRef, Excluded, PluginId, Refusal, RunRecord, ScorerId,
};
use crate::{error::ExtProcError, trace::CycleEvents};

/// What one recorded cycle made of its candidates, as endpoint ids; names
/// are looked up once, when the record is made.
#[derive(Debug, Default)]
pub(crate) struct CycleDetail {
    /// The endpoints the profile runs started from (`None`: the cycle ended
    /// before any could).
    base: Option<Vec<Arc<Endpoint>>>,
    runs: Vec<RunDetail>,
    current: RunDetail,
}

#[derive(Debug, Default)]
struct RunDetail {
    profile: usize,
    /// Each filter's call site and what it kept.
    filters: Vec<(usize, Vec<EndpointId>)>,
    /// Each scorer's candidates and scores, in the profile's order.
    scores: Vec<(Vec<EndpointId>, Vec<f64>)>,
    /// The candidates the picker saw, with their totals.
    totals: Vec<(EndpointId, f64)>,
    /// What it picked, target first.
    picks: Vec<EndpointId>,
}

fn ids(c: &[Candidate]) -> Vec<EndpointId> {
    c.iter().map(Candidate::id).collect()
}

impl CycleRecorder for CycleDetail {
    fn plugin_call(&mut self, _site: usize, _start: Instant, _end: Instant) {}

    fn profile_run(&mut self, run: ProfileRun) {
        let mut done = std::mem::take(&mut self.current);
        done.profile = run.profile;
        self.runs.push(done);
    }

    fn records_candidates(&self) -> bool {
        true
    }

    fn cycle_candidates(&mut self, candidates: &[Candidate]) {
        self.base = Some(candidates.iter().map(|c| Arc::clone(&c.endpoint)).collect());
    }

    fn filtered(&mut self, site: usize, kept: &[Candidate]) {
        self.current.filters.push((site, ids(kept)));
    }

    fn scored(&mut self, _site: usize, candidates: &[Candidate], _weight: f64, scores: &[f64]) {
        self.current.scores.push((ids(candidates), scores.to_vec()));
    }

    fn picked(
        &mut self,
        _profile: usize,
        candidates: &[Candidate],
        totals: &[f64],
        picks: &[usize],
    ) {
        self.current.totals = candidates
            .iter()
            .zip(totals)
            .map(|(c, &t)| (c.id(), t))
            .collect();
        self.current.picks = picks
            .iter()
            .filter_map(|&i| candidates.get(i))
            .map(Candidate::id)
            .collect();
    }
}

/// Both recorders a request may have: its trace's and the decision log's.
#[derive(Debug)]
pub(crate) struct Recorders<'a> {
    pub(crate) events: Option<&'a mut CycleEvents>,
    pub(crate) detail: Option<&'a mut CycleDetail>,
}

impl CycleRecorder for Recorders<'_> {
    fn plugin_call(&mut self, site: usize, start: Instant, end: Instant) {
        if let Some(e) = self.events.as_deref_mut() {
            e.plugin_call(site, start, end);
        }
    }

    fn profile_run(&mut self, run: ProfileRun) {
        if let Some(e) = self.events.as_deref_mut() {
            e.profile_run(run);
        }
        if let Some(d) = self.detail.as_deref_mut() {
            d.profile_run(run);
        }
    }

    fn records_candidates(&self) -> bool {
        self.detail.is_some()
    }

    fn cycle_candidates(&mut self, candidates: &[Candidate]) {
        if let Some(d) = self.detail.as_deref_mut() {
            d.cycle_candidates(candidates);
        }
    }

    fn filtered(&mut self, site: usize, kept: &[Candidate]) {
        if let Some(d) = self.detail.as_deref_mut() {
            d.filtered(site, kept);
        }
    }

    fn scored(&mut self, site: usize, candidates: &[Candidate], weight: f64, scores: &[f64]) {
        if let Some(d) = self.detail.as_deref_mut() {
            d.scored(site, candidates, weight, scores);
        }
    }

    fn picked(
        &mut self,
        profile: usize,
        candidates: &[Candidate],
        totals: &[f64],
        picks: &[usize],
    ) {
        if let Some(d) = self.detail.as_deref_mut() {
            d.picked(profile, candidates, totals, picks);
        }
    }
}

fn plugin_id(p: &dyn Plugin) -> PluginId {
    PluginId {
        type_name: p.type_name().to_owned(),
        name: p.name().to_owned(),
    }
}

fn endpoint_ref(e: &Endpoint) -> EndpointRef {
    EndpointRef {
        name: e.name().to_owned(),
        address: e.addr_str().to_owned(),
    }
}

impl DecisionRecord {
    /// The request's side of a record: who asked for what, and nothing of
    /// the prompt or the body.
    fn of_request(request: &InferenceRequest) -> Self {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            unix_ms,
            request_id: request.request_id.clone(),
            model: request.model.clone(),
            target_model: request.target_model.clone(),
            objective: request.objective.clone(),
            priority: request.priority,
            fairness_id: request.fairness_id.clone(),
            scheduling_us: 0,
            refused: None,
            targets: Vec::new(),
            prefill: None,
            prefix_hit: 0.0,
            excluded: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// A request refused before it was scheduled (by flow control).
    pub(crate) fn unscheduled(request: &InferenceRequest, err: &ExtProcError) -> Self {
        let mut r = Self::of_request(request);
        r.refuse(err);
        r
    }

    /// Marks the decision refused with `err`.
    pub(crate) fn refuse(&mut self, err: &ExtProcError) {
        self.refused = Some(Refusal {
            status: err.http_status(),
            reason: err.to_string(),
        });
    }
}

impl CycleDetail {
    /// The record of `request`'s decision: the cycle as recorded, over
    /// `snapshot` with `scheduler`, its `result` (`None`: it failed) and how
    /// long it `took`. A failed cycle's record is marked refused by the
    /// caller, who knows the error the client gets.
    pub(crate) fn into_record(
        self,
        scheduler: &Scheduler,
        snapshot: &EndpointSnapshot,
        request: &InferenceRequest,
        result: Option<&SchedulingResult>,
        took: Duration,
    ) -> DecisionRecord {
        let mut record = DecisionRecord::of_request(request);
        record.scheduling_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if let Some(result) = result {
            if let Some(run) = result.primary_run() {
                record.targets = run.targets.iter().map(|e| endpoint_ref(e)).collect();
            }
            record.prefill = result.prefill().map(|e| endpoint_ref(e));
            record.prefix_hit = result.primary_prefix_hit;
        }
        let outside_subset = |e: &Endpoint| {
            request
                .subset
                .as_ref()
                .is_some_and(|s| !s.contains(&e.addr()))
        };
        let base = self.base.unwrap_or_default();
        let index: HashMap<EndpointId, usize> =
            base.iter().enumerate().map(|(i, e)| (e.id(), i)).collect();
        record.excluded = snapshot
            .endpoints()
            .iter()
            .filter(|e| !index.contains_key(&e.id()))
            .filter_map(|e| {
                let reason = if outside_subset(e) {
                    "subset"
                } else if index.is_empty() {
                    // The cycle ended before choosing its candidates for
                    // another reason (the subset matched nothing is the
                    // one above): nothing was left out.
                    return None;
                } else {
                    "stale"
                };
                Some(Excluded {
                    endpoint: endpoint_ref(e),
                    reason,
                })
            })
            .collect();
        let sites = scheduler.call_sites();
        let plugin_at = |site: usize| sites.get(site).map(|s| plugin_id(s.plugin.plugin()));
        record.runs = self
            .runs
            .into_iter()
            .map(|run| run_record(run, scheduler, &base, &index, &plugin_at))
            .collect();
        record
    }
}

/// One profile run over `base` (indexed by id in `index`).
fn run_record(
    run: RunDetail,
    scheduler: &Scheduler,
    base: &[Arc<Endpoint>],
    index: &HashMap<EndpointId, usize>,
    plugin_at: &dyn Fn(usize) -> Option<PluginId>,
) -> RunRecord {
    let profile = scheduler.profiles().get(run.profile);
    let mut candidates: Vec<CandidateRecord> = base
        .iter()
        .map(|e| CandidateRecord {
            endpoint: endpoint_ref(e),
            dropped_by: None,
            scores: Vec::new(),
            total: None,
            pick: None,
        })
        .collect();
    // Each filter drops what it did not keep of what was left.
    let mut alive = vec![true; base.len()];
    let mut kept = vec![false; base.len()];
    for (site, survivors) in &run.filters {
        kept.fill(false);
        for id in survivors {
            if let Some(&i) = index.get(id) {
                kept[i] = true;
            }
        }
        for (i, c) in candidates.iter_mut().enumerate() {
            if alive[i] && !kept[i] {
                alive[i] = false;
                c.dropped_by = plugin_at(*site);
            }
        }
    }
    let scorers = run.scores.len();
    for (k, (scored, scores)) in run.scores.iter().enumerate() {
        for (id, &s) in scored.iter().zip(scores) {
            if let Some(&i) = index.get(id) {
                let c = &mut candidates[i];
                if c.scores.len() != scorers {
                    // A score the scorer did not give shows as null.
                    c.scores = vec![f64::NAN; scorers];
                }
                c.scores[k] = s;
            }
        }
    }
    for &(id, total) in &run.totals {
        if let Some(&i) = index.get(&id) {
            candidates[i].total = Some(total);
        }
    }
    for (rank, id) in run.picks.iter().enumerate() {
        if let Some(&i) = index.get(id) {
            candidates[i].pick = Some(rank);
        }
    }
    RunRecord {
        profile: profile.map_or_else(String::new, |p| p.name().to_owned()),
        filters: profile.map_or_else(Vec::new, |p| {
            p.filters().iter().map(|f| plugin_id(f.plugin())).collect()
        }),
        scorers: profile.map_or_else(Vec::new, |p| {
            p.scorers()
                .iter()
                .map(|s| ScorerId {
                    plugin: plugin_id(s.plugin.plugin()),
                    weight: s.weight,
                })
                .collect()
        }),
        picker: profile
            .and_then(|p| p.picker())
            .map(|p| plugin_id(p.plugin())),
        candidates,
    }
}
