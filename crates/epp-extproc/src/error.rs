//! Why a request is answered by the picker itself instead of being forwarded.

use epp_core::{SchedulingError, flow::Outcome};

/// A request the picker refuses, with the HTTP status the client receives.
///
/// Every variant becomes an Envoy `ImmediateResponse` whose body is an
/// OpenAI-style JSON error (`{"error":{"message","type","code"}}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtProcError {
    /// The body is not a JSON object, or a field has the wrong type (400).
    #[error("invalid request body: {0}")]
    BadBody(String),
    /// The body has no `model` (400).
    #[error("model not found in request body")]
    MissingModel,
    /// The body is larger than the configured limit (413).
    #[error("request body of at least {size} bytes exceeds the limit of {limit} bytes")]
    BodyTooLarge {
        /// Bytes received so far.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The scheduler could not place the request (503 or 429).
    #[error(transparent)]
    Scheduling(#[from] SchedulingError),
    /// There are no endpoints, and discovery said why (503): "InferencePool
    /// prod/llama was deleted", "no Ready pod … matches …".
    #[error("no endpoints available in the pool: {0}")]
    NoEndpoints(std::sync::Arc<str>),
    /// Flow control refused or evicted the request: its queue was full
    /// (429), or the pool had no endpoint (503), or it waited past its TTL
    /// (503).
    #[error("{}", flow_message(*.0))]
    FlowControl(Outcome),
}

fn flow_message(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::RejectedCapacity => "flow control: the request queue is full",
        Outcome::RejectedNoEndpoints => {
            "flow control: the request queue is full and the pool has no endpoints"
        }
        Outcome::EvictedTtl => "flow control: the request timed out waiting in the queue",
        Outcome::EvictedNoEndpoints => {
            "flow control: the request timed out waiting for the pool to have endpoints"
        }
        Outcome::EvictedContextCancelled => "flow control: the request was cancelled",
        _ => "flow control: the request was not dispatched",
    }
}

/// The response header naming why a request was dropped (llm-d's
/// `x-llm-d-request-dropped-reason`), on the replies of
/// [`ExtProcError::dropped_reason`].
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

impl ExtProcError {
    /// Why the request was dropped, in llm-d's words
    /// ([`DROPPED_REASON_HEADER`]): `rejected-saturated` (the pool or the
    /// queue is full, or filters left no endpoint), `rejected-no-endpoints`,
    /// `rejected-ttl-expired`, `rejected-context-cancelled`; `None` for a
    /// request refused for what it is (a bad body) or by an admission plugin,
    /// which llm-d does not label either.
    #[must_use]
    pub fn dropped_reason(&self) -> Option<&'static str> {
        const SATURATED: &str = "rejected-saturated";
        const NO_ENDPOINTS: &str = "rejected-no-endpoints";
        match self {
            Self::Scheduling(SchedulingError::Saturated | SchedulingError::AllFiltered { .. })
            | Self::FlowControl(Outcome::RejectedCapacity) => Some(SATURATED),
            Self::Scheduling(SchedulingError::NoEndpoints | SchedulingError::EmptySubset)
            | Self::NoEndpoints(_)
            | Self::FlowControl(Outcome::RejectedNoEndpoints | Outcome::EvictedNoEndpoints) => {
                Some(NO_ENDPOINTS)
            }
            Self::FlowControl(Outcome::EvictedTtl) => Some("rejected-ttl-expired"),
            Self::FlowControl(Outcome::EvictedContextCancelled) => {
                Some("rejected-context-cancelled")
            }
            _ => None,
        }
    }

    /// The HTTP status the client receives.
    #[must_use]
    pub fn http_status(&self) -> u16 {
        match self {
            Self::BadBody(_) | Self::MissingModel => 400,
            Self::BodyTooLarge { .. } => 413,
            Self::Scheduling(SchedulingError::Saturated | SchedulingError::NotAdmitted { .. }) => {
                429
            }
            Self::Scheduling(SchedulingError::Invalid(_)) => 500,
            Self::FlowControl(Outcome::RejectedCapacity) => 429,
            Self::FlowControl(_) => 503,
            Self::Scheduling(_) | Self::NoEndpoints(_) => 503,
        }
    }

    /// The error code used in metrics (`error_code` label) and in the JSON
    /// body's `type` (the reference's names).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self.http_status() {
            400 | 413 => "BadRequest",
            429 => "ResourceExhausted",
            503 => "ServiceUnavailable",
            _ => "Internal",
        }
    }

    /// The JSON body a client reads.
    #[must_use]
    pub fn json_body(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.code(),
                "code": self.http_status(),
            }
        });
        body.to_string().into_bytes()
    }
}

