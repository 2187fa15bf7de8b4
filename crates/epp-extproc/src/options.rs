//! Settings of the ext_proc service.

use std::{collections::HashMap, fmt, sync::Arc};

/// How Envoy sends a body (`ProcessingMode.BodySendMode`). Envoy announces the
/// modes in the first message of each stream (`protocol_config`); the
/// assumed modes in [`ExtProcOptions`] apply only to gateways that do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyMode {
    /// The body is not sent.
    None,
    /// Sent in chunks, each answered (the destination cannot be set from the
    /// body in this mode; not recommended for the request path).
    Streamed,
    /// Sent as one message after the headers are answered.
    Buffered,
    /// Like [`Self::Buffered`], up to a size.
    BufferedPartial,
    /// Sent in chunks without waiting; the picker answers the headers after
    /// the whole body, then streams the body back.
    #[default]
    FullDuplexStreamed,
}

impl BodyMode {
    /// From the protobuf enum value; unknown values are treated as full duplex.
    #[must_use]
    pub fn from_proto(value: i32) -> Self {
        match value {
            0 => Self::None,
            1 => Self::Streamed,
            2 => Self::Buffered,
            3 => Self::BufferedPartial,
            _ => Self::FullDuplexStreamed,
        }
    }
}

/// Chooses the model a request is routed for, e.g. weighted rewrite rules
/// from the config. The `x-gateway-model-name-rewrite` header, when present,
/// takes precedence over any rule.
pub trait ModelRewrite: Send + Sync + fmt::Debug {
    /// The target model for a request asking for `model`, or `None` to keep it.
    fn rewrite(&self, model: &str, headers: &[(String, String)]) -> Option<String>;
}

/// Weighted rewrite rules from the config (`modelRewrites`), drawn with the
/// thread's random generator.
impl ModelRewrite for epp_core::config::ModelRewriteRules {
    fn rewrite(&self, model: &str, _headers: &[(String, String)]) -> Option<String> {
        self.choose(model, &mut rand::rng()).map(str::to_owned)
    }
}

/// Objective priorities that change while serving (e.g. InferenceObjective
/// resources on Kubernetes). When set, it answers instead of
/// [`ExtProcOptions::objectives`].
pub trait ObjectivePriority: Send + Sync + fmt::Debug {
    /// The priority of `objective`, or `None` when it is not declared.
    fn priority(&self, objective: &str) -> Option<i32>;
}

/// Settings of [`crate::ExtProcService`]. Build with struct-update syntax:
/// `ExtProcOptions { max_body_bytes: 1 << 20, ..ExtProcOptions::default() }`.
#[derive(Clone, Debug)]
pub struct ExtProcOptions {
    /// Largest request body accepted; a larger one gets 413. `0` = no limit.
    pub max_body_bytes: usize,
    /// Objective name (`x-gateway-inference-objective`) → priority. Unknown or
    /// absent objectives get priority 0; negative priorities are sheddable.
    pub objectives: HashMap<String, i32>,
    /// Largest body chunk sent back in FULL_DUPLEX_STREAMED mode (Envoy's
    /// reference limit is 62,000 bytes).
    pub stream_chunk_bytes: usize,
    /// Request body mode assumed when Envoy does not announce it.
    pub assumed_request_body_mode: BodyMode,
    /// Response body mode assumed when Envoy does not announce it.
    pub assumed_response_body_mode: BodyMode,
    /// Most bytes of a response held to read usage or rewrite the model (a
    /// plain JSON body, or one SSE line); beyond it they pass unexamined.
    pub max_response_buffer_bytes: usize,
    /// Rewrite rules applied when no rewrite header is present.
    pub model_rewrite: Option<Arc<dyn ModelRewrite>>,
    /// Live objective priorities, consulted instead of `objectives` when set.
    pub objective_priority: Option<Arc<dyn ObjectivePriority>>,
    /// Records sampled requests' spans (`None`: no tracing, no cost).
    pub tracer: Option<Arc<dyn crate::RequestTracer>>,
    /// Which paths are read as which API, and whether an unclaimed path
    /// passes through unread (default: llm-d's default parsers) or gets 400.
    pub parsers: epp_core::RequestParsers,
    /// Renders prompts to the engine's token ids before scheduling (a
    /// `token-producer` with the `vllm` backend); `None`: no render step.
    pub renderer: Option<Arc<dyn epp_core::PromptRenderer>>,
    /// Looks each request up in a shared prefix index after rendering and
    /// before scheduling (a `precise-prefix-cache-producer` with a Redis or
    /// Valkey backend); `None`: no lookup step.
    pub prefix_lookup: Option<Arc<dyn epp_core::PrefixLookup>>,
    /// The pool this picker serves: the `inference_pool` label of flow
    /// control's pool and band series (empty by default).
    pub pool_name: String,
}

impl Default for ExtProcOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 << 20,
            objectives: HashMap::new(),
            stream_chunk_bytes: 62_000,
            assumed_request_body_mode: BodyMode::FullDuplexStreamed,
            assumed_response_body_mode: BodyMode::FullDuplexStreamed,
            max_response_buffer_bytes: 4 << 20,
            model_rewrite: None,
            objective_priority: None,
            tracer: None,
            parsers: epp_core::RequestParsers::default(),
            renderer: None,
            prefix_lookup: None,
            pool_name: String::new(),
        }
    }
}
