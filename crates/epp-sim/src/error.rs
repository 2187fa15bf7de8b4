//! What can go wrong starting a simulator.

/// A simulator that could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--tokenizer` names no readable tokenizer.
    #[error("--tokenizer {path}: {reason}")]
    Tokenizer {
        /// The path given.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
    /// `--chat-template` names no usable template.
    #[error("--chat-template {path}: {reason}")]
    ChatTemplate {
        /// The path given.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
    /// `--kv-events-config` is unusable.
    #[error("--kv-events-config: {reason}")]
    KvEventsConfig {
        /// Why.
        reason: String,
    },
    /// A KV events socket could not be bound.
    #[error("--kv-events-config: cannot bind {endpoint}: {reason}")]
    KvEventsBind {
        /// The endpoint configured.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The HTTP listener failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