/// Result with [`ExtProcError`].
pub type Result<T, E = ExtProcError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_labelled_with_llm_ds_reasons() {
        let cases = [
            (
                ExtProcError::FlowControl(Outcome::RejectedCapacity),
                Some("rejected-saturated"),
            ),
            (
                ExtProcError::from(SchedulingError::Saturated),
                Some("rejected-saturated"),
            ),
            (
                ExtProcError::from(SchedulingError::AllFiltered {
                    profile: "default".into(),
                }),
                Some("rejected-saturated"),
            ),
            (
                ExtProcError::from(SchedulingError::NoEndpoints),
                Some("rejected-no-endpoints"),
            ),
            (
                ExtProcError::NoEndpoints("InferencePool ns/p was deleted".into()),
                Some("rejected-no-endpoints"),
            ),
            (
                ExtProcError::FlowControl(Outcome::EvictedNoEndpoints),
                Some("rejected-no-endpoints"),
            ),
            (
                ExtProcError::FlowControl(Outcome::EvictedTtl),
                Some("rejected-ttl-expired"),
            ),
            (
                ExtProcError::FlowControl(Outcome::EvictedContextCancelled),
                Some("rejected-context-cancelled"),
            ),
            (ExtProcError::MissingModel, None),
            (
                ExtProcError::from(SchedulingError::NotAdmitted {
                    plugin: "a".into(),
                    reason: "b".into(),
                }),
                None,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.dropped_reason(), want, "{e}");
        }
    }

    #[test]
    fn statuses_follow_the_reference() {
        assert_eq!(ExtProcError::MissingModel.http_status(), 400);
        assert_eq!(
            ExtProcError::BodyTooLarge { size: 2, limit: 1 }.http_status(),
            413
        );
        assert_eq!(
            ExtProcError::from(SchedulingError::Saturated).http_status(),
            429
        );
        assert_eq!(
            ExtProcError::from(SchedulingError::EmptySubset).http_status(),
            503
        );
        let deleted = ExtProcError::NoEndpoints("InferencePool ns/p was deleted".into());
        assert_eq!(deleted.http_status(), 503);
        assert_eq!(deleted.code(), "ServiceUnavailable");
        assert_eq!(
            deleted.to_string(),
            "no endpoints available in the pool: InferencePool ns/p was deleted"
        );
        let full = ExtProcError::FlowControl(Outcome::RejectedCapacity);
        assert_eq!(
            (full.http_status(), full.code()),
            (429, "ResourceExhausted")
        );
        for o in [
            Outcome::RejectedNoEndpoints,
            Outcome::EvictedTtl,
            Outcome::EvictedNoEndpoints,
        ] {
            let e = ExtProcError::FlowControl(o);
            assert_eq!(
                (e.http_status(), e.code()),
                (503, "ServiceUnavailable"),
                "{o}"
            );
        }
        let body: serde_json::Value =
            serde_json::from_slice(&ExtProcError::FlowControl(Outcome::EvictedTtl).json_body())
                .unwrap();
        assert_eq!(
            body["error"]["message"],
            "flow control: the request timed out waiting in the queue"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&ExtProcError::MissingModel.json_body()).unwrap();
        assert_eq!(body["error"]["message"], "model not found in request body");
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["type"], "BadRequest");
    }
}
