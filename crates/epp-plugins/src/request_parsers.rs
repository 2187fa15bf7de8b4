//! The request parsers llm-d names under `requestHandler.parsers`: each
//! claims the path suffixes of the APIs it reads, and the ext_proc service
//! reads a request's body as the API whose claim is the longest suffix of
//! its path (docs/api-parsing.md):
//!
//! ```text
//! openai-parser       /completions, /chat/completions (and their /render),
//!                     /responses, /conversations, /embeddings,
//!                     /images/generations
//! anthropic-parser    /messages, /messages/count_tokens
//! vllmhttp-parser     /inference/v1/generate
//! sglanghttp-parser   /generate
//! vllmgrpc-parser     vllm.grpc.engine.VllmEngine/Generate
//! vertexai-parser     PredictionService/ChatCompletions, …/RawPredict,
//!                     …/StreamRawPredict
//! passthrough-parser  nothing: the fallback; its requests are routed on
//!                     load signals alone and forwarded untouched
//! ```

use epp_core::{ApiKind, BuildError, OPENAI_KINDS, Plugin, RequestParser};

use crate::{Builtin, NoParams};

/// One of llm-d's request parsers: see the module docs.
#[derive(Debug, Clone)]
pub struct ApiParser {
    name: String,
    type_name: &'static str,
    claims: &'static [ApiKind],
}

impl Builtin for ApiParser {
    const TYPE: &'static str = "openai-parser";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self {
            name: name.into(),
            type_name: Self::TYPE,
            claims: &OPENAI_KINDS,
        })
    }
}

/// Every parser type but `openai-parser`, with what it claims.
pub const OTHER_PARSERS: [(&str, &[ApiKind]); 6] = [
    ("anthropic-parser", &[ApiKind::Messages]),
    ("vllmhttp-parser", &[ApiKind::VllmGenerate]),
    ("sglanghttp-parser", &[ApiKind::SglangGenerate]),
    ("vllmgrpc-parser", &[ApiKind::VllmGrpcGenerate]),
    (
        "vertexai-parser",
        &[ApiKind::VertexChatCompletions, ApiKind::VertexRawPredict],
    ),
    ("passthrough-parser", &[]),
];

impl ApiParser {
    /// llm-d's YAML type for the Anthropic Messages parser.
    pub const ANTHROPIC_TYPE: &'static str = "anthropic-parser";

    /// The parser of type `type_name` (one of [`OTHER_PARSERS`]).
    #[must_use]
    pub fn other(name: impl Into<String>, type_name: &'static str) -> Option<Self> {
        let (t, claims) = OTHER_PARSERS.iter().find(|(t, _)| *t == type_name)?;
        Some(Self {
            name: name.into(),
            type_name: t,
            claims,
        })
    }

    /// The Anthropic Messages parser.
    #[must_use]
    pub fn anthropic(name: impl Into<String>) -> Self {
        Self::other(name, Self::ANTHROPIC_TYPE).unwrap_or_else(|| unreachable!("listed above"))
    }
}

impl Plugin for ApiParser {
    fn type_name(&self) -> &str {
        self.type_name
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_request_parser(&self) -> Option<&dyn RequestParser> {
        Some(self)
    }
}

impl RequestParser for ApiParser {
    fn claims(&self) -> &[ApiKind] {
        self.claims
    }
}
