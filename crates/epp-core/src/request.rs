//! The scheduler's view of one inference request.

use std::net::SocketAddr;

/// Characters per token in the tokenizer-free estimate used across the project
/// (the simulator and the prefix index use the same rule).
pub const CHARS_PER_TOKEN: usize = 4;

/// Which API a request speaks, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ApiKind {
    /// `/v1/completions` (the default for unknown paths).
    #[default]
    Completions,
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/responses`.
    Responses,
    /// `/v1/conversations`.
    Conversations,
    /// `/v1/embeddings`.
    Embeddings,
    /// Anthropic `/v1/messages`.
    Messages,
}

impl ApiKind {
    /// Every kind, in declaration order.
    pub const ALL: [Self; 6] = [
        Self::Completions,
        Self::ChatCompletions,
        Self::Responses,
        Self::Conversations,
        Self::Embeddings,
        Self::Messages,
    ];

    /// The API a request path names (query string ignored); completions when unknown.
    #[must_use]
    pub fn from_path(path: &str) -> Self {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Self::ChatCompletions
        } else if path.ends_with("/responses") {
            Self::Responses
        } else if path.ends_with("/conversations") {
            Self::Conversations
        } else if path.ends_with("/embeddings") {
            Self::Embeddings
        } else if path.ends_with("/messages") {
            Self::Messages
        } else {
            Self::Completions
        }
    }
}

/// Token usage reported by a model server in its response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt_tokens: u64,
    /// Completion (output) tokens.
    pub completion_tokens: u64,
    /// Total tokens.
    pub total_tokens: u64,
    /// Prompt tokens served from the server's prefix cache.
    pub cached_tokens: u64,
}

/// One inference request as the scheduler sees it.
///
/// Built by the request parser (the ext_proc service) from headers and body.
/// The prompt text is what the prefix index hashes: its definition per API kind
/// is documented by the parser and stable across equivalent requests.
#[derive(Debug, Clone, Default)]
pub struct InferenceRequest {
    /// Request id (`x-request-id`).
    pub request_id: String,
    /// Model name the client asked for.
    pub model: String,
    /// Model the request is routed for after any rewrite (may be a LoRA adapter).
    pub target_model: String,
    /// API kind.
    pub api: ApiKind,
    /// Request headers, names lower-case, control and pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// Text the prefix index hashes (the prompt, flattened).
    pub prompt: String,
    /// `cache_salt` from the body: isolates prefix-cache sharing between tenants.
    pub cache_salt: Option<String>,
    /// Whether the client asked for a streamed response.
    pub stream: bool,
    /// Scheduling priority (from the objective); negative = sheddable.
    pub priority: i32,
    /// Objective name from `x-gateway-inference-objective`.
    pub objective: Option<String>,
    /// Fairness id from `x-gateway-inference-fairness-id`.
    pub fairness_id: String,
    /// Requested output length, if given.
    pub max_tokens: Option<u64>,
    /// When set, only these endpoints (ip AND port) may serve the request.
    pub subset: Option<Vec<SocketAddr>>,
    /// Body size in bytes.
    pub body_len: usize,
    /// Media parts in the messages (images, audio, video, files): a
    /// multimodal request when not 0.
    pub media_parts: u32,
}

impl InferenceRequest {
    /// Starts building a request for `model`.
    #[must_use]
    pub fn builder(model: impl Into<String>) -> InferenceRequestBuilder {
        let model = model.into();
        InferenceRequestBuilder {
            req: Self {
                target_model: model.clone(),
                model,
                fairness_id: "default-flow".to_owned(),
                ..Self::default()
            },
        }
    }

    /// A header value by lower-case name.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Estimated prompt tokens (characters / 4, rounded up).
    #[must_use]
    pub fn prompt_tokens_estimate(&self) -> u64 {
        self.prompt.len().div_ceil(CHARS_PER_TOKEN) as u64
    }

    /// Whether the request may be shed when the pool is saturated.
    #[must_use]
    pub fn is_sheddable(&self) -> bool {
        self.priority < 0
    }
}

/// Builder for [`InferenceRequest`].
#[derive(Debug, Clone)]
pub struct InferenceRequestBuilder {
    req: InferenceRequest,
}

impl InferenceRequestBuilder {
    /// Sets the request id.
    #[must_use]
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.req.request_id = id.into();
        self
    }

    /// Sets the model the request is routed for.
    #[must_use]
    pub fn target_model(mut self, model: impl Into<String>) -> Self {
        self.req.target_model = model.into();
        self
    }

    /// Sets the API kind.
    #[must_use]
    pub fn api(mut self, api: ApiKind) -> Self {
        self.req.api = api;
        self
    }

    /// Adds a header (name lower-cased).
    #[must_use]
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.req
            .headers
            .push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Sets the prompt text.
    #[must_use]
    pub fn prompt(mut self, prompt: impl Into<String>) -> Self {
        self.req.prompt = prompt.into();
        self
    }

    /// Sets the cache salt.
    #[must_use]
    pub fn cache_salt(mut self, salt: impl Into<String>) -> Self {
        self.req.cache_salt = Some(salt.into());
        self
    }

    /// Sets streaming.
    #[must_use]
    pub fn stream(mut self, stream: bool) -> Self {
        self.req.stream = stream;
        self
    }

    /// Sets the priority.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.req.priority = priority;
        self
    }

    /// Restricts candidates to these addresses.
    #[must_use]
    pub fn subset(mut self, subset: Vec<SocketAddr>) -> Self {
        self.req.subset = Some(subset);
        self
    }

    /// Sets the requested output length.
    #[must_use]
    pub fn max_tokens(mut self, max_tokens: u64) -> Self {
        self.req.max_tokens = Some(max_tokens);
        self
    }

    /// Sets the number of media parts (a multimodal request when not 0).
    #[must_use]
    pub fn media_parts(mut self, n: u32) -> Self {
        self.req.media_parts = n;
        self
    }

    /// Finishes the request.
    #[must_use]
    pub fn build(self) -> InferenceRequest {
        self.req
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_kind_by_path_suffix() {
        assert_eq!(
            ApiKind::from_path("/v1/chat/completions?x=1"),
            ApiKind::ChatCompletions
        );
        assert_eq!(ApiKind::from_path("/v1/completions"), ApiKind::Completions);
        assert_eq!(ApiKind::from_path("/v1/responses/"), ApiKind::Responses);
        assert_eq!(ApiKind::from_path("/v1/messages"), ApiKind::Messages);
        assert_eq!(ApiKind::from_path("/v1/embeddings"), ApiKind::Embeddings);
        assert_eq!(ApiKind::from_path("/whatever"), ApiKind::Completions);
    }

    #[test]
    fn token_estimate_rounds_up() {
        let r = InferenceRequest::builder("m").prompt("12345").build();
        assert_eq!(r.prompt_tokens_estimate(), 2);
        assert_eq!(r.fairness_id, "default-flow");
    }
}
