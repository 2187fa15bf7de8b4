//! `metrics-data-source`'s llm-d TLS parameters against a real HTTPS server
//! that requires a client certificate: `caCertPath` verifies the server with
//! the source's own CA, `clientCertPath` + `clientKeyPath` present the
//! client certificate; without it the server refuses the handshake.

use std::{path::PathBuf, sync::Arc};

use epp_core::{EndpointSource, PluginRef, config::SourceWiring};
use epp_datalayer::{
    CoreMetricsExtractor, CoreMetricsParams, DataLayer, DataLayerOptions, EndpointSpec,
    EndpointStore, MetricsDataSource,
};
use epp_test_support::wait::eventually;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio_rustls::rustls::{
    RootCertStore, ServerConfig,
    crypto::ring,
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
    server::WebPkiClientVerifier,
};
use tokio_util::sync::CancellationToken;

use crate::common::{BadServer, Mode, vllm_page};

/// A CA, a server certificate for 127.0.0.1 and a client certificate it
/// signed, the PEM files in a fresh directory, and a server config that
/// requires a client certificate from that CA.
fn pki() -> (PathBuf, ServerConfig) {
    let dir = std::env::temp_dir().join(format!(
        "epp-mtls-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["epp".to_owned()])
        .unwrap()
        .signed_by(&client_key, &ca)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("client.pem"), client.pem()).unwrap();
    std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();
    let provider = Arc::new(ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()
            .unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![server.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )
        .unwrap();
    (dir, config)
}

fn source(params: &str) -> Result<SourceWiring, String> {
    let params = serde_yaml_ng::from_str(params).unwrap();
    let source =
        MetricsDataSource::new("metrics-data-source", params).map_err(|e| e.to_string())?;
    let core = CoreMetricsExtractor::new("core", &CoreMetricsParams::default()).unwrap();
    Ok(SourceWiring {
        source: PluginRef::new(Arc::new(source)),
        extractors: vec![PluginRef::new(Arc::new(core))],
    })
}

fn start(server: &BadServer, wiring: SourceWiring) -> (Arc<EndpointStore>, DataLayer) {
    let store = Arc::new(EndpointStore::new());
    store.replace_source("test", vec![EndpointSpec::new(server.addr)]);
    let dl = DataLayer::start(
        Arc::clone(&store),
        &[wiring],
        DataLayerOptions {
            refresh_interval: std::time::Duration::from_millis(10),
            ..DataLayerOptions::default()
        },
        CancellationToken::new(),
    )
    .unwrap();
    (store, dl)
}

#[tokio::test]
async fn the_sources_ca_and_client_certificate_are_used() {
    let (dir, config) = pki();
    let server = BadServer::start_with_tls(Mode::Page(vllm_page(5, 1, 0.2)), config).await;
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("client.pem"),
        dir.join("client.key"),
    );
    let with_cert = source(&format!(
        "{{scheme: https, caCertPath: {}, clientCertPath: {}, clientKeyPath: {}}}",
        ca.display(),
        cert.display(),
        key.display()
    ))
    .unwrap();
    let (store, dl) = start(&server, with_cert);
    eventually("scraped over mutual TLS, the server verified", || async {
        store
            .snapshot()
            .by_addr(server.addr)
            .unwrap()
            .metrics()
            .waiting
            == 5
    })
    .await;
    dl.stop().await;

    // The CA alone: the server verifies, but refuses a client without a
    // certificate.
    let without = source(&format!("{{scheme: https, caCertPath: {}}}", ca.display())).unwrap();
    let (store, dl) = start(&server, without);
    eventually("refused handshakes", || async {
        dl.status().iter().all(|s| s.failed >= 3)
    })
    .await;
    assert!(dl.status().iter().all(|s| s.ok == 0), "{:?}", dl.status());
    assert!(
        store
            .snapshot()
            .by_addr(server.addr)
            .unwrap()
            .metrics()
            .updated_at
            .is_none()
    );
    dl.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unreadable_or_half_given_certificates_fail_at_load() {
    let err = source("{scheme: https, caCertPath: /nonexistent/ca.pem}").unwrap_err();
    assert!(
        err.contains("caCertPath") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
    let err = source("{clientCertPath: /x.pem}").unwrap_err();
    assert!(err.contains("clientKeyPath"), "{err}");
    let err = source("{port: 0}").unwrap_err();
    assert!(err.contains("port"), "{err}");
    let err = source("{interval: often}").unwrap_err();
    assert!(err.contains("interval"), "{err}");
    assert!(source("{port: 9090, interval: 1s}").is_ok());
}
