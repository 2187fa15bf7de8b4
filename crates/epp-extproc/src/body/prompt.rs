//! The text the prefix index hashes, per API kind.
//!
//! The definition is documented in `docs/api-parsing.md`; in short, every API
//! is flattened into a chat-like transcript so that a conversation that grows
//! by appending turns produces a text that grows by appending, and so that
//! equivalent spellings (string content vs. text parts, key order inside
//! tools) produce the same text.

use std::borrow::Cow;

use epp_core::{ApiKind, CHARS_PER_TOKEN};
use serde_json::{Value, value::RawValue};

use super::chat::{Message, Messages};

/// The prompt-bearing fields of a body, per API kind.
#[derive(Debug, Default)]
pub(super) struct PromptFields<'a> {
    pub(super) prompt: Option<&'a RawValue>,
    pub(super) messages: Option<Messages<'a>>,
    pub(super) input: Option<&'a RawValue>,
    pub(super) instructions: Option<&'a RawValue>,
    pub(super) tools: Option<&'a RawValue>,
    pub(super) items: Option<&'a RawValue>,
    pub(super) system: Option<&'a RawValue>,
}

/// A rendered prompt: its text, and how many media parts (images, audio,
/// video, files) the messages hold, which stand in the text as markers.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Rendered {
    pub(super) text: String,
    pub(super) media_parts: u32,
    /// The prompt's token ids, when it is given as one list of them.
    pub(super) token_ids: Option<Vec<u32>>,
}

impl Rendered {
    pub(super) fn push_str(&mut self, s: &str) {
        self.text.push_str(s);
    }
    fn push(&mut self, c: char) {
        self.text.push(c);
    }
}

/// Renders the prompt text of a request.
pub(super) fn render(api: ApiKind, f: &PromptFields<'_>) -> Rendered {
    let mut out = Rendered::default();
    match api {
        ApiKind::Completions => {
            prompt_like_raw(f.prompt, &mut out);
            out.token_ids = value(f.prompt).and_then(|v| token_list(&v));
        }
        ApiKind::Embeddings => {
            prompt_like_raw(f.input, &mut out);
        }
        ApiKind::ImagesGenerations => {
            prompt_like_raw(f.prompt, &mut out);
        }
        ApiKind::ChatCompletions => {
            tools(f.tools, &mut out);
            messages(f.messages.as_ref(), &mut out);
        }
        ApiKind::Responses => {
            tools(f.tools, &mut out);
            if let Some(v) = value(f.instructions) {
                turn("system", &v, &mut out);
            }
            match value(f.input) {
                Some(Value::Array(items)) => items.iter().for_each(|i| item(i, &mut out)),
                Some(v @ Value::String(_)) => turn("user", &v, &mut out),
                Some(other) => canonical_line(&other, &mut out),
                None => {}
            }
        }
        ApiKind::Conversations => {
            if let Some(Value::Array(items)) = value(f.items) {
                items.iter().for_each(|i| item(i, &mut out));
            }
        }
        ApiKind::Messages => {
            tools(f.tools, &mut out);
            if let Some(v) = value(f.system) {
                turn("system", &v, &mut out);
            }
            messages(f.messages.as_ref(), &mut out);
        }
        // A kind added to epp-core later: hash whatever prompt-like field exists.
        _ => {
            prompt_like_raw(f.prompt.or(f.input), &mut out);
        }
    }
    out
}

fn value(raw: Option<&RawValue>) -> Option<Value> {
    raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
        .filter(|v| !v.is_null())
}

/// [`prompt_like`] of a field as it is in the body: a plain string (the usual
/// long prompt) is copied out once, without building a `Value` first.
fn prompt_like_raw(raw: Option<&RawValue>, out: &mut Rendered) {
    if let Some(r) = raw
        && r.get().starts_with('"')
        && let Some(text) = json_str(r)
    {
        out.push_str(&text);
    } else if let Some(v) = value(raw) {
        prompt_like(&v, out);
    }
}

