//! `token-producer`: tokenizes the request's prompt in process, with the
//! model's own `tokenizer.json` (the `tokenizers` crate, as the engines'
//! Hugging Face tokenizers do), and writes the ids to `CycleState::tokens`
//! for the precise prefix producer and other readers.
//!
//! The tokenizer is loaded at start from `local.path` (a `tokenizer.json`,
//! or a model directory holding one) and reloaded when the file changes (a
//! bad new file is logged and the old tokenizer kept). No network call is
//! made on the request path.
//!
//! Byte-level BPE tokenizers (GPT-2's and Llama 3's shapes, see
//! [`ByteBpe::from_json`]) are encoded by epp's own [`ByteBpe`], which gives
//! the crate's ids several times faster; any other file is encoded by the
//! crate. Which one is used is logged when the file is loaded.
//!
//! What is tokenized: a completions request's prompt string, with the
//! tokenizer's special tokens added (`add_special_tokens`, as vLLM does),
//! cut at `maxPromptBytes`. A chat request is rendered through the model's
//! chat template in process ([`ChatTemplate`]: `chat_template.jinja` beside
//! the tokenizer, else `tokenizer_config.json`'s, or `local.chatTemplate`),
//! by the edge before scheduling ([`Plugin::prompt_renderer`]), and its
//! text tokenized without special tokens unless the request asks for them,
//! as vLLM does; the template is reloaded with the tokenizer. Chat requests
//! with media parts or a template of their own, requests of other APIs, and
//! models without a template get no tokens (token readers match nothing).
//!
//! llm-d's `vllm` backend (`modelName` and `vllm: {url, timeout,
//! mmTimeout}`): the engine's `/v1/completions/render` and
//! `/v1/chat/completions/render` over HTTP, called by the edge before
//! scheduling (this plugin declares the service, [`Plugin::render_service`];
//! the binary creates the client); the ids the edge got are published as
//! they are. Completions and chat are rendered; a render that fails or times
//! out leaves the request without tokens (logged), as in llm-d.
//!
//! Either way, a prompt the client sent as token ids (a completions prompt
//! of ids, vLLM's and SGLang's generate APIs) is published as it is: those
//! are the ids the engine computes on.
//!
//! `udsTokenizerConfig` (deprecated in llm-d) and `estimate` (its ids match
//! no engine's) are refused with what to write instead.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Weak},
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use epp_core::{
    ApiKind, BuildError, Candidate, CycleContext, DataProducer, Plugin, PromptRenderer,
    RenderFuture, RenderService, RenderedPrompt,
};
use serde::de::IgnoredAny;
use tokenizers::Tokenizer;

pub use self::{
    byte_bpe::{ByteBpe, UnsupportedTokenizer},
    chat_template::{ChatTemplate, ContentFormat, RenderedChat, SpecialTokens, Unrendered},
};
use crate::{Builtin, invalid};

mod byte_bpe;
mod chat_template;

/// `local`: epp's in-process backend.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalTokenizerParams {
    /// A `tokenizer.json`, or a directory holding one.
    pub path: String,
    /// The chat template (a Jinja file); default: `chat_template.jinja`
    /// beside the tokenizer, else `tokenizer_config.json`'s.
    #[serde(default)]
    pub chat_template: Option<String>,
    /// How often the file is checked for changes. Default `2s`; `0s` never.
    #[serde(default)]
    pub reload_interval: Option<String>,
}

/// `vllm`: llm-d's render backend.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VllmRenderParams {
    /// Base URL (default `http://localhost:8000`).
    #[serde(default)]
    pub url: Option<String>,
    /// Timeout of a text-only render (default `5s`).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Timeout of a render with media (default `30s`).
    #[serde(default)]
    pub mm_timeout: Option<String>,
}

