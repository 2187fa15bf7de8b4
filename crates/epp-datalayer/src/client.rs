//! The HTTP side of one scraper: a persistent HTTP/1.1 connection (plain or
//! TLS) to one model server, reused scrape after scrape, and a bounded read
//! of the page into a reused buffer.
//!
//! One connection per (endpoint, source) owned by that endpoint's task: no
//! pool, no lock, no lookup per scrape. Any failure drops the connection (its
//! task is aborted, so a half-read 50 MB page or a slow drip is not drained)
//! and the next scrape reconnects.

use std::{fmt, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use epp_core::TlsFiles;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, task::AbortHandle};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
        client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        crypto::{CryptoProvider, ring},
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    },
};

/// Why one fetch failed (timeouts are decided by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchError {
    /// Connecting or the TLS handshake failed.
    Connect(String),
    /// The request failed or the server answered with an error status.
    Http(String),
    /// The page is larger than the cap.
    TooLarge,
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect(e) | Self::Http(e) => f.write_str(e),
            Self::TooLarge => f.write_str("page larger than the size cap"),
        }
    }
}

/// TLS settings shared by every scraper of a data layer.
#[derive(Clone)]
pub(crate) struct Tls {
    verified: Option<TlsConnector>,
    unverified: TlsConnector,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("system_roots", &self.verified.is_some())
            .finish()
    }
}

impl Tls {
    /// Client configs with the system's CA roots (when found) and one that
    /// accepts any certificate (`insecureSkipVerify`).
    pub(crate) fn new() -> Self {
        let provider = Arc::new(ring::default_provider());
        let builder = || {
            ClientConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
        };
        let roots = system_roots();
        let verified = (!roots.is_empty())
            .then(|| builder().ok())
            .flatten()
            .map(|b| {
                TlsConnector::from(Arc::new(
                    b.with_root_certificates(roots).with_no_client_auth(),
                ))
            });
        let unverified = match builder() {
            Ok(b) => b
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(Arc::clone(&provider))))
                .with_no_client_auth(),
            // The ring provider supports the default versions; unreachable in practice.
            Err(_) => ClientConfig::builder()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(Arc::clone(&provider))))
                .with_no_client_auth(),
        };
        Self {
            verified,
            unverified: TlsConnector::from(Arc::new(unverified)),
        }
    }
}

impl Tls {
    /// The connectors of a source with its own PEM files (llm-d's
    /// `caCertPath`, `clientCertPath`, `clientKeyPath`): the CA bundle, when
    /// given, replaces the system roots; the client certificate, when given,
    /// is presented on both connectors.
    ///
    /// # Errors
    /// A file that cannot be read or holds no certificate (or key), or only
    /// one of the client certificate and key.
    pub(crate) fn with_files(files: TlsFiles<'_>) -> Result<Self, String> {
        let provider = Arc::new(ring::default_provider());
        let client = match (files.client_cert, files.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| format!("clientCertPath {cert:?}: {e}"))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("clientCertPath {cert:?}: {e}"))?;
                if chain.is_empty() {
                    return Err(format!("clientCertPath {cert:?}: no certificate"));
                }
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("clientKeyPath {key:?}: {e}"))?;
                Some((chain, key))
            }
            _ => return Err("give clientCertPath and clientKeyPath together".to_owned()),
        };
        let roots = match files.ca_cert {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(ca)
                    .map_err(|e| format!("caCertPath {ca:?}: {e}"))?;
                let (added, _) = roots.add_parsable_certificates(certs.flatten());
                if added == 0 {
                    return Err(format!("caCertPath {ca:?}: no CA certificate"));
                }
                roots
            }
            None => system_roots(),
        };
        let builder = || {
            ClientConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))
        };
        let finish =
            |b: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>| match &client
            {
                Some((chain, key)) => b
                    .with_client_auth_cert(chain.clone(), key.clone_key())
                    .map_err(|e| format!("client certificate: {e}")),
                None => Ok(b.with_no_client_auth()),
            };
        let verified = if roots.is_empty() {
            None
        } else {
            Some(TlsConnector::from(Arc::new(finish(
                builder()?.with_root_certificates(roots),
            )?)))
        };
        let unverified = finish(
            builder()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCert(Arc::clone(&provider)))),
        )?;
        Ok(Self {
            verified,
            unverified: TlsConnector::from(Arc::new(unverified)),
        })
    }
}

/// CA certificates from `SSL_CERT_FILE` or the usual bundle locations.
fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let candidates = std::env::var_os("SSL_CERT_FILE")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(
            [
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/pki/tls/certs/ca-bundle.crt",
                "/etc/ssl/cert.pem",
                "/etc/ssl/ca-bundle.pem",
            ]
            .map(std::path::PathBuf::from),
        );
    for path in candidates {
        if let Ok(certs) = CertificateDer::pem_file_iter(&path) {
            let (added, _) = roots.add_parsable_certificates(certs.flatten());
            if added > 0 {
                break;
            }
        }
    }
    roots
}

