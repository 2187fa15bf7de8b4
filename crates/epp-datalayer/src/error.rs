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
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