/// Parameters (llm-d's names, plus `local`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenProducerParams {
    /// The model whose tokenizer this is (informational with `local`).
    #[serde(default)]
    pub model_name: Option<String>,
    /// The in-process tokenizer.
    #[serde(default)]
    pub local: Option<LocalTokenizerParams>,
    /// llm-d's vLLM `/render` backend.
    #[serde(default)]
    pub vllm: Option<VllmRenderParams>,
    /// llm-d's deprecated UDS sidecar backend: refused.
    #[serde(default)]
    pub uds_tokenizer_config: Option<IgnoredAny>,
    /// llm-d's estimating backend: refused (its ids match no engine's).
    #[serde(default)]
    pub estimate: Option<IgnoredAny>,
    /// Longest prompt tokenized, in bytes; longer ones are cut at a
    /// character boundary (their leading blocks tokenize the same). Default
    /// 1 MiB.
    #[serde(default)]
    pub max_prompt_bytes: Option<usize>,
}

/// `token-producer`.
#[derive(Debug)]
pub struct TokenProducer {
    name: String,
    backend: Backend,
    max_bytes: usize,
}

/// Where the ids come from.
#[derive(Debug)]
enum Backend {
    /// The in-process tokenizer.
    Local(Arc<ArcSwap<Loaded>>),
    /// The engine's render endpoints, called by the edge.
    Render(RenderService),
}

/// Resolves `path` to the `tokenizer.json` it names.
fn tokenizer_file(path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_dir() {
        p.join("tokenizer.json")
    } else {
        p.to_path_buf()
    }
}

/// A loaded tokenizer file.
#[derive(Debug)]
struct Loaded {
    tokenizer: Tokenizer,
    /// epp's encoder, when the file is one it implements.
    fast: Option<ByteBpe>,
    /// The model's chat template, when it has one.
    chat: Option<ChatTemplate>,
}

/// The files a local tokenizer is loaded from.
#[derive(Debug, Clone)]
struct Files {
    tokenizer: PathBuf,
    /// `local.chatTemplate`, when set.
    template: Option<PathBuf>,
}

impl Files {
    /// Every file whose change reloads the tokenizer.
    fn watched(&self) -> Vec<PathBuf> {
        let mut files = vec![self.tokenizer.clone()];
        match &self.template {
            Some(t) => files.push(t.clone()),
            None => files.extend(ChatTemplate::files_beside(&self.tokenizer)),
        }
        files
    }
}

/// Loads `files`; an error names the parameter whose file failed.
fn load(files: &Files) -> Result<Loaded, (&'static str, String)> {
    const PATH: &str = "local.path";
    let mut loaded = load_tokenizer(&files.tokenizer).map_err(|e| (PATH, e))?;
    loaded.chat = match &files.template {
        Some(path) => {
            let source = std::fs::read_to_string(path)
                .map_err(|e| ("local.chatTemplate", format!("{}: {e}", path.display())))?;
            let special = SpecialTokens::beside(&files.tokenizer).map_err(|e| (PATH, e))?;
            Some(ChatTemplate::new(source, special).map_err(|e| ("local.chatTemplate", e))?)
        }
        // One found beside the tokenizer and not understood leaves chat
        // untokenized, as before there were templates, instead of failing.
        None => ChatTemplate::beside(&files.tokenizer).unwrap_or_else(|e| {
            tracing::warn!(
                tokenizer = %files.tokenizer.display(),
                error = %e,
                "the model's chat template cannot be used: chat requests get no tokens \
                 (name a template with local.chatTemplate to make this an error)"
            );
            None
        }),
    };
    match &loaded.chat {
        Some(t) => tracing::info!(
            tokenizer = %files.tokenizer.display(),
            content = ?t.content_format(),
            "chat template loaded: chat requests are rendered in process"
        ),
        None => tracing::info!(
            tokenizer = %files.tokenizer.display(),
            "no chat template beside the tokenizer: chat requests get no tokens"
        ),
    }
    Ok(loaded)
}

