//! TLS for the ext_proc server: a self-signed certificate generated at start
//! (the reference's default), or `tls.crt` / `tls.key` from a directory,
//! reloaded when the files change so certificates rotate without a restart.
//! The metrics port's TLS (`--metrics-cert-dir`) reloads the same way and
//! can require client certificates (`--metrics-client-ca-file`).

use std::{
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};
use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        RootCertStore, ServerConfig,
        crypto::ring::default_provider,
        pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject},
        server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
        sign::CertifiedKey,
    },
    server::TlsStream,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// Serves the certificate currently loaded; swapped atomically on reload.
#[derive(Debug)]
struct Resolver(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

fn certified_key(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey> {
    let signing = default_provider()
        .key_provider
        .load_private_key(key)
        .context("unsupported private key")?;
    Ok(CertifiedKey::new(certs, signing))
}

fn self_signed() -> Result<CertifiedKey> {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "epp".to_owned()])
            .context("generating a self-signed certificate")?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    certified_key(vec![generated.cert.der().clone()], key)
}

fn load_dir(dir: &Path) -> Result<CertifiedKey> {
    let crt = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let certs = CertificateDer::pem_file_iter(&crt)
        .with_context(|| format!("reading {}", crt.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", crt.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", crt.display());
    let key =
        PrivateKeyDer::from_pem_file(&key).with_context(|| format!("reading {}", key.display()))?;
    certified_key(certs, key)
}

fn stamp(dir: &Path) -> Option<(SystemTime, SystemTime, u64, u64)> {
    let a = std::fs::metadata(dir.join("tls.crt")).ok()?;
    let b = std::fs::metadata(dir.join("tls.key")).ok()?;
    Some((a.modified().ok()?, b.modified().ok()?, a.len(), b.len()))
}

/// A resolver serving the pair in `dir`; a background task reloads the files
/// every second when they change. A bad new pair is logged and the old one
/// kept.
fn reloading(dir: PathBuf, shutdown: CancellationToken) -> Result<Arc<Resolver>> {
    let resolver = Arc::new(Resolver(ArcSwap::from_pointee(load_dir(&dir)?)));
    let live = Arc::clone(&resolver);
    tokio::spawn(async move {
        let mut last = stamp(&dir);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = stamp(&dir);
            if now == last {
                continue;
            }
            last = now;
            match load_dir(&dir) {
                Ok(key) => {
                    live.0.store(Arc::new(key));
                    tracing::info!(dir = %dir.display(), "reloaded TLS certificate");
                }
                Err(e) => tracing::error!(
                    dir = %dir.display(),
                    error = format!("{e:#}"),
                    "TLS reload failed; keeping the previous certificate"
                ),
            }
        }
    });
    Ok(resolver)
}

/// A TLS acceptor for ext_proc: the pair in `cert_dir` (reloaded when it
/// changes), or a self-signed certificate.
pub(crate) fn acceptor(
    cert_dir: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<TlsAcceptor> {
    let resolver = match cert_dir {
        Some(dir) => reloading(dir, shutdown)?,
        None => Arc::new(Resolver(ArcSwap::from_pointee(self_signed()?))),
    };
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The CA certificates in the PEM file `path`.
fn load_roots(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    for cert in certs {
        roots
            .add(cert)
            .with_context(|| format!("a CA certificate in {} is invalid", path.display()))?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "{} holds no CA certificate",
        path.display()
    );
    Ok(roots)
}

/// A TLS acceptor for the metrics port (`--metrics-cert-dir`, reloaded when
/// it changes), requiring a client certificate signed by a CA of
/// `client_ca` when given (`--metrics-client-ca-file`, read at start).
/// HTTP/2 and HTTP/1.1.
pub(crate) fn metrics_acceptor(
    cert_dir: &Path,
    client_ca: Option<&Path>,
    shutdown: CancellationToken,
) -> Result<TlsAcceptor> {
    let resolver =
        reloading(cert_dir.to_path_buf(), shutdown).context("invalid --metrics-cert-dir")?;
    let provider = Arc::new(default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let mut config = match client_ca {
        Some(ca) => {
            let roots = load_roots(ca).context("invalid --metrics-client-ca-file")?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("invalid --metrics-client-ca-file")?;
            builder
                .with_client_cert_verifier(verifier)
                .with_cert_resolver(resolver)
        }
        None => builder.with_no_client_auth().with_cert_resolver(resolver),
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepted, handshaken TLS connections for the ext_proc server
/// (`ExtProcService::serve_incoming`).
/// Handshakes run concurrently with a deadline, so a slow client cannot hold
/// up others.
pub(crate) fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "ext_proc accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
