//! Errors of the data layer.

/// Data-layer errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An endpoint address is malformed.
    #[error("invalid endpoint: {0}")]
    BadEndpoint(String),
    /// The endpoints file cannot be read or parsed.
    #[error("endpoints file {path}: {reason}")]
    EndpointsFile {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A data source is configured in a way this build cannot serve.
    #[error("data source {source_name:?}: {reason}")]
    Source {
        /// Plugin name.
        source_name: String,
        /// Why.
        reason: String,
    },
    /// Kubernetes discovery cannot work: bad options, an unreachable or
    /// rejecting API server, or an invalid object.
    #[error("kubernetes: {0}")]
    Kubernetes(String),
    /// The API server refuses an operation discovery needs (RBAC).
    #[error(
        "kubernetes: forbidden to {verbs} {resource} in namespace {namespace:?}: grant them to the picker's ServiceAccount with a Role and RoleBinding (see docs/kubernetes.md)"
    )]
    Forbidden {
        /// The verbs missing, e.g. `list, watch`.
        verbs: String,
        /// The resource, e.g. `pods` or `inferencepools.inference.networking.k8s.io`.
        resource: String,
        /// The namespace.
        namespace: String,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