fn load_tokenizer(file: &Path) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let tokenizer: Tokenizer = text.parse().map_err(|e: tokenizers::Error| e.to_string())?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let fast = match ByteBpe::from_json(&json) {
        Ok(fast) => {
            tracing::info!(file = %file.display(), "tokenizer: epp's byte-level BPE encoder");
            Some(fast)
        }
        Err(why) => {
            tracing::info!(
                file = %file.display(),
                reason = %why,
                "tokenizer: the tokenizers crate (not a shape epp's encoder implements)"
            );
            None
        }
    };
    Ok(Loaded {
        tokenizer,
        fast,
        chat: None,
    })
}

fn modified(file: &Path) -> Option<SystemTime> {
    std::fs::metadata(file).and_then(|m| m.modified()).ok()
}

impl Builtin for TokenProducer {
    const TYPE: &'static str = "token-producer";
    type Params = TokenProducerParams;

    /// # Errors
    /// No `local` backend, an llm-d backend epp does not build, or a
    /// tokenizer file that cannot be read or parsed.
    fn build(name: impl Into<String>, p: TokenProducerParams) -> Result<Self, BuildError> {
        let name = name.into();
        let bad =
            |field: &str, value: String, reason: String| invalid(&name, field, value, &reason);
        let duration = |field: &str, v: Option<&str>, default: u64| match v {
            None | Some("") => Ok(Duration::from_secs(default)),
            Some(s) => {
                humantime::parse_duration(s).map_err(|e| bad(field, s.to_owned(), e.to_string()))
            }
        };
        if let (Some(vllm), None) = (&p.vllm, &p.local) {
            let model = p
                .model_name
                .clone()
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    bad(
                        "modelName",
                        "unset".into(),
                        "the vllm backend sends it in every render request".into(),
                    )
                })?;
            let url = vllm
                .url
                .clone()
                .unwrap_or_else(|| "http://localhost:8000".to_owned());
            let url = url.trim_end_matches('/').to_owned();
            if !url.starts_with("http://") {
                return Err(bad(
                    "vllm.url",
                    url,
                    "an http:// URL (TLS is not supported, as in llm-d)".into(),
                ));
            }
            return Ok(Self {
                backend: Backend::Render(RenderService {
                    url,
                    model,
                    timeout: duration("vllm.timeout", vllm.timeout.as_deref(), 5)?,
                    media_timeout: duration("vllm.mmTimeout", vllm.mm_timeout.as_deref(), 30)?,
                }),
                max_bytes: p.max_prompt_bytes.unwrap_or(1 << 20),
                name,
            });
        }
        let Some(local) = p.local else {
            let (field, what) = if p.uds_tokenizer_config.is_some() {
                ("udsTokenizerConfig", "the UDS tokenizer sidecar")
            } else if p.estimate.is_some() {
                ("estimate", "the estimating backend")
            } else {
                ("local", "a token producer without a tokenizer")
            };
            return Err(bad(
                field,
                "set".into(),
                format!(
                    "{what} is not built in epp; tokenize in process instead: \
                     `local: {{path: <tokenizer.json or the model's directory>}}`, or have \
                     the engine render: `modelName: <model>` and `vllm: {{url: http://<host>:<port>}}`"
                ),
            ));
        };
        let files = Files {
            tokenizer: tokenizer_file(&local.path),
            template: local.chat_template.as_deref().map(PathBuf::from),
        };
        let tokenizer = load(&files).map_err(|(field, e)| {
            let file = match (field, &files.template) {
                ("local.chatTemplate", Some(t)) => t,
                _ => &files.tokenizer,
            };
            bad(
                field,
                file.display().to_string(),
                format!("cannot load the tokenizer: {e}"),
            )
        })?;
        let interval = match local.reload_interval.as_deref() {
            None => Duration::from_secs(2),
            Some(s) => humantime::parse_duration(s)
                .map_err(|e| bad("local.reloadInterval", s.to_owned(), e.to_string()))?,
        };
        let current = Arc::new(ArcSwap::from_pointee(tokenizer));
        if !interval.is_zero() {
            watch(Arc::downgrade(&current), files, interval);
        }
        Ok(Self {
            name,
            backend: Backend::Local(current),
            max_bytes: p.max_prompt_bytes.unwrap_or(1 << 20),
        })
    }
}

