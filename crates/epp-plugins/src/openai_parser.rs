//! `openai-parser`: declares the request parser the ext_proc edge runs.

use epp_core::Plugin;

/// `openai-parser`: requests are parsed as OpenAI-compatible APIs (and
/// Anthropic Messages) by the ext_proc service; declaring it in a config
/// selects that parser, the only one there is.
#[derive(Debug, Clone)]
pub struct OpenAiParser {
    name: String,
}

impl OpenAiParser {
    /// YAML type.
    pub const TYPE: &'static str = "openai-parser";

    /// A parser plugin named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Plugin for OpenAiParser {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
}
