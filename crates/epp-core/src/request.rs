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
    /// OpenAI `/v1/images/generations`.
    ImagesGenerations,
    /// vLLM's `/inference/v1/generate` (token ids in, llm-d's `vllmhttp-parser`).
    VllmGenerate,
    /// SGLang's native `/generate` (`sglanghttp-parser`).
    SglangGenerate,
    /// vLLM's gRPC `vllm.grpc.engine.VllmEngine/Generate` (`vllmgrpc-parser`).
    VllmGrpcGenerate,
    /// Vertex AI's gRPC `PredictionService/ChatCompletions`, an OpenAI chat
    /// body inside (`vertexai-parser`).
    VertexChatCompletions,
    /// Vertex AI's gRPC `PredictionService/RawPredict` and `StreamRawPredict`,
    /// an OpenAI Responses body inside (`vertexai-parser`).
    VertexRawPredict,
    /// A body epp does not read (`passthrough-parser`): routed on load
    /// signals alone and forwarded untouched.
    Passthrough,
}

/// Path suffixes each kind claims (llm-d's parsers' claims), matched on whole
/// path segments (gRPC methods also after the package's `.`); the longest
/// match wins.
const CLAIMS: &[(&str, ApiKind)] = &[
    ("completions", ApiKind::Completions),
    ("completions/render", ApiKind::Completions),
    ("chat/completions", ApiKind::ChatCompletions),
    ("chat/completions/render", ApiKind::ChatCompletions),
    ("responses", ApiKind::Responses),
    ("conversations", ApiKind::Conversations),
    ("embeddings", ApiKind::Embeddings),
    ("messages", ApiKind::Messages),
    ("messages/count_tokens", ApiKind::Messages),
    ("images/generations", ApiKind::ImagesGenerations),
    ("inference/v1/generate", ApiKind::VllmGenerate),
    ("generate", ApiKind::SglangGenerate),
    (
        "vllm.grpc.engine.VllmEngine/Generate",
        ApiKind::VllmGrpcGenerate,
    ),
    (
        "PredictionService/ChatCompletions",
        ApiKind::VertexChatCompletions,
    ),
    ("PredictionService/RawPredict", ApiKind::VertexRawPredict),
    (
        "PredictionService/StreamRawPredict",
        ApiKind::VertexRawPredict,
    ),
];

impl ApiKind {
    /// Every kind, in declaration order.
    pub const ALL: [Self; 13] = [
        Self::Completions,
        Self::ChatCompletions,
        Self::Responses,
        Self::Conversations,
        Self::Embeddings,
        Self::Messages,
        Self::ImagesGenerations,
        Self::VllmGenerate,
        Self::SglangGenerate,
        Self::VllmGrpcGenerate,
        Self::VertexChatCompletions,
        Self::VertexRawPredict,
        Self::Passthrough,
    ];

    /// The API a request path names (query string ignored); completions when unknown.
    #[must_use]
    pub fn from_path(path: &str) -> Self {
        Self::claiming(path, Self::ALL.as_slice()).unwrap_or(Self::Completions)
    }

    /// The kind among `kinds` whose claimed path suffix is the longest one
    /// `path` ends with (on a segment boundary; query string and trailing
    /// `/` ignored), if any. `/v1/chat/completions` is chat even when plain
    /// completions are also claimed.
    #[must_use]
    pub fn claiming(path: &str, kinds: &[Self]) -> Option<Self> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let path = path.trim_end_matches('/');
        CLAIMS
            .iter()
            .filter(|(suffix, kind)| {
                let Some(before) = path.strip_suffix(suffix) else {
                    return false;
                };
                let boundary = before.is_empty()
                    || before.ends_with('/')
                    || (kind.is_grpc() && before.ends_with('.'));
                boundary && kinds.contains(kind)
            })
            .max_by_key(|(suffix, _)| suffix.len())
            .map(|&(_, kind)| kind)
    }

    /// Whether requests of this kind arrive as gRPC messages.
    #[must_use]
    pub fn is_grpc(self) -> bool {
        matches!(
            self,
            Self::VllmGrpcGenerate | Self::VertexChatCompletions | Self::VertexRawPredict
        )
    }
}

/// Which request APIs are read, and what becomes of a path none claims
/// (llm-d's `requestHandler.parsers`: each parser claims path suffixes, the
/// longest claim wins, and a parser that claims none is the fallback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestParsers {
    /// The kinds the configured parsers claim.
    pub kinds: Vec<ApiKind>,
    /// A path none claims is passed through unread ([`ApiKind::Passthrough`])
    /// rather than refused.
    pub fallback: bool,
}

impl Default for RequestParsers {
    /// llm-d's default list: `openai-parser`, `anthropic-parser`,
    /// `vllmhttp-parser`, then `passthrough-parser`.
    fn default() -> Self {
        Self {
            kinds: OPENAI_KINDS
                .iter()
                .copied()
                .chain([ApiKind::Messages, ApiKind::VllmGenerate])
                .collect(),
            fallback: true,
        }
    }
}

/// The kinds `openai-parser` claims.
pub const OPENAI_KINDS: [ApiKind; 6] = [
    ApiKind::Completions,
    ApiKind::ChatCompletions,
    ApiKind::Responses,
    ApiKind::Conversations,
    ApiKind::Embeddings,
    ApiKind::ImagesGenerations,
];

