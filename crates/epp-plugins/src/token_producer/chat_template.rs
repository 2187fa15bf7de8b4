//! A model's chat template, rendered in process as vLLM renders chat
//! requests: the template from the model's files, the messages normalised
//! as vLLM normalises them, Jinja with the settings Hugging Face
//! `transformers` uses.
//!
//! Input contract of [`ChatTemplate::render`]: the body of a
//! `/v1/chat/completions` request (JSON). What reaches the template:
//! - `messages`, each reduced to the keys vLLM keeps (`role`, `content`,
//!   `name`, `tool_call_id`, `tool_calls`, `reasoning`, `reasoning_content`),
//!   its `content` in the template's content format: a string (text parts
//!   joined by newlines, as vLLM's `string` format), or, for templates that
//!   loop over a message's content, a list of `{"type": "text", "text"}`
//!   parts (vLLM's `openai` format, also for string content); a tool call's
//!   `arguments` given as a JSON string are parsed, as vLLM does;
//! - `tools` as vLLM dumps its pydantic models of them: each tool
//!   `{type ("function" when absent), function: {name, description,
//!   parameters (null when absent)}}` in that order, then the keys the
//!   client added, in its order; `documents` as given;
//!   `add_generation_prompt`
//!   (default true); the tokenizer's special tokens (`bos_token`,
//!   `eos_token`, `unk_token`, `pad_token`); every entry of
//!   `chat_template_kwargs`.
//!
//! Jinja: `trim_blocks`, `lstrip_blocks`, loop controls, Python's string and
//! dict methods, `raise_exception`, `strftime_now` (UTC) and a `tojson` that
//! writes what Python's `json.dumps` writes (key order kept, no HTML
//! escaping). `continue_final_message: true` cuts the output after the last
//! message's content, as `transformers` does.
//!
//! A body with a `chat_template` of its own, or with media parts, is not
//! rendered here ([`Unrendered`]): the ids would not be the engine's.

use std::{fmt::Write as _, path::Path, time::SystemTime};

use minijinja::{
    Environment, Error, ErrorKind, Value,
    value::{Kwargs, ValueKind},
};
use serde_json::Value as Json;

/// The tokenizer's special tokens a template may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos: Option<String>,
    /// `eos_token`.
    pub eos: Option<String>,
    /// `unk_token`.
    pub unk: Option<String>,
    /// `pad_token`.
    pub pad: Option<String>,
}

impl SpecialTokens {
    /// The special tokens in the `tokenizer_config.json` beside `tokenizer`
    /// (none when there is no such file).
    ///
    /// # Errors
    /// A file that cannot be read or parsed.
    pub fn beside(tokenizer: &Path) -> Result<Self, String> {
        let dir = tokenizer.parent().unwrap_or(Path::new("."));
        Ok(read_json(&dir.join("tokenizer_config.json"))?
            .as_ref()
            .map(special_tokens)
            .unwrap_or_default())
    }
}

/// How a template reads a message's `content` (vLLM's content formats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string.
    String,
    /// A list of typed parts.
    OpenAi,
}

/// Why a request is not rendered in process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrendered {
    /// Not something epp renders as the engine would (media parts, a
    /// template of the request's own): the request goes on without ids.
    Unsupported(&'static str),
    /// The body or the template failed (a bad body, `raise_exception`).
    Failed(String),
}

/// A rendered chat request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    /// The prompt text.
    pub text: String,
    /// Whether the tokenizer adds its special tokens (the body's
    /// `add_special_tokens`, default false for chat, as in vLLM).
    pub add_special_tokens: bool,
}