/// `v` as one list of token ids (each a u32), if it is one.
fn token_list(v: &Value) -> Option<Vec<u32>> {
    let Value::Array(items) = v else {
        return None;
    };
    if items.is_empty() {
        return None;
    }
    items
        .iter()
        .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// `prompt` / `input` of completions and embeddings: a string, strings, token
/// ids, or lists of token ids. Several prompts are joined with `\n`.
fn prompt_like(v: &Value, out: &mut Rendered) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(items) if items.iter().all(Value::is_number) => tokens(items, out),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                match item {
                    Value::String(s) => out.push_str(s),
                    Value::Array(ids) => tokens(ids, out),
                    other => canonical(other, out),
                }
            }
        }
        other => canonical(other, out),
    }
}

/// Token ids, each as exactly [`CHARS_PER_TOKEN`] characters, so one hashed
/// block of `N × 4` characters is exactly `N` tokens.
fn tokens(ids: &[Value], out: &mut Rendered) {
    token_text(ids.iter().map(|id| id.as_u64().unwrap_or(0)), out);
}

/// Token ids rendered as [`tokens`] renders them.
pub(super) fn token_text(ids: impl Iterator<Item = u64>, out: &mut Rendered) {
    const DIGITS: &[u8; 64] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+/";
    for n in ids {
        for k in (0..CHARS_PER_TOKEN).rev() {
            let digit = (n >> (6 * k)) & 63;
            out.push(char::from(DIGITS[digit as usize]));
        }
    }
}

/// `tools` first (they precede the conversation in chat templates), as
/// canonical JSON.
fn tools(raw: Option<&RawValue>, out: &mut Rendered) {
    if let Some(v) = value(raw) {
        out.push_str("tools:\n");
        canonical_line(&v, out);
    }
}

/// A `messages` array, rendered as [`message`] renders each one. The
/// messages were read in the body's one pass (see `messages.rs`); string
/// content — nearly all of a long prompt — is taken straight from the body
/// (borrowed unless it has escapes) instead of through a `Value`.
fn messages(list: Option<&Messages<'_>>, out: &mut Rendered) {
    if let Some(Messages::List(items)) = list {
        for m in items {
            fast_message(m, out);
        }
    }
}

/// A JSON string, borrowed from the body unless it has escapes.
fn json_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    // The body is valid JSON: a string without a backslash is its own text
    // between the quotes (a byte search, not another JSON scan).
    if text.len() >= 2 && memchr::memchr(b'\\', text.as_bytes()).is_none() {
        return text.get(1..text.len() - 1).map(Cow::Borrowed);
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

/// Renders `m` as [`message`] renders the same message read into a `Value`.
fn fast_message(m: &Message<'_>, out: &mut Rendered) {
    // A role that is missing, null or not a string reads as "user".
    let role: Cow<'_, str> = m
        .role
        .filter(|r| r.get().starts_with('"'))
        .and_then(json_str)
        .unwrap_or(Cow::Borrowed("user"));
    let content = match m.content {
        // A string is valid JSON here, so `json_str` cannot fail on it.
        Some(c) if c.get().starts_with('"') => Some(json_str(c)),
        Some(_) => Some(None),
        None => None,
    };
    out.push_str(&role);
    out.push_str(":\n");
    match (content, m.content) {
        (Some(Some(text)), _) => {
            out.push_str(&text);
            out.push('\n');
        }
        (Some(None), Some(c)) => {
            let v = serde_json::from_str::<Value>(c.get()).unwrap_or(Value::Null);
            content_text(&v, out);
            out.push('\n');
        }
        _ => {}
    }
    if let Some(calls) = m.tool_calls
        && let Ok(calls) = serde_json::from_str::<Value>(calls.get())
        && !calls.is_null()
    {
        canonical_line(&calls, out);
    }
}

/// One chat / Anthropic message: `role:\n<content>\n`, then tool calls.
fn message(m: &Value, out: &mut Rendered) {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    match m.get("content") {
        Some(content) => turn(role, content, out),
        None => {
            out.push_str(role);
            out.push_str(":\n");
        }
    }
    if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
        canonical_line(calls, out);
    }
}

/// A Responses / Conversations item: a message when it has a role, otherwise
/// (function calls, outputs, reasoning) its canonical JSON.
fn item(i: &Value, out: &mut Rendered) {
    if i.get("role").is_some() {
        message(i, out);
    } else {
        canonical_line(i, out);
    }
}

