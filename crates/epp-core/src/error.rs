//! Errors of scheduling and of building a scheduler.

/// Why a request could not be scheduled, or a scheduler not built.
///
/// Each variant maps to one client-visible status at the edge (the ext_proc
/// service): 503 for the "no endpoint" family, 429 for [`Self::Saturated`] and
/// [`Self::NotAdmitted`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulingError {
    /// The pool has no endpoints at all.
    #[error("no endpoints available in the pool")]
    NoEndpoints,
    /// The gateway's subset hint named no endpoint of the pool.
    #[error("no endpoint of the pool matches the subset hint")]
    EmptySubset,
    /// Filters removed every candidate.
    #[error("all endpoints were filtered out by profile {profile:?}")]
    AllFiltered {
        /// The profile whose filters emptied the candidate list.
        profile: String,
    },
    /// A sheddable request arrived while the pool is saturated.
    #[error("the pool is saturated and the request is sheddable")]
    Saturated,
    /// An admission plugin refused the request (e.g. a sheddable request no
    /// endpoint is predicted to serve within its latency objective).
    #[error("request not admitted by {plugin}: {reason}")]
    NotAdmitted {
        /// The plugin that refused it.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The scheduler was assembled wrongly.
    #[error("invalid scheduler: {0}")]
    Invalid(String),
}

/// Result with [`SchedulingError`].
pub type Result<T, E = SchedulingError> = std::result::Result<T, E>;
