//! KV-cache event feeds: `endpoint-notification-source` subscribes to each
//! endpoint's ZeroMQ publisher (vLLM `--kv-events-config`), follows the
//! sequence numbers, replays or resynchronises on a gap, decodes each batch
//! (`decode.rs`) and hands it to the [`epp_core::KvEventSink`]s wired to it.

mod decode;
mod feed;

use epp_core::{NotificationSource, Plugin};

pub use decode::{DecodeError, DecodeErrorKind, Decoded, MAX_DEPTH, decode_batch};
pub(crate) use feed::{FeedMetrics, SinkGroup, start_feeds};

/// `endpoint-notification-source`: delivers every endpoint's KV-cache events
/// to its extractors (each a [`epp_core::KvEventSink`]), which say where the
/// events come from (their `kvEventsConfig`). It has no parameters.
#[derive(Debug, Clone)]
pub struct EndpointNotificationSource {
    name: String,
}

impl EndpointNotificationSource {
    /// YAML type.
    pub const TYPE: &'static str = "endpoint-notification-source";

    /// A source named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Plugin for EndpointNotificationSource {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_notification_source(&self) -> Option<&dyn NotificationSource> {
        Some(self)
    }
}

impl NotificationSource for EndpointNotificationSource {}
