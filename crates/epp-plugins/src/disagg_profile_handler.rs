//! `disagg-profile-handler`: disaggregated serving (llm-d's P/D, E/PD,
//! E/P/D). Up to three profiles run per request, each picking from its own
//! pool of servers (its filters select them by `llm-d.ai/role`):
//!
//! ```text
//! decode-first (default)              prefill-first
//! 1. decode        always             1. prefill   when declared
//! 2. encode        encode decider     2. encode    encode decider
//!                  says yes                        says yes
//! 3. prefill       prefill decider    3. decode    always
//!                  says yes, given
//!                  the decode pick
//! ```
//!
//! A stage whose profile is not declared, or that has no decider, never runs;
//! a decode stage that finds no endpoint ends the cycle (the request fails).
//! The decode pick is the primary target: the gateway sends the request there
//! and the model server's routing sidecar runs the other stages, told where by
//! request headers:
//!
//! ```text
//! x-prefiller-host-port   ip:port of the prefill pick   (absent: no prefill)
//! x-encoder-hosts-ports   ip:port,… of the encode picks (absent: no encode)
//! ```
//!
//! Each decision is counted by model and kind (`decode-only`,
//! `prefill-decode`, `encode-decode`, `encode-prefill-decode`) in llm-d's
//! `llm_d_epp_disagg_decision_total{plugin_name, plugin_type, model_name,
//! decision_type}` and its deprecated `llm_d_inference_scheduler_` twin
//! (`{model_name, decision_type}`); past 1,000 model names, later ones count
//! as `other`.
//!
//! A client's own values of these headers are always dropped. The endpoint an
//! earlier stage picked is left in [`epp_core::CycleState::peer`] for the next
//! stage's plugins (topology affinity). Hooks see the prefill pick
//! ([`SchedulingResult::prefill`](epp_core::SchedulingResult::prefill)), so
//! the prefix index records the prompt there too.

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

use epp_core::{
    BuildError, CycleContext, Endpoint, LabelCap, MetricFamily, MetricSink, Plugin, PluginMetrics,
    PluginRef, ProfileHandler, ProfilePicks, RouteEdits, SchedulingProfile,
};
use parking_lot::Mutex;

use crate::Builtin;

/// The header naming the prefill endpoint.
pub const PREFILL_HEADER: &str = "x-prefiller-host-port";
/// The header naming the encode endpoints.
pub const ENCODERS_HEADER: &str = "x-encoder-hosts-ports";
const OWNED_HEADERS: &[&str] = &[PREFILL_HEADER, ENCODERS_HEADER];

/// Decision kinds, indexed by `2 × encode + prefill`.
const DECISIONS: [&str; 4] = [
    "decode-only",
    "prefill-decode",
    "encode-decode",
    "encode-prefill-decode",
];
const DISAGG_DECISIONS: MetricFamily = MetricFamily {
    name: "llm_d_epp_disagg_decision",
    help: "Disaggregation decisions, by profile handler, model and kind",
};
const DISAGG_DECISIONS_DEPRECATED: MetricFamily = MetricFamily {
    name: "llm_d_inference_scheduler_disagg_decision",
    help: "[Deprecated: use llm_d_epp_disagg_decision_total] Disaggregation decisions, by model \
           and kind",
};

/// Which stage runs first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StageOrder {
    /// Decode, then encode, then prefill: the prefill decider sees the decode
    /// pick (its cached prefix).
    #[default]
    DecodeFirst,
    /// Prefill, then encode, then decode: decode plugins see the prefill pick.
    PrefillFirst,
}

impl<'de> serde::Deserialize<'de> for StageOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let key: String = s
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        match key.as_str() {
            "" | "decodefirst" | "decode" => Ok(Self::DecodeFirst),
            "prefillfirst" | "prefill" => Ok(Self::PrefillFirst),
            _ => Err(serde::de::Error::custom(format!(
                "invalid stageOrder {s:?}: expected \"decode-first\" or \"prefill-first\""
            ))),
        }
    }
}

