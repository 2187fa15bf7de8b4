//! The engine's render endpoints as a [`PromptRenderer`] (llm-d's
//! `token-producer` `vllm` backend): the request's body, with `model` set to
//! the service's base model, is posted to `{url}/v1/completions/render`
//! (answer: `[{"token_ids": [...]}, ...]`, one per prompt, concatenated) or
//! `{url}/v1/chat/completions/render` (answer: `{"token_ids": [...]}`), over
//! plain HTTP/1.1 with a small pool of kept-alive connections. A render
//! slower than its timeout (the media timeout when the request has media)
//! fails; the caller schedules without tokens.

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use epp_core::{
    ApiKind, MediaItem, Placeholder, PromptRenderer, RenderFuture, RenderService, RenderedPrompt,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;

/// Largest render answer read (token ids of a very long prompt).
const MAX_ANSWER: usize = 64 << 20;
/// Idle connections kept.
const POOL: usize = 16;

/// Renders prompts through a vLLM render service.
pub struct VllmRenderer {
    service: RenderService,
    authority: String,
    idle: Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl fmt::Debug for VllmRenderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VllmRenderer")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl VllmRenderer {
    /// A renderer for `service` (an `http://host:port` URL).
    ///
    /// # Errors
    /// The URL is not `http://host[:port]`.
    pub fn new(service: RenderService) -> Result<Self, String> {
        let rest = service
            .url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{}: only http:// is supported", service.url))?;
        let authority = rest.split('/').next().unwrap_or_default().to_owned();
        if authority.is_empty() {
            return Err(format!("{}: no host", service.url));
        }
        let authority = if authority.contains(':') {
            authority
        } else {
            format!("{authority}:80")
        };
        Ok(Self {
            service,
            authority,
            idle: Arc::new(Mutex::new(Vec::new())),
        })
    }
}

/// The prompt in a render answer: its token ids, and its media items from
/// `features.mm_hashes` (`{modality: [hash, …]}`) with their places from
/// `features.mm_placeholders` (`{modality: [{offset, length}, …]}`, in the
/// same order; `features` is null or absent for a text-only prompt). A
/// modality whose places do not pair one to one with its hashes has none.
/// The prompts of a completions answer are concatenated, places shifted.
fn rendered_of(api: ApiKind, answer: &[u8]) -> Result<RenderedPrompt, String> {
    #[derive(serde::Deserialize)]
    struct Rendered {
        token_ids: Vec<u32>,
        #[serde(default)]
        features: Option<Features>,
    }
    #[derive(serde::Deserialize)]
    struct Features {
        #[serde(default)]
        mm_hashes: Option<BTreeMap<String, Vec<String>>>,
        #[serde(default)]
        mm_placeholders: Option<BTreeMap<String, Vec<Range>>>,
    }
    #[derive(serde::Deserialize)]
    struct Range {
        offset: u32,
        length: u32,
    }
    fn add(into: &mut RenderedPrompt, r: Rendered) {
        let shift = u32::try_from(into.token_ids.len()).unwrap_or(u32::MAX);
        into.token_ids.extend(r.token_ids);
        let (hashes, mut places) = r
            .features
            .map(|f| (f.mm_hashes, f.mm_placeholders))
            .unwrap_or_default();
        for (modality, hashes) in hashes.unwrap_or_default() {
            let places = places
                .as_mut()
                .and_then(|p| p.remove(&modality))
                .filter(|p| p.len() == hashes.len());
            let mut places = places.into_iter().flatten();
            into.media.extend(hashes.into_iter().map(|hash| MediaItem {
                modality: modality.clone(),
                hash,
                placeholder: places.next().map(|p| Placeholder {
                    offset: p.offset.saturating_add(shift),
                    length: p.length,
                }),
            }));
        }
    }
    let bad = |e: serde_json::Error| format!("unexpected render answer: {e}");
    let mut rendered = RenderedPrompt::default();
    if api == ApiKind::ChatCompletions {
        add(
            &mut rendered,
            serde_json::from_slice::<Rendered>(answer).map_err(bad)?,
        );
        return Ok(rendered);
    }
    let all: Vec<Rendered> = serde_json::from_slice(answer).map_err(bad)?;
    if all.is_empty() {
        return Err("the render answer holds no prompt".into());
    }
    for r in all {
        add(&mut rendered, r);
    }
    Ok(rendered)
}

async fn post(
    authority: String,
    idle: Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
    path: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let pooled = {
        let mut idle = idle.lock();
        std::iter::from_fn(|| idle.pop()).find(|s| !s.is_closed())
    };
    let mut sender = match pooled {
        Some(s) => s,
        None => {
            let tcp = TcpStream::connect(&authority)
                .await
                .map_err(|e| format!("connect {authority}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let (sender, conn) = http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| format!("{authority}: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            sender
        }
    };
    sender
        .ready()
        .await
        .map_err(|e| format!("{authority}: {e}"))?;
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, authority.as_str())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("{authority}{path}: {e}"))?;
    let status = response.status();
    let answer = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("{authority}{path}: {e}"))?
        .to_bytes();
    if !status.is_success() {
        let snippet = String::from_utf8_lossy(&answer[..answer.len().min(256)]).into_owned();
        return Err(format!("{authority}{path} answered {status}: {snippet}"));
    }
    {
        let mut idle = idle.lock();
        if idle.len() < POOL {
            idle.push(sender);
        }
    }
    Ok(answer.to_vec())
}