/// Accepts any server certificate but still checks handshake signatures.
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Where and how one scraper fetches its page.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    /// `Some` for HTTPS.
    pub(crate) tls: Option<TlsConnector>,
    pub(crate) path: http::uri::PathAndQuery,
    pub(crate) host: http::HeaderValue,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("https", &self.tls.is_some())
            .field("path", &self.path)
            .finish()
    }
}

impl Target {
    /// The target for `addr` and a source's scheme, path and verification.
    ///
    /// # Errors
    /// A path that is not a valid URL path, or HTTPS with certificate
    /// verification when no CA roots were found.
    pub(crate) fn new(
        addr: SocketAddr,
        https: bool,
        insecure_skip_verify: bool,
        path: &str,
        tls: &Tls,
    ) -> Result<Self, String> {
        let path = path
            .parse::<http::uri::PathAndQuery>()
            .map_err(|e| format!("invalid path {path:?}: {e}"))?;
        let tls = match (https, insecure_skip_verify) {
            (false, _) => None,
            (true, true) => Some(tls.unverified.clone()),
            (true, false) => Some(tls.verified.clone().ok_or_else(|| {
                "no CA certificates found (set SSL_CERT_FILE) to verify HTTPS model servers; or set insecureSkipVerify".to_owned()
            })?),
        };
        let host = http::HeaderValue::from_str(&addr.to_string())
            .map_err(|e| format!("invalid host: {e}"))?;
        Ok(Self {
            addr,
            tls,
            path,
            host,
        })
    }
}

/// A kept-alive connection to one target.
#[derive(Debug)]
pub(crate) struct Conn {
    send: SendRequest<Empty<Bytes>>,
    task: AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Never drain what the server still sends (a huge or dripping page).
        self.task.abort();
    }
}

async fn connect(target: &Target) -> Result<Conn, FetchError> {
    let tcp = TcpStream::connect(target.addr)
        .await
        .map_err(|e| FetchError::Connect(format!("connect: {e}")))?;
    let _ = tcp.set_nodelay(true);
    match &target.tls {
        None => handshake(TokioIo::new(tcp)).await,
        Some(tls) => {
            let name = ServerName::IpAddress(target.addr.ip().into());
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|e| FetchError::Connect(format!("TLS handshake: {e}")))?;
            handshake(TokioIo::new(stream)).await
        }
    }
}

/// hyper's read buffer per connection. Fixed rather than hyper's adaptive
/// one (which grows towards ~400 KB on 100 KB pages and was re-allocated, and
/// its fresh pages faulted in, scrape after scrape); below glibc's mmap
/// threshold, so it stays in the heap and is reused.
const READ_BUF: usize = 64 << 10;

async fn handshake<IO>(io: IO) -> Result<Conn, FetchError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (send, conn) = http1::Builder::new()
        .read_buf_exact_size(Some(READ_BUF))
        .handshake(io)
        .await
        .map_err(|e| FetchError::Connect(format!("HTTP handshake: {e}")))?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    })
    .abort_handle();
    Ok(Conn { send, task })
}

/// Fetches the page of `target` into `page` (cleared first), reusing `conn`
/// when it is still open. On error `conn` is dropped.
pub(crate) async fn fetch(
    target: &Target,
    conn: &mut Option<Conn>,
    max_bytes: usize,
    page: &mut Vec<u8>,
) -> Result<(), FetchError> {
    page.clear();
    let result = fetch_inner(target, conn, max_bytes, page).await;
    if result.is_err() {
        *conn = None;
    }
    result
}

async fn fetch_inner(
    target: &Target,
    conn: &mut Option<Conn>,
    max_bytes: usize,
    page: &mut Vec<u8>,
) -> Result<(), FetchError> {
    if conn.as_ref().is_none_or(|c| c.send.is_closed()) {
        *conn = Some(connect(target).await?);
    }
    let Some(c) = conn.as_mut() else {
        return Err(FetchError::Connect("no connection".into()));
    };
    c.send
        .ready()
        .await
        .map_err(|e| FetchError::Http(format!("connection closed: {e}")))?;
    let req = http::Request::get(target.path.as_str())
        .header(http::header::HOST, target.host.clone())
        .header(http::header::ACCEPT, "text/plain;version=0.0.4")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::Http(e.to_string()))?;
    let resp = c
        .send
        .send_request(req)
        .await
        .map_err(|e| FetchError::Http(format!("request failed: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(FetchError::Http(format!("HTTP {status}")));
    }
    if let Some(len) = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
    {
        if len > max_bytes {
            return Err(FetchError::TooLarge);
        }
        page.reserve(len);
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| FetchError::Http(format!("reading body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if page.len() + data.len() > max_bytes {
                return Err(FetchError::TooLarge);
            }
            page.extend_from_slice(&data);
        }
    }
    Ok(())
}
