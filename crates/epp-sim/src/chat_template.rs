//! Chat templates (`--chat-template`): chat requests rendered through a Jinja
//! template, as vLLM renders them with its model's template, then tokenized
//! without special tokens (the template writes them), as vLLM tokenizes
//! chat. Text content only; list content has its text parts joined by
//! newlines. `bos_token` and `eos_token` come from the `tokenizer_config.json`
//! beside the `--tokenizer`, when there is one.

use std::path::Path;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value as Jinja};
use serde_json::Value;

use crate::error::Error;

/// A loaded chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Option<String>,
    eos: Option<String>,
}

impl ChatTemplate {
    /// Loads the template file `path`, with the special tokens of the
    /// tokenizer at `tokenizer` (a `tokenizer.json` or its directory).
    ///
    /// # Errors
    /// An unreadable file or a template that does not parse.
    pub fn load(path: &Path, tokenizer: Option<&Path>) -> Result<Self, Error> {
        let fail = |reason: String| Error::ChatTemplate {
            path: path.display().to_string(),
            reason,
        };
        let source = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |m: String| -> Result<Jinja, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, m))
            },
        );
        env.add_template_owned("chat", source)
            .map_err(|e| fail(format!("{e:#}")))?;
        let config = tokenizer
            .map(|t| {
                if t.is_dir() {
                    t.to_path_buf()
                } else {
                    t.parent().unwrap_or(Path::new(".")).to_path_buf()
                }
            })
            .map(|dir| dir.join("tokenizer_config.json"))
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|text| serde_json::from_str::<Value>(&text).ok());
        let token = |key: &str| {
            config.as_ref().and_then(|c| match c.get(key)? {
                Value::String(s) => Some(s.clone()),
                other => other.get("content")?.as_str().map(str::to_owned),
            })
        };
        Ok(Self {
            bos: token("bos_token"),
            eos: token("eos_token"),
            env,
        })
    }

    /// The prompt text of a chat request body `v`. A message's list of parts
    /// is its text parts joined by newlines (vLLM's "string" content
    /// format); with `media_markers`, a marker per media part (`<image>`,
    /// `<audio>`, `<video>`) goes before them, as vLLM puts a multimodal
    /// model's placeholders before the text.
    ///
    /// # Errors
    /// The template failed (e.g. `raise_exception`).
    pub fn render(&self, v: &Value, media_markers: bool) -> Result<String, String> {
        let messages: Vec<Value> =
            v.get("messages")
                .and_then(Value::as_array)
                .map(|ms| {
                    ms.iter()
                        .map(|m| {
                            let content = match m.get("content") {
                                Some(Value::String(s)) => s.clone(),
                                Some(Value::Array(parts)) => {
                                    let text = parts
                                        .iter()
                                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                                        .collect::<Vec<_>>()
                                        .join("\n");
                                    // vLLM: "\n".join(placeholders + [text]).
                                    let mut lines: Vec<&str> = Vec::new();
                                    if media_markers {
                                        lines.extend(parts.iter().filter_map(|p| {
                                            media_marker(p.get("type")?.as_str()?)
                                        }));
                                    }
                                    if lines.is_empty() {
                                        text
                                    } else {
                                        lines.push(&text);
                                        lines.join("\n")
                                    }
                                }
                                _ => String::new(),
                            };
                            let role = m.get("role").cloned().unwrap_or(Value::from("user"));
                            serde_json::json!({"role": role, "content": content})
                        })
                        .collect()
                })
                .unwrap_or_default();
        let ctx = serde_json::json!({
            "messages": messages,
            "add_generation_prompt": v.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true),
            "bos_token": self.bos,
            "eos_token": self.eos,
        });
        self.env
            .get_template("chat")
            .and_then(|t| t.render(Jinja::from_serialize(&ctx)))
            .map_err(|e| format!("{e:#}"))
    }
}

/// The media markers a prompt may hold and their modalities.
pub const MEDIA_MARKERS: [(&str, &str); 3] = [
    ("<image>", "image"),
    ("<audio>", "audio"),
    ("<video>", "video"),
];

/// The modality of a chat content part of type `kind`, if it is media.
#[must_use]
pub fn media_modality(kind: &str) -> Option<&'static str> {
    match kind {
        "image_url" | "input_image" => Some("image"),
        "input_audio" | "audio_url" => Some("audio"),
        "video_url" => Some("video"),
        _ => None,
    }
}

/// The marker a media part of type `kind` renders as in a prompt (which the
/// engine expands into placeholder tokens).
#[must_use]
pub fn media_marker(kind: &str) -> Option<&'static str> {
    let modality = media_modality(kind)?;
    MEDIA_MARKERS
        .iter()
        .find(|(_, m)| *m == modality)
        .map(|(marker, _)| *marker)
}