/// `profiles:` — the stage profiles' names.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageProfiles {
    /// Decode profile (default `decode`).
    pub decode: Option<String>,
    /// Prefill profile (default `prefill`).
    pub prefill: Option<String>,
    /// Encode profile (default `encode`).
    pub encode: Option<String>,
}

/// `deciders:` — the decider plugin of each optional stage.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageDeciders {
    /// Decides whether prefill runs on its own server; none: it never does.
    pub prefill: Option<String>,
    /// Decides whether encode runs on its own server; none: it never does.
    pub encode: Option<String>,
}

/// Parameters (llm-d's names, the deprecated flat ones included).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DisaggParams {
    /// Which stage runs first.
    #[serde(default)]
    pub stage_order: StageOrder,
    /// Stage profile names.
    #[serde(default)]
    pub profiles: StageProfiles,
    /// Stage deciders.
    #[serde(default)]
    pub deciders: StageDeciders,
    /// Deprecated: `profiles.decode`.
    pub decode_profile: Option<String>,
    /// Deprecated: `profiles.prefill`.
    pub prefill_profile: Option<String>,
    /// Deprecated: `profiles.encode`.
    pub encode_profile: Option<String>,
    /// Deprecated: `deciders.prefill`.
    pub prefill_decider_plugin_name: Option<String>,
    /// Deprecated: `deciders.encode`.
    pub encode_decider_plugin_name: Option<String>,
    /// Deprecated (`pd-profile-handler`'s): `deciders.prefill`.
    pub decider_plugin_name: Option<String>,
}

/// `disagg-profile-handler`: see the module docs.
#[derive(Debug)]
pub struct DisaggProfileHandler {
    name: String,
    order: StageOrder,
    decode: String,
    prefill: String,
    encode: String,
    prefill_decider: Option<String>,
    encode_decider: Option<String>,
    /// The deciders, bound at load (prefill, encode).
    bound: OnceLock<(Option<PluginRef>, Option<PluginRef>)>,
    /// Decisions per model, by kind ([`DECISIONS`]).
    decisions: Mutex<HashMap<String, [u64; 4]>>,
    /// The model names kept as labels.
    models: LabelCap,
}

impl Builtin for DisaggProfileHandler {
    const TYPE: &'static str = "disagg-profile-handler";
    type Params = DisaggParams;

    fn build(name: impl Into<String>, p: DisaggParams) -> Result<Self, BuildError> {
        let name = name.into();
        let legacy = [
            ("decodeProfile", p.decode_profile.is_some()),
            ("prefillProfile", p.prefill_profile.is_some()),
            ("encodeProfile", p.encode_profile.is_some()),
            (
                "prefillDeciderPluginName",
                p.prefill_decider_plugin_name.is_some(),
            ),
            (
                "encodeDeciderPluginName",
                p.encode_decider_plugin_name.is_some(),
            ),
            ("deciderPluginName", p.decider_plugin_name.is_some()),
        ];
        for (key, _) in legacy.iter().filter(|(_, set)| *set) {
            tracing::warn!(
                plugin = %name,
                "parameter {key} is deprecated: use profiles.* / deciders.* (llm-d's nested form)"
            );
        }
        let pick = |nested: Option<String>, flat: Option<String>, default: &str| {
            nested.or(flat).unwrap_or_else(|| default.to_owned())
        };
        let decode = pick(p.profiles.decode, p.decode_profile, "decode");
        let prefill = pick(p.profiles.prefill, p.prefill_profile, "prefill");
        let encode = pick(p.profiles.encode, p.encode_profile, "encode");
        for (field, v) in [
            ("profiles.decode", &decode),
            ("profiles.prefill", &prefill),
            ("profiles.encode", &encode),
        ] {
            if v.is_empty() {
                return Err(crate::invalid(&name, field, "\"\"", "a profile name"));
            }
        }
        if decode == prefill || decode == encode || prefill == encode {
            return Err(crate::invalid(
                &name,
                "profiles",
                format!("{decode}/{prefill}/{encode}"),
                "the decode, prefill and encode profiles must differ",
            ));
        }
        let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
        Ok(Self {
            order: p.stage_order,
            decode,
            prefill,
            encode,
            prefill_decider: nonempty(
                p.deciders
                    .prefill
                    .or(p.prefill_decider_plugin_name)
                    .or(p.decider_plugin_name),
            ),
            encode_decider: nonempty(p.deciders.encode.or(p.encode_decider_plugin_name)),
            bound: OnceLock::new(),
            decisions: Mutex::default(),
            models: LabelCap::default(),
            name,
        })
    }
}