fn turn(role: &str, content: &Value, out: &mut Rendered) {
    out.push_str(role);
    out.push_str(":\n");
    content_text(content, out);
    out.push('\n');
}

/// Message content: a string, or parts whose texts are joined with `\n`
/// (as chat templates do), media as `<kind:reference>` markers.
fn content_text(content: &Value, out: &mut Rendered) {
    match content {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                part_text(part, out);
            }
        }
        Value::Null => {}
        other => canonical(other, out),
    }
}

fn part_text(part: &Value, out: &mut Rendered) {
    let Some(obj) = part.as_object() else {
        if let Some(s) = part.as_str() {
            out.push_str(s);
        } else {
            canonical(part, out);
        }
        return;
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("text");
    let text_of = |key: &str| obj.get(key).and_then(Value::as_str);
    match kind {
        "text" | "input_text" | "output_text" if text_of("text").is_some() => {
            out.push_str(text_of("text").unwrap_or_default());
        }
        "refusal" if text_of("refusal").is_some() => {
            out.push_str(text_of("refusal").unwrap_or_default());
        }
        "image_url" | "input_image" | "video_url" | "input_audio" | "image" | "document"
        | "audio_url" | "input_file" => {
            out.media_parts = out.media_parts.saturating_add(1);
            out.push('<');
            out.push_str(kind);
            out.push(':');
            // The reference inside: a URL string, `{url}`, `{data}`, or a source object.
            let reference = obj
                .get(kind)
                .or_else(|| obj.get("image_url"))
                .or_else(|| obj.get("source"))
                .or_else(|| obj.get("file_id"));
            match reference {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Object(o)) if o.get("url").is_some_and(Value::is_string) => {
                    out.push_str(o.get("url").and_then(Value::as_str).unwrap_or_default());
                }
                Some(other) => canonical(other, out),
                None => canonical(part, out),
            }
            out.push('>');
        }
        "tool_result" => match obj.get("content") {
            Some(c) => content_text(c, out),
            None => canonical(part, out),
        },
        _ => canonical(part, out),
    }
}

fn canonical_line(v: &Value, out: &mut Rendered) {
    canonical(v, out);
    out.push('\n');
}