impl PromptRenderer for VllmRenderer {
    fn render(&self, api: ApiKind, body: &[u8], media_parts: u32) -> Option<RenderFuture> {
        let path = match api {
            ApiKind::Completions => "/v1/completions/render",
            ApiKind::ChatCompletions => "/v1/chat/completions/render",
            _ => return None,
        };
        // `vllm launch render` serves the base model's name only.
        let request = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
            .map(|mut m| {
                m.insert(
                    "model".into(),
                    serde_json::Value::String(self.service.model.clone()),
                );
                serde_json::to_vec(&m).unwrap_or_default()
            });
        let timeout: Duration = if media_parts > 0 {
            self.service.media_timeout
        } else {
            self.service.timeout
        };
        let (authority, idle) = (self.authority.clone(), Arc::clone(&self.idle));
        Some(Box::pin(async move {
            let request = request.map_err(|e| format!("the body is not a JSON object: {e}"))?;
            let answer = tokio::time::timeout(timeout, post(authority, idle, path, request))
                .await
                .map_err(|_| format!("no render answer within {timeout:?}"))??;
            rendered_of(api, &answer)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_urls() {
        let ids = |api, answer: &[u8]| rendered_of(api, answer).map(|r| r.token_ids);
        assert_eq!(
            ids(
                ApiKind::Completions,
                br#"[{"token_ids":[1,2]},{"token_ids":[3]}]"#
            )
            .unwrap(),
            vec![1, 2, 3]
        );
        assert_eq!(
            ids(
                ApiKind::ChatCompletions,
                br#"{"token_ids":[4],"features":null}"#
            )
            .unwrap(),
            vec![4]
        );
        assert!(ids(ApiKind::Completions, b"[]").is_err());
        assert!(ids(ApiKind::Completions, br#"{"error":"x"}"#).is_err());
        // vLLM's features: the media items' content hashes by modality, with
        // their places where they pair one to one (not for audio here).
        let with_media = rendered_of(
            ApiKind::ChatCompletions,
            br#"{"token_ids":[5],"features":{"mm_hashes":{"image":["a1","b2"],"audio":["c3"]},
                 "mm_placeholders":{"image":[{"offset":0,"length":1},{"offset":4,"length":9,"is_embed":null}],
                 "audio":[]}}}"#,
        )
        .unwrap();
        let item = |m: &str, h: &str, at: Option<(u32, u32)>| MediaItem {
            modality: m.into(),
            hash: h.into(),
            placeholder: at.map(|(offset, length)| Placeholder { offset, length }),
        };
        assert_eq!(
            with_media.media,
            vec![
                item("audio", "c3", None),
                item("image", "a1", Some((0, 1))),
                item("image", "b2", Some((4, 9)))
            ]
        );
        // Several prompts: the second one's places count from its start.
        let two = rendered_of(
            ApiKind::Completions,
            br#"[{"token_ids":[1,2,3]},{"token_ids":[4,5],
                 "features":{"mm_hashes":{"image":["d4"]},"mm_placeholders":{"image":[{"offset":1,"length":1}]}}}]"#,
        )
        .unwrap();
        assert_eq!(two.media, vec![item("image", "d4", Some((4, 1)))]);
        let service = |url: &str| RenderService {
            url: url.into(),
            model: "m".into(),
            timeout: Duration::from_secs(1),
            media_timeout: Duration::from_secs(1),
        };
        assert_eq!(
            VllmRenderer::new(service("http://h")).unwrap().authority,
            "h:80"
        );
        assert!(VllmRenderer::new(service("https://h:1")).is_err());
        let r = VllmRenderer::new(service("http://h:1")).unwrap();
        assert!(r.render(ApiKind::Embeddings, b"{}", 0).is_none());
    }
}