/// Reloads the tokenizer (and chat template) when one of their files
/// changes, until the plugin is gone.
fn watch(slot: Weak<ArcSwap<Loaded>>, files: Files, every: Duration) {
    let watched = files.watched();
    let stamps = move || watched.iter().map(|f| modified(f)).collect::<Vec<_>>();
    let mut seen = stamps();
    let spawned = std::thread::Builder::new()
        .name("epp-tokenizer-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(slot) = slot.upgrade() else { return };
                let now = stamps();
                if now == seen {
                    continue;
                }
                seen = now;
                let file = files.tokenizer.display();
                match load(&files) {
                    Ok(t) => {
                        slot.store(Arc::new(t));
                        tracing::info!(file = %file, "tokenizer reloaded");
                    }
                    Err((_, e)) => tracing::warn!(
                        file = %file,
                        error = %e,
                        "the changed tokenizer or chat template cannot be loaded; keeping the previous one"
                    ),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the tokenizer watcher; changes will not be reloaded");
    }
}

impl TokenProducer {
    /// Token ids of `text` as the engine computes them (special tokens
    /// added), appended to `out`.
    ///
    /// # Errors
    /// When the tokenizer fails on the text.
    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let Backend::Local(current) = &self.backend else {
            return Err("this token producer has the engine render prompts".into());
        };
        encode_prompt(current, self.max_bytes, text, out)
    }

    /// Whether the loaded tokenizer is encoded by epp's [`ByteBpe`] (else
    /// by the `tokenizers` crate, or the engine renders).
    pub fn uses_byte_bpe(&self) -> bool {
        matches!(&self.backend, Backend::Local(current) if current.load().fast.is_some())
    }
}

/// Token ids of `text` by `loaded`'s tokenizer, appended to `out`.
fn encode(
    loaded: &Loaded,
    text: &str,
    add_special: bool,
    out: &mut Vec<u32>,
) -> Result<(), String> {
    if let Some(fast) = &loaded.fast {
        fast.encode(text, add_special, out);
        return Ok(());
    }
    let enc = loaded
        .tokenizer
        .encode_fast(text, add_special)
        .map_err(|e| e.to_string())?;
    out.extend_from_slice(enc.get_ids());
    Ok(())
}

/// Renders chat requests through the loaded chat template and tokenizes
/// them, at the edge before scheduling ([`TokenProducer`]'s
/// [`Plugin::prompt_renderer`]). No I/O: the answer is ready at once.
#[derive(Debug)]
struct LocalRenderer {
    current: Arc<ArcSwap<Loaded>>,
    max_bytes: usize,
}

impl PromptRenderer for LocalRenderer {
    fn render(&self, api: ApiKind, body: &[u8], media_parts: u32) -> Option<RenderFuture> {
        if api != ApiKind::ChatCompletions || media_parts > 0 {
            return None;
        }
        let loaded = self.current.load();
        let rendered = match loaded.chat.as_ref()?.render(body) {
            Ok(r) => r,
            Err(Unrendered::Unsupported(_)) => return None,
            Err(Unrendered::Failed(why)) => {
                return Some(Box::pin(std::future::ready(Err(format!(
                    "chat template: {why}"
                )))));
            }
        };
        let mut ids = Vec::new();
        let result = encode(
            &loaded,
            cut(&rendered.text, self.max_bytes),
            rendered.add_special_tokens,
            &mut ids,
        )
        .map(|()| RenderedPrompt {
            token_ids: ids,
            media: Vec::new(),
        });
        Some(Box::pin(std::future::ready(result)))
    }

    fn tokenize_prompt(&self, prompt: &str) -> Option<Vec<u32>> {
        let mut ids = Vec::new();
        encode_prompt(&self.current, self.max_bytes, prompt, &mut ids).ok()?;
        Some(ids)
    }
}

