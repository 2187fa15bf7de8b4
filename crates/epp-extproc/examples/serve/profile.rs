//! A stand-in for the default profile (queue ×2, KV ×2, prefix ×3, max-score
//! picker) for the examples: epp-extproc may not depend on epp-plugins, so
//! these are small local equivalents with the same per-request work (a prefix
//! index hashing the prompt in 64-character blocks, looked up per endpoint,
//! recorded after the pick).

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, RwLock},
};

use epp_core::{
    Candidate, CycleContext, DataProducer, Picker, Plugin, PluginRef, PreRequest, Scheduler,
    SchedulingProfile, SchedulingResult, Scorer, SingleProfileHandler,
};
use rand::Rng;

macro_rules! plugin {
    ($t:ty, $name:literal, $($role:ident -> $tr:ident),*) => {
        impl Plugin for $t {
            fn type_name(&self) -> &str { $name }
            fn name(&self) -> &str { $name }
            $(fn $role(&self) -> Option<&dyn $tr> { Some(self) })*
        }
    };
}

#[derive(Debug)]
struct Queue;
plugin!(Queue, "queue-scorer", as_scorer -> Scorer);
impl Scorer for Queue {
    fn score(&self, _: &CycleContext<'_>, c: &[Candidate], out: &mut [f64]) {
        let (lo, hi) = c.iter().fold((u32::MAX, 0), |(lo, hi), c| {
            (lo.min(c.metrics.waiting), hi.max(c.metrics.waiting))
        });
        for (c, s) in c.iter().zip(out.iter_mut()) {
            *s = if hi == lo {
                1.0
            } else {
                f64::from(hi - c.metrics.waiting) / f64::from(hi - lo)
            };
        }
    }
}

#[derive(Debug)]
struct Kv;
plugin!(Kv, "kv-cache-utilization-scorer", as_scorer -> Scorer);
impl Scorer for Kv {
    fn score(&self, _: &CycleContext<'_>, c: &[Candidate], out: &mut [f64]) {
        for (c, s) in c.iter().zip(out.iter_mut()) {
            *s = 1.0 - c.metrics.kv_usage;
        }
    }
}

/// Block hash → bit set of endpoint ids (< 64) holding it.
#[derive(Debug, Default)]
struct Prefix {
    index: RwLock<HashMap<u64, u64>>,
}
plugin!(Prefix, "prefix-cache-scorer",
    as_scorer -> Scorer, as_data_producer -> DataProducer, as_pre_request -> PreRequest);
impl DataProducer for Prefix {
    fn produce(&self, cx: &mut CycleContext<'_>, c: &[Candidate]) {
        let p = &mut cx.state.prefix;
        let mut h = DefaultHasher::new();
        cx.request.target_model.hash(&mut h);
        for block in cx.request.prompt.as_bytes().chunks_exact(64).take(256) {
            block.hash(&mut h);
            p.hashes.push(h.finish());
        }
        let Ok(index) = self.index.read() else { return };
        // One lookup per block: the endpoints still matching contiguously.
        let mut alive = u64::MAX;
        let mut matched = [0u32; 64];
        for h in &p.hashes {
            alive &= index.get(h).copied().unwrap_or(0);
            if alive == 0 {
                break;
            }
            for (bit, m) in matched.iter_mut().enumerate() {
                *m += u32::from(alive >> bit & 1 == 1);
            }
        }
        for cand in c {
            p.set_matched(cand.id(), matched[(cand.id().0 % 64) as usize]);
        }
        p.computed = true;
    }
}
impl Scorer for Prefix {
    fn score(&self, cx: &CycleContext<'_>, c: &[Candidate], out: &mut [f64]) {
        for (c, s) in c.iter().zip(out.iter_mut()) {
            *s = cx.state.prefix.ratio(c.id());
        }
    }
}
impl PreRequest for Prefix {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        let Some(ep) = result.primary() else { return };
        let bit = 1u64 << (ep.id().0 % 64);
        if let Ok(mut index) = self.index.write() {
            for h in &cx.state.prefix.hashes {
                *index.entry(*h).or_default() |= bit;
            }
        }
    }
}

#[derive(Debug)]
struct MaxScore;
plugin!(MaxScore, "max-score-picker", as_picker -> Picker);
impl Picker for MaxScore {
    fn pick(
        &self,
        cx: &mut CycleContext<'_>,
        c: &[Candidate],
        scores: &[f64],
        out: &mut Vec<usize>,
    ) {
        let best = scores.iter().copied().fold(f64::MIN, f64::max);
        let ties = scores.iter().filter(|&&s| s == best).count();
        if ties == 0 || c.is_empty() {
            return;
        }
        let nth = cx.rng.random_range(0..ties);
        out.extend(
            scores
                .iter()
                .enumerate()
                .filter(|(_, s)| **s == best)
                .nth(nth)
                .map(|(i, _)| i),
        );
    }
}

/// The first candidate (to measure the service without scheduling work).
#[derive(Debug)]
struct First;
plugin!(First, "first-picker", as_picker -> Picker);
impl Picker for First {
    fn pick(&self, _: &mut CycleContext<'_>, c: &[Candidate], _: &[f64], out: &mut Vec<usize>) {
        out.extend((!c.is_empty()).then_some(0));
    }
}

/// A profile doing no work: one picker taking the first endpoint.
pub(crate) fn trivial() -> Result<Scheduler, epp_core::SchedulingError> {
    let profile = SchedulingProfile::new("default").with_picker(PluginRef::new(Arc::new(First)));
    Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
}

/// queue ×2, kv ×2, prefix ×3, max-score picker, single profile.
pub(crate) fn default_like() -> Result<Scheduler, epp_core::SchedulingError> {
    let prefix = PluginRef::new(Arc::new(Prefix::default()));
    let profile = SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(Arc::new(Queue)), 2.0)
        .with_scorer(PluginRef::new(Arc::new(Kv)), 2.0)
        .with_scorer(prefix.clone(), 3.0)
        .with_picker(PluginRef::new(Arc::new(MaxScore)));
    Ok(
        Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))?
            .with_hooks([prefix]),
    )
}
