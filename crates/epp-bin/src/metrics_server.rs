//! The metrics port: `GET /metrics` (Prometheus text), with
//! `--enable-pprof` `GET /debug/pprof/profile`, and unless
//! `--decision-log-size 0` the decision view (`GET /debug/decisions` and its
//! JSON, `decision_view.rs`), each behind the same authentication
//! (`metrics_auth.rs`), in plaintext or TLS (`tls.rs`).

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use epp_core::EndpointSource;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    service::service_fn,
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::{
    decision_view::{self, DecisionView},
    metrics::PoolGauges,
    metrics_auth::{MetricsAuth, Verdict},
    profiling::{self, ProfileError, Profiler},
};

/// The path of CPU profiles, as Go's `net/http/pprof` serves them.
pub(crate) const PROFILE_PATH: &str = "/debug/pprof/profile";

/// Everything the metrics port serves.
pub(crate) struct MetricsServer {
    pub(crate) registry: Arc<Registry>,
    pub(crate) pool: Arc<PoolGauges>,
    pub(crate) source: Arc<dyn EndpointSource>,
    pub(crate) auth: MetricsAuth,
    /// With `--enable-pprof`.
    pub(crate) profiler: Option<Profiler>,
    /// With `--metrics-cert-dir`.
    pub(crate) tls: Option<TlsAcceptor>,
    /// Unless `--decision-log-size 0`.
    pub(crate) decisions: Option<DecisionView>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("auth", &self.auth)
            .field("profiler", &self.profiler.is_some())
            .field("tls", &self.tls.is_some())
            .field("decisions", &self.decisions.is_some())
            .finish_non_exhaustive()
    }
}

type Reply = Response<Full<Bytes>>;

fn plain(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Serves connections until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    server: Arc<MetricsServer>,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            match &server.tls {
                None => connection(stream, server).await,
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(Duration::from_secs(10), handshake).await {
                        Ok(Ok(tls)) => connection(tls, server).await,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "metrics: TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "metrics: TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn connection<S>(io: S, server: Arc<MetricsServer>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<Incoming>| {
        let server = Arc::clone(&server);
        async move { Ok::<_, Infallible>(handle(&server, &req).await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

async fn handle(server: &MetricsServer, req: &Request<Incoming>) -> Reply {
    let path = req.uri().path();
    let is_profile = path == PROFILE_PATH && server.profiler.is_some();
    let is_view = (path == decision_view::PAGE_PATH || path == decision_view::JSON_PATH)
        && server.decisions.is_some();
    if path != "/metrics" && !is_profile && !is_view {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match server.auth.check(authorization, "get", path).await {
        Verdict::Allowed => {}
        Verdict::Unauthenticated => {
            let mut r = plain(StatusCode::UNAUTHORIZED, "unauthorized\n");
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
        Verdict::Forbidden(user) => {
            tracing::debug!(%user, %path, "metrics: access denied");
            return plain(
                StatusCode::FORBIDDEN,
                format!("forbidden: user {user:?} may not get {path}\n"),
            );
        }
        Verdict::Unavailable => {
            let mut r = plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot authenticate: the Kubernetes API server does not answer reviews\n",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return r;
        }
    }
    match (&server.profiler, &server.decisions) {
        (Some(profiler), _) if is_profile => profile(profiler, req.uri().query()).await,
        (_, Some(view)) if path == decision_view::PAGE_PATH => page(),
        (_, Some(view)) if path == decision_view::JSON_PATH => {
            let json = view.json(&*server.source);
            with_type(Bytes::from(json), "application/json")
        }
        _ => metrics(server),
    }
}

/// A 200 of `content_type`, never cached (the view changes every second).
fn with_type(body: Bytes, content_type: &'static str) -> Reply {
    let mut r = Response::new(Full::new(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn page() -> Reply {
    let mut r = with_type(
        Bytes::from_static(decision_view::PAGE.as_bytes()),
        "text/html; charset=utf-8",
    );
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(decision_view::PAGE_CSP),
    );
    r
}

fn metrics(server: &MetricsServer) -> Reply {
    server.pool.refresh(&*server.source);
    let mut text = String::with_capacity(16 * 1024);
    if encode(&mut text, &server.registry).is_err() {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

async fn profile(profiler: &Profiler, query: Option<&str>) -> Reply {
    let taken = match profiling::seconds(query) {
        Ok(duration) => profiler.profile(duration).await,
        Err(e) => Err(e),
    };
    match taken {
        Ok(bytes) => {
            let mut r = Response::new(Full::new(Bytes::from(bytes)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r.headers_mut().insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            r
        }
        Err(e) => {
            let status = match e {
                ProfileError::BadSeconds(_) => StatusCode::BAD_REQUEST,
                ProfileError::Busy => StatusCode::CONFLICT,
                ProfileError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
                ProfileError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            if let ProfileError::Failed(why) = &e {
                tracing::error!(error = %why, "CPU profile failed");
            }
            plain(status, format!("{e}\n"))
        }
    }
}