/// JSON with object keys sorted and no insignificant whitespace, so that key
/// order and formatting do not change the hashed text.
fn canonical(v: &Value, out: &mut Rendered) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(val) = map.get(k) {
                    canonical(val, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::body::parse_body;

    use super::*;

    fn prompt(api: ApiKind, body: &str) -> String {
        parse_body(api, body.as_bytes()).unwrap().prompt
    }

    /// The borrowed fast path renders every message exactly as the `Value`
    /// path does, including the shapes it hands over to it.
    #[test]
    fn fast_messages_match_the_value_rendering() {
        let cases = [
            r#"[{"role":"user","content":"plain"}]"#,
            r#"[{"role":"system","content":"a\nb \"q\" \u00e9"},{"role":"user","content":"x"}]"#,
            r#"[{"role":"assistant","content":null,"tool_calls":[{"b":1,"a":2}]}]"#,
            r#"[{"role":"assistant"},{"content":"no role"},{"role":7,"content":"odd role"}]"#,
            r#"[{"role":"user","content":[{"type":"text","text":"t1"},{"type":"image_url","image_url":{"url":"u"}}]}]"#,
            r#"[{"role":"user","content":"first","content":"second"}]"#,
            r#"[{"role":"tool","content":"r","tool_calls":null,"name":"f"}]"#,
            r#"["just a string", 5, null, {"role":"user","content":{"k":"v"}}]"#,
            r#"[[1,{"role":"x"}], {"ro\u006ce":"esc","content":"k","x":{"role":"inner"}}]"#,
            r#"[{"role":"a","role":5,"tool_calls":[1],"tool_calls":null}]"#,
            r#""a string""#,
            r#"7"#,
            r#"[]"#,
            r#"{"not":"an array"}"#,
            r#"null"#,
        ];
        for case in cases {
            let raw: &RawValue = serde_json::from_str(case).unwrap();
            let list: Messages<'_> = serde_json::from_str(case).unwrap();
            let mut fast = Rendered::default();
            messages(Some(&list), &mut fast);
            let mut slow = Rendered::default();
            if let Some(Value::Array(msgs)) = value(Some(raw)) {
                for m in &msgs {
                    message(m, &mut slow);
                }
            }
            assert_eq!(fast, slow, "{case}");
        }
    }

    #[test]
    fn completions_prompt_forms() {
        let c = ApiKind::Completions;
        assert_eq!(prompt(c, r#"{"model":"m","prompt":"abc"}"#), "abc");
        assert_eq!(prompt(c, r#"{"model":"m","prompt":["abc"]}"#), "abc");
        assert_eq!(prompt(c, r#"{"model":"m","prompt":["a","b"]}"#), "a\nb");
        assert_eq!(prompt(c, r#"{"model":"m","prompt":[1,64]}"#), "00010010");
        assert_eq!(
            prompt(c, r#"{"model":"m","prompt":[[1],[2]]}"#),
            "0001\n0002"
        );
        assert_eq!(prompt(c, r#"{"model":"m"}"#), "");
        let r = parse_body(c, br#"{"model":"m","prompt":[5,6,7]}"#).unwrap();
        assert_eq!(r.prompt.len(), 3 * CHARS_PER_TOKEN);
    }

    #[test]
    fn chat_string_and_parts_are_equivalent() {
        let chat = ApiKind::ChatCompletions;
        let a = prompt(
            chat,
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi\nthere"}]}"#,
        );
        let b = prompt(
            chat,
            r#"{"messages":[{"content":"be brief","role":"system"},{"role":"user","content":[{"type":"text","text":"hi"},{"text":"there","type":"text"}]}],"model":"m"}"#,
        );
        assert_eq!(a, b);
        assert_eq!(a, "system:\nbe brief\nuser:\nhi\nthere\n");
    }

    #[test]
    fn growing_conversation_extends_the_prompt() {
        let chat = ApiKind::ChatCompletions;
        let one = prompt(
            chat,
            r#"{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"messages":[{"role":"user","content":"q1"}]}"#,
        );
        let two = prompt(
            chat,
            r#"{"model":"m","tools":[{"function":{"parameters":{},"name":"f"},"type":"function"}],"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#,
        );
        assert!(two.starts_with(&one), "{one:?} / {two:?}");
        assert!(one.starts_with("tools:\n[{\"function\""));
    }

    #[test]
    fn media_parts_are_markers() {
        let p = prompt(
            ApiKind::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}},{"type":"text","text":"what?"}]}]}"#,
        );
        assert_eq!(p, "user:\n<image_url:http://x/a.png>\nwhat?\n");
    }

    #[test]
    fn responses_conversations_embeddings_messages() {
        let r = prompt(
            ApiKind::Responses,
            r#"{"model":"m","instructions":"sys","input":"hello"}"#,
        );
        assert_eq!(r, "system:\nsys\nuser:\nhello\n");
        let r2 = prompt(
            ApiKind::Responses,
            r#"{"model":"m","instructions":"sys","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}]}"#,
        );
        assert_eq!(r, r2);
        let conv = prompt(
            ApiKind::Conversations,
            r#"{"model":"m","items":[{"type":"message","role":"user","content":"hello"}]}"#,
        );
        assert_eq!(conv, "user:\nhello\n");
        let emb = prompt(ApiKind::Embeddings, r#"{"model":"m","input":["x","y"]}"#);
        assert_eq!(emb, "x\ny");
        let anth = prompt(
            ApiKind::Messages,
            r#"{"model":"m","system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hello"}]}"#,
        );
        let chat = prompt(
            ApiKind::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hello"}]}"#,
        );
        assert_eq!(anth, chat);
    }

    #[test]
    fn odd_shapes_never_fail() {
        for body in [
            r#"{"model":"m","messages":"x"}"#,
            r#"{"model":"m","messages":[1,null,{"content":{"a":1}}]}"#,
            r#"{"model":"m","prompt":{"a":[1,2]}}"#,
            r#"{"model":"m","input":[{"type":"function_call","name":"f"}]}"#,
        ] {
            // The OpenAI-shaped kinds (the engines' native ones need their
            // own fields and refuse these).
            for api in epp_core::OPENAI_KINDS
                .into_iter()
                .chain([ApiKind::Messages, ApiKind::Passthrough])
            {
                let _ = prompt(api, body);
            }
        }
    }
}