/// A loaded chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    special: SpecialTokens,
    format: ContentFormat,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` with the model's `special` tokens.
    ///
    /// # Errors
    /// A template that does not parse.
    pub fn new(source: String, special: SpecialTokens) -> Result<Self, String> {
        let format = content_format(&source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, without_generation_tags(&source))
            .map_err(|e| format!("the chat template does not parse: {e:#}"))?;
        Ok(Self {
            env,
            special,
            format,
        })
    }

    /// The template of the model whose `tokenizer.json` is `tokenizer`: a
    /// `chat_template.jinja` beside it, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of named templates whose
    /// `default` is taken). Special tokens come from `tokenizer_config.json`.
    /// `Ok(None)`: the model has none.
    ///
    /// # Errors
    /// A file that cannot be read or parsed, or a template that does not.
    pub fn beside(tokenizer: &Path) -> Result<Option<Self>, String> {
        let dir = tokenizer.parent().unwrap_or(Path::new("."));
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let special = config.as_ref().map(special_tokens).unwrap_or_default();
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| format!("{}: {e}", jinja.display()))?)
        } else {
            config.as_ref().and_then(template_in_config)
        };
        source.map(|s| Self::new(s, special)).transpose()
    }

    /// The files [`Self::beside`] reads for `tokenizer`, to watch.
    #[must_use]
    pub fn files_beside(tokenizer: &Path) -> [std::path::PathBuf; 2] {
        let dir = tokenizer.parent().unwrap_or(Path::new("."));
        [
            dir.join("tokenizer_config.json"),
            dir.join("chat_template.jinja"),
        ]
    }

    /// The content format the template reads.
    #[must_use]
    pub fn content_format(&self) -> ContentFormat {
        self.format
    }

    /// Renders a chat request's `body` (see the module docs).
    ///
    /// # Errors
    /// [`Unrendered`]: why not.
    pub fn render(&self, body: &[u8]) -> Result<RenderedChat, Unrendered> {
        // Into template values directly: objects keep the client's key
        // order, which `tojson` (tool schemas) writes as Python would.
        let body: Value = serde_json::from_slice(body)
            .map_err(|e| Unrendered::Failed(format!("body is not JSON: {e}")))?;
        let field = |key: &str| {
            body.get_attr(key)
                .ok()
                .filter(|v| !v.is_undefined() && !v.is_none())
        };
        if field("chat_template").is_some() {
            return Err(Unrendered::Unsupported(
                "the request names its own template",
            ));
        }
        let raw = field("messages")
            .filter(|m| m.kind() == ValueKind::Seq)
            .ok_or_else(|| Unrendered::Failed("no messages".into()))?;
        let mut messages = Vec::new();
        for m in raw.try_iter().map_err(failed)? {
            messages.push(self.message(&m)?);
        }
        // The last message's text, or its last part's (as transformers).
        let last_content = messages
            .last()
            .and_then(|m| m.get_attr("content").ok())
            .and_then(|c| match c.kind() {
                ValueKind::Seq => c
                    .get_item_by_index(c.len()?.checked_sub(1)?)
                    .ok()?
                    .get_attr("text")
                    .ok(),
                _ => Some(c),
            })
            .and_then(|c| c.as_str().map(str::to_owned));
        let flag = |key: &str, default: bool| field(key).map_or(default, |v| v.is_true());
        let continue_final = flag("continue_final_message", false);
        let mut ctx: Vec<(String, Value)> = Vec::new();
        ctx.push(("messages".into(), Value::from(messages)));
        if let Some(tools) = field("tools") {
            ctx.push(("tools".into(), vllm_tools(tools)));
        }
        if let Some(documents) = field("documents") {
            ctx.push(("documents".into(), documents));
        }
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(flag("add_generation_prompt", !continue_final)),
        ));
        for (key, token) in [
            ("bos_token", &self.special.bos),
            ("eos_token", &self.special.eos),
            ("unk_token", &self.special.unk),
            ("pad_token", &self.special.pad),
        ] {
            if let Some(t) = token {
                ctx.push((key.into(), Value::from(t.as_str())));
            }
        }
        // The request's kwargs last: they override the rest, as in vLLM.
        if let Some(kwargs) = field("chat_template_kwargs").filter(|k| k.kind() == ValueKind::Map) {
            for key in kwargs.try_iter().map_err(failed)? {
                let value = kwargs.get_item(&key).map_err(failed)?;
                if let Some(k) = key.as_str() {
                    ctx.retain(|(name, _)| name != k);
                    ctx.push((k.to_owned(), value));
                }
            }
        }
        let template = self.env.get_template(NAME).map_err(failed)?;
        let mut text = template
            .render(Value::from_iter(ctx))
            .map_err(|e| Unrendered::Failed(format!("{e:#}")))?;
        if continue_final
            && let Some(last) = last_content.filter(|c| !c.trim().is_empty())
            && let Some(at) = text.rfind(last.trim())
        {
            text.truncate(at + last.trim().len());
        }
        Ok(RenderedChat {
            text,
            add_special_tokens: flag("add_special_tokens", false),
        })
    }

    /// One message as vLLM hands it to the template.
    fn message(&self, m: &Value) -> Result<Value, Unrendered> {
        if m.kind() != ValueKind::Map {
            return Err(Unrendered::Failed("a message is not an object".into()));
        }
        let attr = |key: &str| {
            m.get_attr(key)
                .ok()
                .filter(|v| !v.is_undefined() && !v.is_none())
        };
        let mut texts: Vec<String> = Vec::new();
        match attr("content") {
            None => {}
            Some(c) if c.kind() == ValueKind::String => {
                texts.push(c.as_str().unwrap_or_default().to_owned())
            }
            Some(c) if c.kind() == ValueKind::Seq => {
                for p in c.try_iter().map_err(failed)? {
                    let kind = p.get_attr("type").ok();
                    let text = p.get_attr("text").ok();
                    match (
                        kind.as_ref().and_then(Value::as_str),
                        text.as_ref().and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => texts.push(t.to_owned()),
                        (Some("text"), None) => {
                            return Err(Unrendered::Failed("a text part without text".into()));
                        }
                        _ => return Err(Unrendered::Unsupported("a message has media parts")),
                    }
                }
            }
            Some(_) => return Err(Unrendered::Failed("a message's content is not text".into())),
        }
        let content = match self.format {
            ContentFormat::String => Value::from(texts.join("\n")),
            ContentFormat::OpenAi => Value::from(
                texts
                    .into_iter()
                    .map(|t| {
                        Value::from_iter([("type", Value::from("text")), ("text", Value::from(t))])
                    })
                    .collect::<Vec<_>>(),
            ),
        };
        let mut out: Vec<(&str, Value)> = vec![
            ("role", attr("role").unwrap_or_else(|| Value::from("user"))),
            ("content", content),
        ];
        for key in ["name", "tool_call_id", "reasoning", "reasoning_content"] {
            if let Some(v) = attr(key) {
                out.push((key, v));
            }
        }
        if let Some(calls) = attr("tool_calls").filter(|c| c.kind() == ValueKind::Seq) {
            let calls: Vec<Value> = calls
                .try_iter()
                .map_err(failed)?
                .map(parse_arguments)
                .collect();
            out.push(("tool_calls", Value::from(calls)));
        }
        Ok(Value::from_iter(out))
    }
}

fn failed(e: Error) -> Unrendered {
    Unrendered::Failed(format!("{e:#}"))
}

/// A tool call whose `function.arguments` is a JSON string, with it parsed
/// (vLLM does so for templates that expect a mapping); others as they are.
fn parse_arguments(call: Value) -> Value {
    let Ok(function) = call.get_attr("function") else {
        return call;
    };
    let Some(parsed) = function.get_attr("arguments").ok().and_then(|a| {
        a.as_str()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
    }) else {
        return call;
    };
    let rebuild = |v: &Value, key: &str, new: Value| -> Value {
        Value::from_iter(v.try_iter().into_iter().flatten().map(|k| {
            let item = if k.as_str() == Some(key) {
                new.clone()
            } else {
                v.get_item(&k).unwrap_or_default()
            };
            (k, item)
        }))
    };
    let function = rebuild(&function, "arguments", parsed);
    rebuild(&call, "function", function)
}

/// `source` with transformers' `{% generation %}` / `{% endgeneration %}`
/// tags (its extension marking assistant text, which renders the text as
/// it is) turned into an always-true `if`, whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let (left, body) = inner.strip_prefix('-').map_or(("", inner), |b| ("-", b));
        let (body, right) = body.strip_suffix('-').map_or((body, ""), |b| (b, "-"));
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{left} if true {right}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{left} endif {right}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// vLLM's detection, approximated: a template that loops over a message's
/// content reads parts; any other reads a string.
fn content_format(source: &str) -> ContentFormat {
    let compact: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
    let loops_over_content = compact.match_indices(" in ").any(|(at, _)| {
        let rest = &compact[at + 4..];
        let expr = rest.split([' ', '%', '|', ')']).next().unwrap_or("");
        expr.ends_with("['content']")
            || expr.ends_with("[\"content\"]")
            || expr.ends_with(".content")
    });
    if loops_over_content {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

fn read_json(path: &Path) -> Result<Option<Json>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn special_tokens(config: &Json) -> SpecialTokens {
    // A token is a string, or an added-token object with its `content`.
    let token = |key: &str| match config.get(key) {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    };
    SpecialTokens {
        bos: token("bos_token"),
        eos: token("eos_token"),
        unk: token("unk_token"),
        pad: token("pad_token"),
    }
}

fn template_in_config(config: &Json) -> Option<String> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time in `format` (the common
/// `strftime` codes: `%d %m %y %Y %b %B %a %A %H %M %S %j %%`).
fn strftime_now(format: &str) -> Result<String, Error> {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(strftime(format, secs))
}

fn strftime(format: &str, unix: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix / 86_400;
    let secs = unix % 86_400;
    let (y, m, d) = civil_from_days(days);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before: [u64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(m - 1) as usize] + d + u64::from(leap && m > 2);
    // 1970-01-01 was a Thursday.
    let weekday = ((days + 3) % 7) as usize;
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{d:02}"),
            Some('m') => write!(out, "{m:02}"),
            Some('y') => write!(out, "{:02}", y % 100),
            Some('Y') => write!(out, "{y}"),
            Some('b') => write!(out, "{}", &month[..3]),
            Some('B') => write!(out, "{month}"),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('H') => write!(out, "{:02}", secs / 3600),
            Some('M') => write!(out, "{:02}", secs / 60 % 60),
            Some('S') => write!(out, "{:02}", secs % 60),
            Some('j') => write!(out, "{yday:03}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// `tojson`, as `transformers` defines it: Python's `json.dumps` with
/// `ensure_ascii=False` (and the `indent` and `sort_keys` it passes on).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dumps(value, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    Ok(out)
}

fn dumps(
    v: &Value,
    indent: Option<usize>,
    sort: bool,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    use ValueKind as K;
    match v.kind() {
        K::Undefined | K::None => out.push_str("null"),
        K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        K::Number => {
            if v.is_integer() {
                let _ = write!(out, "{v}");
            } else {
                py_float(f64::try_from(v.clone())?, out);
            }
        }
        K::String => py_string(v.as_str().unwrap_or_default(), out),
        K::Seq | K::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            container(out, "[]", items.len(), indent, level, |i, out| {
                dumps(&items[i], indent, sort, level + 1, out)
            })?;
        }
        K::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort();
            }
            container(out, "{}", keys.len(), indent, level, |i, out| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => py_string(s, out),
                    None => py_string(&key.to_string(), out),
                }
                out.push_str(": ");
                dumps(&v.get_item(key)?, indent, sort, level + 1, out)
            })?;
        }
        K::Bytes | K::Plain | K::Invalid | _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} is not JSON", v.kind()),
            ));
        }
    }
    Ok(())
}

/// `n` items between the two characters of `brackets`, laid out as
/// `json.dumps` lays them out (`", "` between them, or one per line under
/// `indent`); `item` writes item `i`.
fn container(
    out: &mut String,
    brackets: &str,
    n: usize,
    indent: Option<usize>,
    level: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    let (open, close) = brackets.split_at(1);
    out.push_str(open);
    if n == 0 {
        out.push_str(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * level));
        }
    };
    for i in 0..n {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, level + 1);
        item(i, out)?;
    }
    newline(out, level);
    out.push_str(close);
    Ok(())
}

/// A string as `json.dumps(..., ensure_ascii=False)` writes it.
fn py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it (`1.0`, `1e-07`, `1e+16`).
fn py_float(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("NaN");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    // Python switches to exponent notation below 1e-4 and from 1e16.
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    } else {
        let _ = write!(out, "{f:?}");
    }
}

/// `tools` as vLLM hands them to templates: validated into its models
/// (`ChatCompletionToolsParam`, `FunctionDefinition`, extra keys allowed)
/// and dumped again, so the declared fields come first, in declared order,
/// with their defaults, then the client's other keys. A tool vLLM would
/// refuse (no `function` object with a string `name`) is left as given:
/// the engine never renders that request.
fn vllm_tools(tools: Value) -> Value {
    if tools.kind() != ValueKind::Seq {
        return tools;
    }
    let Ok(items) = tools.try_iter() else {
        return tools;
    };
    Value::from(
        items
            .map(|t| vllm_tool(&t).unwrap_or(t))
            .collect::<Vec<_>>(),
    )
}

fn vllm_tool(tool: &Value) -> Option<Value> {
    let function = tool
        .get_attr("function")
        .ok()
        .filter(|f| f.kind() == ValueKind::Map)?;
    function.get_attr("name").ok()?.as_str()?;
    let null = || Some(Value::from(()));
    let function = dumped(
        &function,
        &[
            ("name", None),
            ("description", null()),
            ("parameters", null()),
        ],
    )?;
    // `function` is the second declared field.
    let mut tool = dumped(
        tool,
        &[("type", Some(Value::from("function"))), ("function", None)],
    )?;
    tool[1].1 = Value::from_iter(function);
    Some(Value::from_iter(tool))
}

/// `map`'s entries as pydantic dumps a model with `declared` fields (a
/// default, or `None`: required) and extra keys allowed: the declared
/// fields first, in their order, then the others in theirs.
fn dumped(map: &Value, declared: &[(&str, Option<Value>)]) -> Option<Vec<(String, Value)>> {
    if map.kind() != ValueKind::Map {
        return None;
    }
    let mut out: Vec<(String, Value)> = Vec::new();
    for (key, default) in declared {
        match map.get_attr(key).ok().filter(|v| !v.is_undefined()) {
            Some(v) => out.push(((*key).to_owned(), v)),
            None => out.push(((*key).to_owned(), default.clone()?)),
        }
    }
    for k in map.try_iter().ok()? {
        let Some(key) = k.as_str() else { continue };
        if declared.iter().all(|(d, _)| *d != key) {
            out.push((key.to_owned(), map.get_item(&k).ok()?));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests;
