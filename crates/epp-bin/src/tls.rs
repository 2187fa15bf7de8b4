//! TLS for the ext_proc server: a self-signed certificate generated at start
//! (the reference's default), or `tls.crt` / `tls.key` from a directory,
//! reloaded when the files change so certificates rotate without a restart.

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
        ServerConfig,
        crypto::ring::default_provider,
        pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject},
        server::{ClientHello, ResolvesServerCert},
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

/// A TLS acceptor for ext_proc. With `cert_dir`, a background task reloads the
/// files every second when they change; a bad new pair is logged and the old
/// one kept.
pub(crate) fn acceptor(
    cert_dir: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<TlsAcceptor> {
    let key = match &cert_dir {
        Some(dir) => load_dir(dir)?,
        None => self_signed()?,
    };
    let resolver = Arc::new(Resolver(ArcSwap::from_pointee(key)));
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec()];

    if let Some(dir) = cert_dir {
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
                        resolver.0.store(Arc::new(key));
                        tracing::info!(dir = %dir.display(), "reloaded TLS certificate");
                    }
                    Err(e) => tracing::error!(
                        error = format!("{e:#}"),
                        "TLS reload failed; keeping the previous certificate"
                    ),
                }
            }
        });
    }
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepted, handshaken TLS connections for tonic's `serve_with_incoming`.
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
