//! `data-parallel-profile-handler`: one pod serving several data-parallel
//! ranks, each rank an endpoint of its own (Kubernetes discovery names them
//! `<pod>-rank-<i>`, one per target port of the pool). The one profile picks a
//! rank; the request goes to the pod's primary port and names the rank in a
//! header, which the pod's routing sidecar forwards to:
//!
//! ```text
//! destination                ip:primaryPort        (for the target and each fallback)
//! x-data-parallel-host-port  ip:port of the picked rank
//! ```
//!
//! A client's own `x-data-parallel-host-port` is always dropped. llm-d
//! deprecates this handler in favour of `single-profile-handler` with a
//! gateway that can address ranks itself (Istio ≥ 1.28.1); it is kept for
//! configs that name it.

use epp_core::{
    BuildError, CycleContext, Plugin, ProfileHandler, ProfilePicks, RouteEdits, SchedulingProfile,
};

use crate::Builtin;

/// The header naming the picked rank.
pub const DATA_PARALLEL_HEADER: &str = "x-data-parallel-host-port";
const OWNED_HEADERS: &[&str] = &[DATA_PARALLEL_HEADER];

const fn default_primary_port() -> i64 {
    8000
}

/// Parameters (llm-d's names).
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DataParallelParams {
    /// The pod's port that receives every request (default 8000).
    #[serde(default = "default_primary_port")]
    pub primary_port: i64,
}

impl Default for DataParallelParams {
    fn default() -> Self {
        Self {
            primary_port: default_primary_port(),
        }
    }
}

/// `data-parallel-profile-handler`: see the module docs.
#[derive(Debug, Clone)]
pub struct DataParallelProfileHandler {
    name: String,
    primary_port: u16,
}

impl Builtin for DataParallelProfileHandler {
    const TYPE: &'static str = "data-parallel-profile-handler";
    type Params = DataParallelParams;

    fn build(name: impl Into<String>, p: DataParallelParams) -> Result<Self, BuildError> {
        let name = name.into();
        let primary_port = u16::try_from(p.primary_port)
            .ok()
            .filter(|&port| port > 0)
            .ok_or_else(|| {
                crate::invalid(&name, "primaryPort", p.primary_port, "a port, 1-65535")
            })?;
        tracing::warn!(
            plugin = %name,
            "{} is deprecated by llm-d: single-profile-handler with a gateway that addresses ranks \
             (Istio >= 1.28.1) replaces it",
            Self::TYPE
        );
        Ok(Self { name, primary_port })
    }
}

impl Plugin for DataParallelProfileHandler {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_profile_handler(&self) -> Option<&dyn ProfileHandler> {
        Some(self)
    }
}

impl ProfileHandler for DataParallelProfileHandler {
    fn check_profiles(&self, names: &[&str]) -> Result<(), String> {
        if names.len() == 1 {
            Ok(())
        } else {
            Err(format!(
                "runs exactly one profile, but {} are declared",
                names.len()
            ))
        }
    }

    fn next_profile(
        &self,
        _cx: &mut CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize> {
        (runs.is_empty() && profiles.len() == 1).then_some(0)
    }

    fn primary(&self, _profiles: &[SchedulingProfile], runs: &[ProfilePicks]) -> Option<usize> {
        (!runs.is_empty()).then_some(0)
    }

    fn route(
        &self,
        _cx: &CycleContext<'_>,
        _profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
        edits: &mut RouteEdits,
    ) {
        edits.owned_headers = OWNED_HEADERS;
        if let Some(target) = runs.first().and_then(|r| r.targets.first()) {
            edits
                .headers
                .push((DATA_PARALLEL_HEADER, target.addr_str().to_owned()));
            edits.forward_port = Some(self.primary_port);
        }
    }
}
