//! `openai-parser` and `anthropic-parser`: declare the request parser the
//! ext_proc edge runs.

use epp_core::{BuildError, Plugin};

use crate::{Builtin, NoParams};

/// `openai-parser` / `anthropic-parser`: requests are parsed by the ext_proc
/// service, which reads the OpenAI-compatible APIs and Anthropic Messages by
/// path (docs/api-parsing.md). Declaring either in a config (llm-d lists both
/// under `requestHandler.parsers`) selects that one parser; it does not turn
/// the other API off, as llm-d's parser list would.
#[derive(Debug, Clone)]
pub struct OpenAiParser {
    name: String,
    type_name: &'static str,
}

impl Builtin for OpenAiParser {
    const TYPE: &'static str = "openai-parser";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self {
            name: name.into(),
            type_name: Self::TYPE,
        })
    }
}

impl OpenAiParser {
    /// llm-d's YAML type for the Anthropic Messages parser.
    pub const ANTHROPIC_TYPE: &'static str = "anthropic-parser";

    /// The same parser declared as llm-d's `anthropic-parser`.
    #[must_use]
    pub fn anthropic(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            type_name: Self::ANTHROPIC_TYPE,
        }
    }
}

impl Plugin for OpenAiParser {
    fn type_name(&self) -> &str {
        self.type_name
    }
    fn name(&self) -> &str {
        &self.name
    }
}