impl RequestParsers {
    /// The kind a request on `path` is read as: the longest claim, else
    /// [`ApiKind::Passthrough`] with a fallback, else `None` (refused).
    #[must_use]
    pub fn route(&self, path: &str) -> Option<ApiKind> {
        ApiKind::claiming(path, &self.kinds).or(self.fallback.then_some(ApiKind::Passthrough))
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
    /// The prompt's token ids as the model server renders them, when the
    /// edge had them rendered before scheduling ([`PromptRenderer`]).
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The prompt's media items as the model server's renderer identified
    /// them (content hashes), when it was rendered; empty otherwise.
    pub media_items: Vec<MediaItem>,
    /// What a shared prefix index answered before the cycle, when a plugin
    /// asked for a lookup ([`crate::PrefixLookup`]).
    pub shared_prefix: Option<crate::SharedPrefixMatch>,
}

/// One media item of a rendered prompt, as the model server reports it
/// (vLLM's render answer, `features.mm_hashes` and `features.mm_placeholders`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaItem {
    /// `image`, `audio`, `video`, … (the server's modality key).
    pub modality: String,
    /// The server's hash of the item's content: the same image is the same
    /// item wherever it was fetched from.
    pub hash: String,
    /// The prompt tokens standing for the item, when the server said
    /// (vLLM's engine hashes the item into every KV block these overlap).
    pub placeholder: Option<Placeholder>,
}

/// Where a media item sits in a rendered prompt: `length` tokens from token
/// `offset` (vLLM's `PlaceholderRange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholder {
    /// Index of its first token in the prompt's token ids.
    pub offset: u32,
    /// Its number of tokens.
    pub length: u32,
}

impl Placeholder {
    /// Whether it has a token in `start..end`.
    #[must_use]
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        let offset = self.offset as usize;
        offset < end && offset + self.length as usize > start
    }
}

/// A prompt as the model server renders it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// Its token ids.
    pub token_ids: Vec<u32>,
    /// Its media items (none for a text-only prompt).
    pub media: Vec<MediaItem>,
}

/// Where a token producer has prompts rendered (llm-d's `token-producer`
/// `vllm` backend): a service the edge calls before scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderService {
    /// Base URL (`http://host:port`, no trailing slash).
    pub url: String,
    /// The base model sent in render requests.
    pub model: String,
    /// Timeout of a text-only request.
    pub timeout: std::time::Duration,
    /// Timeout of a request with media.
    pub media_timeout: std::time::Duration,
}

/// A prompt rendered ([`RenderedPrompt`]), or why not.
pub type RenderFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<RenderedPrompt, String>> + Send>>;

/// Renders a request's prompt to the model server's token ids through a
/// service ([`RenderService`]); the edge awaits it before scheduling and
/// stores the ids in [`InferenceRequest::prompt_token_ids`] and the media
/// items in [`InferenceRequest::media_items`]. A failure is logged and the
/// request scheduled without them.
pub trait PromptRenderer: Send + Sync + std::fmt::Debug {
    /// The rendering of a request of kind `api` with body `body`, or `None`
    /// when this renderer does not render that kind. Does its synchronous
    /// work (building the render request) before returning.
    fn render(&self, api: ApiKind, body: &[u8], media_parts: u32) -> Option<RenderFuture>;

    /// The token ids of a completions request's `prompt`, computed at once,
    /// when this renderer tokenizes in process. The edge asks for them only
    /// when a shared prefix index needs ids before the cycle (without one,
    /// completions are tokenized in the cycle, as before). Default: none.
    fn tokenize_prompt(&self, prompt: &str) -> Option<Vec<u32>> {
        let _ = prompt;
        None
    }
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
    fn longest_claimed_suffix_among_the_configured_kinds() {
        let all = ApiKind::ALL.as_slice();
        let claim = |p| ApiKind::claiming(p, all);
        assert_eq!(claim("/inference/v1/generate"), Some(ApiKind::VllmGenerate));
        assert_eq!(claim("/generate"), Some(ApiKind::SglangGenerate));
        assert_eq!(claim("generate"), Some(ApiKind::SglangGenerate));
        assert_eq!(
            claim("/v1/images/generations"),
            Some(ApiKind::ImagesGenerations)
        );
        assert_eq!(claim("/v1/messages/count_tokens"), Some(ApiKind::Messages));
        assert_eq!(
            claim("/vllm.grpc.engine.VllmEngine/Generate"),
            Some(ApiKind::VllmGrpcGenerate)
        );
        assert_eq!(
            claim("/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"),
            Some(ApiKind::VertexChatCompletions)
        );
        assert_eq!(claim("/v2/models/m/infer"), None);
        assert_eq!(claim("/v1/xcompletions"), None, "segment boundary");
        // Only the configured kinds claim: chat without the chat parser is
        // nothing, not plain completions.
        let openai_only = [ApiKind::Completions];
        assert_eq!(
            ApiKind::claiming("/v1/chat/completions", &openai_only),
            Some(ApiKind::Completions)
        );
        assert_eq!(ApiKind::claiming("/generate", &openai_only), None);
    }

    #[test]
    fn token_estimate_rounds_up() {
        let r = InferenceRequest::builder("m").prompt("12345").build();
        assert_eq!(r.prompt_tokens_estimate(), 2);
        assert_eq!(r.fairness_id, "default-flow");
    }
}
