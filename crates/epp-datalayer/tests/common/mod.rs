//! Shared test helpers: a deliberately misbehaving metrics server, wiring,
//! and waiting without asserting wall-clock times.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use epp_core::{PluginRef, config::SourceWiring};
use epp_datalayer::{CoreMetricsExtractor, CoreMetricsParams, MetricsDataSource};
use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpListener,
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
    },
};

/// How the server answers the next requests.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    /// 200 with this page.
    Page(String),
    /// Reads the request and never answers.
    Hang,
    /// 500 with a short body.
    Status500,
    /// 200 with HTML.
    Garbage,
    /// 200, no Content-Length, streams this many bytes (closes afterwards).
    Huge(usize),
    /// 200 with Content-Length announcing this many bytes (sends a few).
    HugeAnnounced(usize),
    /// 200 with the page, one byte every `Duration`.
    Drip(String, Duration),
}

/// A metrics server whose behaviour tests switch at will.
#[derive(Debug, Clone)]
pub(crate) struct BadServer {
    pub(crate) addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl BadServer {
    pub(crate) async fn start(mode: Mode) -> Self {
        Self::start_inner(mode, None).await
    }

    /// The same over HTTPS with a self-signed certificate.
    pub(crate) async fn start_tls(mode: Mode) -> Self {
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            generated.signing_key.serialize_der(),
        ));
        let config = ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![generated.cert.der().clone()], key)
        .unwrap();
        Self::start_inner(mode, Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    /// The same over HTTPS with the given TLS settings (e.g. requiring a
    /// client certificate).
    pub(crate) async fn start_with_tls(mode: Mode, config: ServerConfig) -> Self {
        Self::start_inner(mode, Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_inner(mode: Mode, tls: Option<TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Self {
            addr,
            mode: Arc::new(Mutex::new(mode)),
            requests: Arc::default(),
            connections: Arc::default(),
        };
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                s.connections.fetch_add(1, Ordering::Relaxed);
                let s = s.clone();
                match tls.clone() {
                    None => {
                        tokio::spawn(s.serve(stream));
                    }
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                s.serve(stream).await;
                            }
                        });
                    }
                }
            }
        });
        server
    }

    pub(crate) fn set(&self, mode: Mode) {
        *self.mode.lock() = mode;
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(self, mut stream: S) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            // Read one request head.
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            buf.drain(..end);
            self.requests.fetch_add(1, Ordering::Relaxed);
            let mode = self.mode.lock().clone();
            let ok = match mode {
                Mode::Page(page) => respond(&mut stream, "200 OK", &page).await,
                Mode::Status500 => respond(&mut stream, "500 Internal Server Error", "boom").await,
                Mode::Garbage => {
                    respond(
                        &mut stream,
                        "200 OK",
                        "<html><body>502 Bad Gateway</body></html>",
                    )
                    .await
                }
                Mode::Hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    false
                }
                Mode::Huge(n) => {
                    let head =
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let line = "vllm:num_requests_waiting{engine=\"0\"} 1\n".repeat(1600);
                    let mut sent = 0;
                    while sent < n {
                        if stream.write_all(line.as_bytes()).await.is_err() {
                            return;
                        }
                        sent += line.len();
                    }
                    false
                }
                Mode::HugeAnnounced(n) => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {n}\r\n\r\nvllm:num_requests_waiting 1\n"
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    false
                }
                Mode::Drip(page, every) => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
                        page.len()
                    );
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    for b in page.bytes() {
                        tokio::time::sleep(every).await;
                        if stream.write_all(&[b]).await.is_err() {
                            return;
                        }
                    }
                    true
                }
            };
            if !ok {
                return;
            }
        }
    }
}

async fn respond<S: AsyncWrite + Unpin>(stream: &mut S, status: &str, body: &str) -> bool {
    let msg = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(msg.as_bytes()).await.is_ok()
}

/// A vLLM page with these gauges.
pub(crate) fn vllm_page(waiting: u32, running: u32, kv: f64) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} {waiting}.0\n\
         # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} {running}.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
    )
}

/// `metrics-data-source` (with these parameters) feeding the core extractor.
pub(crate) fn wiring(params_yaml: &str) -> SourceWiring {
    let params = serde_yaml_ng::from_str(params_yaml).unwrap();
    let source = MetricsDataSource::new("metrics-data-source", params).unwrap();
    let core =
        CoreMetricsExtractor::new("core-metrics-extractor", &CoreMetricsParams::default()).unwrap();
    SourceWiring {
        source: PluginRef::new(Arc::new(source)),
        extractors: vec![PluginRef::new(Arc::new(core))],
    }
}

/// Log lines written while the guard lives (this thread only).
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Logs>> = const { std::cell::RefCell::new(None) };
}

/// Writes to the capture of the current thread, if any.
struct ThreadWriter;

impl std::io::Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(logs) = c.borrow_mut().as_mut() {
                logs.write_all(buf)?;
            }
            Ok(buf.len())
        })
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Ends a thread's capture when dropped.
pub(crate) struct CaptureGuard(());

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURE.with(|c| c.borrow_mut().take());
    }
}

impl Logs {
    /// Captures this thread's log lines until the guard drops. One global
    /// subscriber serves every test: per-test scoped subscribers
    /// (`set_default`) on concurrent test threads can leave a callsite's cached
    /// interest at "never", silently dropping a test's events.
    pub(crate) fn capture() -> (Self, CaptureGuard) {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(|| ThreadWriter)
                .with_ansi(false)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
        });
        let logs = Self::default();
        CAPTURE.with(|c| *c.borrow_mut() = Some(logs.clone()));
        (logs, CaptureGuard(()))
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }
}