/// Index of the profile named `name`.
fn profile_index(profiles: &[SchedulingProfile], name: &str) -> Option<usize> {
    profiles.iter().position(|p| p.name() == name)
}

/// Index of the run of profile `profile`.
fn run_of(runs: &[ProfilePicks], profile: Option<usize>) -> Option<usize> {
    let profile = profile?;
    runs.iter().position(|r| r.profile == profile)
}

impl DisaggProfileHandler {
    fn deciders(&self) -> (Option<&PluginRef>, Option<&PluginRef>) {
        self.bound
            .get()
            .map_or((None, None), |(p, e)| (p.as_ref(), e.as_ref()))
    }

    fn decides(
        decider: Option<&PluginRef>,
        cx: &CycleContext<'_>,
        decode: Option<&Arc<Endpoint>>,
    ) -> bool {
        decider
            .and_then(|d| d.plugin().as_decider())
            .is_some_and(|d| d.disaggregate(cx, decode))
    }

    fn decode_first(
        &self,
        cx: &mut CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize> {
        let decode = profile_index(profiles, &self.decode)?;
        let Some(d) = run_of(runs, Some(decode)) else {
            return Some(decode);
        };
        let target = runs[d].targets.first()?;
        let (prefill_decider, encode_decider) = self.deciders();
        if let Some(e) = profile_index(profiles, &self.encode)
            && run_of(runs, Some(e)).is_none()
            && Self::decides(encode_decider, cx, Some(target))
        {
            return Some(e);
        }
        if let Some(p) = profile_index(profiles, &self.prefill)
            && run_of(runs, Some(p)).is_none()
            && Self::decides(prefill_decider, cx, Some(target))
        {
            cx.state.peer = Some(Arc::clone(target));
            return Some(p);
        }
        None
    }

    fn prefill_first(
        &self,
        cx: &mut CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize> {
        let decode = profile_index(profiles, &self.decode)?;
        if run_of(runs, Some(decode)).is_some() {
            return None;
        }
        let prefill = profile_index(profiles, &self.prefill);
        if let Some(p) = prefill
            && run_of(runs, Some(p)).is_none()
        {
            return Some(p);
        }
        let (_, encode_decider) = self.deciders();
        if let Some(e) = profile_index(profiles, &self.encode)
            && run_of(runs, Some(e)).is_none()
            && Self::decides(encode_decider, cx, None)
        {
            return Some(e);
        }
        if let Some(target) = run_of(runs, prefill).and_then(|i| runs[i].targets.first()) {
            cx.state.peer = Some(Arc::clone(target));
        }
        Some(decode)
    }
}

impl Plugin for DisaggProfileHandler {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_profile_handler(&self) -> Option<&dyn ProfileHandler> {
        Some(self)
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        Some(self)
    }
    fn named_plugins(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        out.extend(
            self.prefill_decider
                .clone()
                .map(|n| ("deciders.prefill", n)),
        );
        out.extend(self.encode_decider.clone().map(|n| ("deciders.encode", n)));
        out
    }
    fn bind_plugins(&self, plugins: &[PluginRef]) -> Result<(), (usize, String)> {
        if let Some(i) = plugins
            .iter()
            .position(|p| p.plugin().as_decider().is_none())
        {
            return Err((
                i,
                format!(
                    "plugin {:?} ({}) is not a decider",
                    plugins[i].plugin().name(),
                    plugins[i].plugin().type_name()
                ),
            ));
        }
        let mut it = plugins.iter().cloned();
        let prefill = self.prefill_decider.as_ref().and_then(|_| it.next());
        let encode = self.encode_decider.as_ref().and_then(|_| it.next());
        // Bound once at load; a second binding (never done) keeps the first.
        let _ = self.bound.set((prefill, encode));
        Ok(())
    }
}

impl DisaggProfileHandler {
    /// Counts one decision of kind `kind` (index into [`DECISIONS`]).
    fn count(&self, model: &str, kind: usize) {
        let model = self
            .models
            .label(if model.is_empty() { "unknown" } else { model });
        let mut decisions = self.decisions.lock();
        match decisions.get_mut(model) {
            Some(counts) => counts[kind] += 1,
            None => decisions.entry(model.to_owned()).or_default()[kind] += 1,
        }
    }
}

impl PluginMetrics for DisaggProfileHandler {
    fn report(&self, out: &mut dyn MetricSink) {
        let decisions = self.decisions.lock();
        for (model, counts) in decisions.iter() {
            for (kind, &n) in DECISIONS.iter().zip(counts) {
                if n == 0 {
                    continue;
                }
                out.counter(
                    DISAGG_DECISIONS,
                    &[
                        ("plugin_name", &self.name),
                        ("plugin_type", Self::TYPE),
                        ("model_name", model),
                        ("decision_type", kind),
                    ],
                    n,
                );
                out.counter(
                    DISAGG_DECISIONS_DEPRECATED,
                    &[("model_name", model), ("decision_type", kind)],
                    n,
                );
            }
        }
    }
}

impl ProfileHandler for DisaggProfileHandler {
    fn check_profiles(&self, names: &[&str]) -> Result<(), String> {
        if !names.contains(&self.decode.as_str()) {
            return Err(format!(
                "its decode profile {:?} is not declared (profiles: {names:?})",
                self.decode
            ));
        }
        let staged = [&self.decode, &self.prefill, &self.encode];
        if let Some(other) = names.iter().find(|n| !staged.iter().any(|s| s == *n)) {
            return Err(format!(
                "profile {other:?} is none of its stages ({:?}, {:?}, {:?}): it would never run",
                self.decode, self.prefill, self.encode
            ));
        }
        if self.prefill_decider.is_some() && !names.contains(&self.prefill.as_str()) {
            return Err(format!(
                "deciders.prefill is set but the prefill profile {:?} is not declared",
                self.prefill
            ));
        }
        if self.encode_decider.is_some() && !names.contains(&self.encode.as_str()) {
            return Err(format!(
                "deciders.encode is set but the encode profile {:?} is not declared",
                self.encode
            ));
        }
        Ok(())
    }

    fn next_profile(
        &self,
        cx: &mut CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize> {
        match self.order {
            StageOrder::DecodeFirst => self.decode_first(cx, profiles, runs),
            StageOrder::PrefillFirst => self.prefill_first(cx, profiles, runs),
        }
    }

    fn primary(&self, profiles: &[SchedulingProfile], runs: &[ProfilePicks]) -> Option<usize> {
        run_of(runs, profile_index(profiles, &self.decode))
    }

    fn route(
        &self,
        cx: &CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
        edits: &mut RouteEdits,
    ) {
        edits.owned_headers = OWNED_HEADERS;
        let prefill = run_of(runs, profile_index(profiles, &self.prefill));
        let mut kind = 0;
        if let Some(i) = prefill
            && let Some(target) = runs[i].targets.first()
        {
            edits
                .headers
                .push((PREFILL_HEADER, target.addr_str().to_owned()));
            edits.prefill_run = Some(i);
            kind += 1;
        }
        let encode = run_of(runs, profile_index(profiles, &self.encode));
        if encode.is_some_and(|i| !runs[i].targets.is_empty()) {
            kind += 2;
        }
        self.count(&cx.request.target_model, kind);
        if let Some(i) = encode
            && !runs[i].targets.is_empty()
        {
            let hosts = runs[i]
                .targets
                .iter()
                .map(|e| e.addr_str())
                .collect::<Vec<_>>()
                .join(",");
            edits.headers.push((ENCODERS_HEADER, hosts));
        }
    }
}
