//! The HTTP side: read the body, schedule, forward to the picked endpoint,
//! stream the answer back while the [`Dispatch`] counts the request.

use std::{
    convert::Infallible,
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use epp_core::{ApiKind, Dispatch, EndpointSource, InferenceRequest, RequestOutcome, Scheduler};
use epp_extproc::{ExtProcError, UsageReader, parse_body};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The header telling the client which endpoint served it.
pub const SERVED_BY_HEADER: &str = "x-gateway-destination-endpoint";

/// The body of every answer.
type AnswerBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// Headers that belong to one hop and are not forwarded.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "host",
];

/// Routes each request to the endpoint the scheduler picks.
pub struct Proxy {
    scheduler: Arc<Scheduler>,
    endpoints: Arc<dyn EndpointSource>,
    client: Client<HttpConnector, Full<Bytes>>,
    max_body_bytes: usize,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("endpoints", &self.endpoints)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy scheduling with `scheduler` over `endpoints`.
    #[must_use]
    pub fn new(
        scheduler: Arc<Scheduler>,
        endpoints: Arc<dyn EndpointSource>,
        max_body_bytes: usize,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            scheduler,
            endpoints,
            client: Client::builder(TokioExecutor::new()).build(connector),
            max_body_bytes,
        }
    }

    /// Serves HTTP/1.1 on `listener` until `stop` is cancelled.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        loop {
            let (stream, _) = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let proxy = Arc::clone(&self);
            let stop = stop.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let proxy = Arc::clone(&proxy);
                    async move { Ok::<_, Infallible>(proxy.handle(req).await) }
                });
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    () = stop.cancelled() => conn.as_mut().graceful_shutdown(),
                }
            });
        }
    }

    /// Answers one request: a local error, or the endpoint's response.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<AnswerBody> {
        let (parts, body) = req.into_parts();
        let bytes = match Limited::new(body, self.max_body_bytes).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                return refusal(&ExtProcError::BodyTooLarge {
                    size: self.max_body_bytes + 1,
                    limit: self.max_body_bytes,
                });
            }
        };
        let headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let request = match understand(parts.uri.path(), headers, &bytes) {
            Ok(r) => r,
            Err(e) => return refusal(&e),
        };

        let snapshot = self.endpoints.snapshot();
        let dispatch = match self
            .scheduler
            .schedule(&request, &snapshot)
            .and_then(|result| result.dispatch(Arc::clone(&self.scheduler), request))
        {
            Ok(d) => d,
            Err(e) => return refusal(&e.into()),
        };
        let addr = dispatch.endpoint().addr_str().to_owned();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut upstream = Request::builder()
            .method(parts.method)
            .uri(format!("http://{addr}{path}"));
        for (name, value) in &parts.headers {
            if !HOP_BY_HOP.contains(&name.as_str()) {
                upstream = upstream.header(name, value);
            }
        }
        let upstream = match upstream.body(Full::new(bytes)) {
            Ok(r) => r,
            Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
        };
        // The request goes out first; the work the decision left for after
        // it (the prefix index's record) runs while the model server works.
        let (sent, ()) = tokio::join!(self.client.request(upstream), async {
            tokio::task::yield_now().await;
            self.scheduler.run_deferred();
        });
        match sent {
            Ok(response) => {
                let (mut head, body) = response.into_parts();
                let sse = head
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("text/event-stream"));
                if let Ok(v) = HeaderValue::from_str(&addr) {
                    head.headers.insert(SERVED_BY_HEADER, v);
                }
                let tracked = Tracked {
                    usage: UsageReader::new(sse || dispatch.request().stream, 1 << 20),
                    status: head.status.as_u16(),
                    sse,
                    dispatch: Some(dispatch),
                    inner: body,
                };
                Response::from_parts(head, tracked.boxed_unsync())
            }
            // The dispatch is dropped here: the request no longer loads the endpoint.
            Err(e) => plain(
                StatusCode::BAD_GATEWAY,
                &format!("model server {addr} failed: {e}"),
            ),
        }
    }
}

/// The scheduler's view of a request: model and prompt from the body (none
/// for a body-less request such as `GET /v1/models`).
fn understand(
    path: &str,
    headers: Vec<(String, String)>,
    body: &[u8],
) -> Result<InferenceRequest, ExtProcError> {
    let api = ApiKind::from_path(path);
    let parsed = if body.is_empty() {
        Default::default()
    } else {
        parse_body(api, body)?
    };
    let request_id = headers
        .iter()
        .find(|(k, _)| k == "x-request-id")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    Ok(InferenceRequest {
        request_id,
        target_model: parsed.model.clone(),
        model: parsed.model,
        api,
        headers,
        prompt: parsed.prompt,
        cache_salt: parsed.cache_salt,
        stream: parsed.stream,
        max_tokens: parsed.max_tokens,
        body_len: body.len(),
        media_parts: parsed.media_parts,
        prompt_token_ids: parsed.token_ids,
        ..InferenceRequest::default()
    })
}

/// A local answer with the picker's JSON error body.
fn refusal(err: &ExtProcError) -> Response<AnswerBody> {
    let mut r = Response::new(full(err.json_body().into()));
    *r.status_mut() = StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn plain(status: StatusCode, text: &str) -> Response<AnswerBody> {
    let mut r = Response::new(full(Bytes::from(text.to_owned())));
    *r.status_mut() = status;
    r
}

fn full(bytes: Bytes) -> AnswerBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The endpoint's response body, passed through while the dispatch lives:
/// its end completes the dispatch (with the usage read on the way), an error
/// or the client going away drops it (aborted).
struct Tracked {
    inner: Incoming,
    dispatch: Option<Dispatch>,
    status: u16,
    /// Server-sent events: the first body bytes carry the first token.
    sse: bool,
    usage: UsageReader,
}

impl Tracked {
    fn finish(&mut self) {
        if let Some(dispatch) = self.dispatch.take() {
            let usage = self.usage.finish();
            dispatch.complete(
                usage.as_ref(),
                RequestOutcome::Completed {
                    status: self.status,
                },
            );
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !data.is_empty()
                        && let Some(dispatch) = this.dispatch.as_mut()
                    {
                        dispatch.first_body_bytes(this.sse);
                    }
                    this.usage.feed(data);
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.dispatch = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