/// A prompt's token ids as the engine computes them (special tokens added,
/// the text cut to `max_bytes`), appended to `out`: one way for the cycle
/// ([`TokenProducer::tokenize`]) and the edge
/// ([`PromptRenderer::tokenize_prompt`]), so their keys agree.
fn encode_prompt(
    current: &ArcSwap<Loaded>,
    max_bytes: usize,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), String> {
    encode(&current.load(), cut(text, max_bytes), true, out)
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Plugin for TokenProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn render_service(&self) -> Option<RenderService> {
        match &self.backend {
            Backend::Render(service) => Some(service.clone()),
            Backend::Local(_) => None,
        }
    }
    fn prompt_renderer(&self) -> Option<Arc<dyn PromptRenderer>> {
        match &self.backend {
            Backend::Local(current) => Some(Arc::new(LocalRenderer {
                current: Arc::clone(current),
                max_bytes: self.max_bytes,
            })),
            Backend::Render(_) => None,
        }
    }
}

impl DataProducer for TokenProducer {
    fn produce(&self, cx: &mut CycleContext<'_>, _candidates: &[Candidate]) {
        let tokens = &mut cx.state.tokens;
        if tokens.computed {
            return;
        }
        // Ids the client sent, or the engine rendered: used as they are.
        if let Some(ids) = &cx.request.prompt_token_ids {
            tokens.ids.clear();
            tokens.ids.extend_from_slice(ids);
            tokens.computed = true;
            return;
        }
        if matches!(self.backend, Backend::Render(_)) || cx.request.api != ApiKind::Completions {
            return;
        }
        tokens.ids.clear();
        match self.tokenize(&cx.request.prompt, &mut tokens.ids) {
            Ok(()) => tokens.computed = true,
            Err(e) => {
                tokens.ids.clear();
                tracing::debug!(plugin = %self.name, error = %e, "cannot tokenize the prompt");
            }
        }
    }
    fn produces_tokens(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_character_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("abc", 10), "abc");
    }

    #[test]
    fn the_vllm_backend_declares_its_render_service_and_publishes_rendered_ids() {
        let params = |text: &str| -> TokenProducerParams { serde_yaml_ng::from_str(text).unwrap() };
        let t = TokenProducer::build(
            "t",
            params("{modelName: m, vllm: {url: 'http://10.0.0.9:8000/', mmTimeout: 1m}}"),
        )
        .unwrap();
        let service = t.render_service().unwrap();
        assert_eq!(service.url, "http://10.0.0.9:8000");
        assert_eq!(service.model, "m");
        assert_eq!(service.timeout, Duration::from_secs(5));
        assert_eq!(service.media_timeout, Duration::from_secs(60));
        // What the edge rendered is published as it is, for any API.
        let mut req = epp_core::InferenceRequest::builder("m")
            .api(ApiKind::ChatCompletions)
            .build();
        let cands = crate::testing::candidates(vec![epp_core::EndpointMetrics::default()]);
        let ids = crate::testing::with_cx(&req, 1, |cx| {
            t.produce(cx, &cands);
            cx.state.tokens.computed
        });
        assert!(!ids, "nothing rendered: no tokens");
        req.prompt_token_ids = Some(vec![7, 8, 9]);
        let ids = crate::testing::with_cx(&req, 1, |cx| {
            t.produce(cx, &cands);
            cx.state.tokens.ids.clone()
        });
        assert_eq!(ids, vec![7, 8, 9]);
        for (text, field) in [
            ("{vllm: {url: 'http://h:1'}}", "modelName"),
            ("{modelName: m, vllm: {url: 'https://h:1'}}", "vllm.url"),
            ("{modelName: m, vllm: {timeout: soon}}", "vllm.timeout"),
        ] {
            let e = TokenProducer::build("t", params(text))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    #[test]
    fn other_llm_d_backends_are_refused_with_what_to_write() {
        let e = TokenProducer::build(
            "t",
            serde_yaml_ng::from_str("{udsTokenizerConfig: {socketFile: /tmp/s}}").unwrap(),
        )
        .expect_err("refused")
        .to_string();
        assert!(
            e.contains("udsTokenizerConfig") && e.contains("local: {path:"),
            "{e}"
        );
        let e = TokenProducer::build("t", TokenProducerParams::default())
            .expect_err("refused")
            .to_string();
        assert!(e.contains("local"), "{e}");
    }

    #[test]
    fn ids_the_client_sent_are_published_as_they_are() {
        let dir = epp_test_support::process::scratch_dir("tokenizer-ids");
        epp_test_support::tokenizer::write_test_tokenizer(&dir).expect("written");
        let p: TokenProducerParams =
            serde_yaml_ng::from_str(&format!("{{local: {{path: {}}}}}", dir.display()))
                .expect("parses");
        let t = TokenProducer::build("t", p).expect("loads");
        let mut req = epp_core::InferenceRequest::builder("m")
            .api(ApiKind::VllmGenerate)
            .prompt("digits that must not be tokenized")
            .build();
        req.prompt_token_ids = Some(vec![11, 22, 33]);
        let cands = crate::testing::candidates(vec![epp_core::EndpointMetrics::default()]);
        let ids = crate::testing::with_cx(&req, 1, |cx| {
            t.produce(cx, &cands);
            cx.state.tokens.ids.clone()
        });
        assert_eq!(ids, vec![11, 22, 33]);
    }

    /// The ready answer of an in-process render.
    fn rendered(
        r: &dyn PromptRenderer,
        api: ApiKind,
        body: &str,
    ) -> Option<Result<Vec<u32>, String>> {
        let mut fut = r.render(api, body.as_bytes(), 0)?;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => Some(r.map(|p| p.token_ids)),
            std::task::Poll::Pending => panic!("an in-process render is ready at once"),
        }
    }

    #[test]
    fn chat_requests_are_rendered_through_the_models_template_and_tokenized() {
        let dir = epp_test_support::process::scratch_dir("tokenizer-chat");
        let file = epp_test_support::tokenizer::write_test_tokenizer(&dir).expect("written");
        let template = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
            {% if add_generation_prompt %}<assistant>{% endif %}";
        let config = serde_json::json!({"bos_token": "<|bos|>", "chat_template": template});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("written");
        let p: TokenProducerParams =
            serde_yaml_ng::from_str(&format!("{{local: {{path: {}}}}}", dir.display()))
                .expect("parses");
        let t = TokenProducer::build("t", p).expect("loads");
        let r = t.prompt_renderer().expect("a local tokenizer renders chat");
        let body = r#"{"model": "m", "messages": [{"role": "user", "content": "the theory"}]}"#;
        let ids = rendered(r.as_ref(), ApiKind::ChatCompletions, body)
            .expect("rendered")
            .expect("ok");
        // The crate's ids for the text the template gives, without special
        // tokens added (the template put the BOS in), as vLLM tokenizes chat.
        let crate_ids = Tokenizer::from_file(&file)
            .expect("loads")
            .encode("<|bos|><user>the theory<assistant>", false)
            .expect("encodes")
            .get_ids()
            .to_vec();
        assert_eq!(ids, crate_ids);
        assert_eq!(ids.iter().filter(|&&i| i == ids[0]).count(), 1, "one BOS");
        // Not rendered here: other APIs, media, a template of the request's own.
        assert!(rendered(r.as_ref(), ApiKind::Completions, body).is_none());
        assert!(
            r.render(ApiKind::ChatCompletions, body.as_bytes(), 1)
                .is_none()
        );
        let own = r#"{"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}"#;
        assert!(rendered(r.as_ref(), ApiKind::ChatCompletions, own).is_none());
        // A failing render is an error the edge logs.
        let bad = r#"{"messages": 3}"#;
        assert!(
            rendered(r.as_ref(), ApiKind::ChatCompletions, bad)
                .expect("answered")
                .is_err()
        );
        // A model without a template renders nothing.
        std::fs::remove_file(dir.join("tokenizer_config.json")).expect("removed");
        let p: TokenProducerParams =
            serde_yaml_ng::from_str(&format!("{{local: {{path: {}}}}}", dir.display()))
                .expect("parses");
        let t = TokenProducer::build("t", p).expect("loads");
        let r = t.prompt_renderer().expect("renderer");
        assert!(rendered(r.as_ref(), ApiKind::ChatCompletions, body).is_none());
        // A template beside the tokenizer that does not parse leaves chat
        // untokenized (a warning) rather than failing the load...
        std::fs::write(dir.join("chat_template.jinja"), "{% for %}").expect("written");
        let p: TokenProducerParams =
            serde_yaml_ng::from_str(&format!("{{local: {{path: {}}}}}", dir.display()))
                .expect("parses");
        let t = TokenProducer::build("t", p).expect("loads without the template");
        let r = t.prompt_renderer().expect("renderer");
        assert!(rendered(r.as_ref(), ApiKind::ChatCompletions, body).is_none());
        // ...while an explicit template file that does not parse is refused
        // at load, naming its parameter.
        let bad = dir.join("bad.jinja");
        std::fs::write(&bad, "{% for %}").expect("written");
        let p: TokenProducerParams = serde_yaml_ng::from_str(&format!(
            "{{local: {{path: {}, chatTemplate: {}}}}}",
            dir.display(),
            bad.display()
        ))
        .expect("parses");
        let e = TokenProducer::build("t", p)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("local.chatTemplate"), "{e}");
    }

    #[test]
    fn a_changed_tokenizer_file_is_reloaded_and_a_bad_one_ignored() {
        let dir = epp_test_support::process::scratch_dir("tokenizer-reload");
        let file = epp_test_support::tokenizer::write_test_tokenizer(&dir).expect("written");
        let p: TokenProducerParams = serde_yaml_ng::from_str(&format!(
            "{{local: {{path: {}, reloadInterval: 20ms}}}}",
            dir.display()
        ))
        .expect("parses");
        let t = TokenProducer::build("t", p).expect("loads the directory's tokenizer.json");
        let ids = |t: &TokenProducer| {
            let mut v = Vec::new();
            t.tokenize("the theory of relativity", &mut v)
                .expect("tokenizes");
            v
        };
        let before = ids(&t);
        // The same tokenizer without its merges: one id per byte.
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
        json["model"]["merges"] = serde_json::json!([]);
        std::thread::sleep(Duration::from_millis(30));
        std::fs::write(&file, json.to_string()).expect("written");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ids(&t) == before {
            assert!(std::time::Instant::now() < deadline, "never reloaded");
            std::thread::sleep(Duration::from_millis(20));
        }
        let after = ids(&t);
        assert!(after.len() > before.len(), "{before:?} -> {after:?}");
        assert!(
            t.uses_byte_bpe(),
            "the reloaded file is still one epp encodes"
        );
        // A broken file keeps the last good tokenizer.
        std::fs::write(&file, "{not json").expect("written");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(ids(&t), after);
        // A file epp's encoder does not implement (a normalizer) is encoded
        // by the crate, with the same ids here (NFC leaves ASCII alone).
        json["normalizer"] = serde_json::json!({"type": "NFC"});
        std::fs::write(&file, json.to_string()).expect("written");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while t.uses_byte_bpe() {
            assert!(std::time::Instant::now() < deadline, "never reloaded");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(ids(&t), after);
    }

    #[test]
    fn a_missing_tokenizer_file_names_the_path() {
        let p: TokenProducerParams =
            serde_yaml_ng::from_str("{local: {path: /nonexistent/tok}}").expect("parses");
        let e = TokenProducer::build("t", p)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("/nonexistent/tok") && e.contains("cannot load"),
            "{e}"
        );
    }
}
