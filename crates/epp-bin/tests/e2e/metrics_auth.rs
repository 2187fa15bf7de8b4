//! Who may read the metrics port: TokenReview + SubjectAccessReview against a
//! real API server with real ServiceAccount tokens, the same gate in front
//! of CPU profiles (read back with `go tool pprof`), failing closed while the
//! API server is away; TLS and client certificates on the metrics port.

use std::{path::Path, process::Command};

use epp_test_support::{
    http,
    kube::{KubeCluster, Ns},
    process::{
        BodyMode, Epp, Sim, epp_command, free_port_on, scratch_dir, spawn_epp, start_envoy,
        start_pod_sim, start_sims,
    },
    wait::poll,
};
use serde_json::json;

/// epp following the pool `pool` of `ns` as the test ServiceAccount user
/// `epp`, granted what docs/kubernetes.md lists (discovery and the reviews).
async fn epp_as_its_service_account(cluster: &KubeCluster, ns: &Ns, dir: &Path) -> Epp {
    ns.grant_discovery("epp", "epp").await;
    let mut cmd = epp_command();
    cmd.args([
        "--secure-serving=false",
        "--pool-name",
        "pool",
        "--pool-namespace",
        &ns.name,
        "--kubeconfig",
        cluster.kubeconfig_for("epp").to_str().unwrap(),
    ])
    .env("RUST_LOG", "info");
    spawn_epp("epp", cmd, dir.join("epp.log")).0
}

/// A simulator as the pool's only pod, on 127.0.0.1.
async fn one_pod(ns: &Ns, dir: &Path) -> Sim {
    let port = free_port_on("127.0.0.1");
    let sim = start_pod_sim(dir, "pod-a", "127.0.0.1", port, &[]);
    ns.apply_pool("pool", &[("app", "model")], &[port]).await;
    ns.pod("pod-a", &[("app", "model")], "127.0.0.1", true)
        .await;
    sim
}

pub(super) async fn get(port: u16, path: &str, token: Option<&str>) -> http::Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("authorization", a))
        .into_iter()
        .collect();
    http::send(port, "GET", path, &headers, "").await.unwrap()
}

/// The reference's metrics-reader ClusterRole (docs: nonResourceURLs
/// `/metrics`, verb `get`) bound to ServiceAccount `sa` of `ns`.
async fn bind(ns: &Ns, role: &str, urls: &[&str], sa: &str) {
    ns.bind_cluster_role(
        role,
        json!([{"nonResourceURLs": urls, "verbs": ["get"]}]),
        &format!("{}-{sa}-{role}", ns.name),
        json!({"kind": "ServiceAccount", "name": sa, "namespace": ns.name}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_auth_lets_only_permitted_service_accounts_read() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "metrics-auth").await;
    let dir = scratch_dir("metrics-auth");
    let _pod = one_pod(&ns, &dir).await;
    let reader = ns.service_account_token("metrics-reader").await;
    let nobody = ns.service_account_token("nobody").await;
    let profiler = ns.service_account_token("profiler").await;
    bind(
        &ns,
        "epp-test-metrics-reader",
        &["/metrics"],
        "metrics-reader",
    )
    .await;
    bind(&ns, "epp-test-metrics-reader", &["/metrics"], "profiler").await;
    bind(&ns, "epp-test-profiler", &["/debug/pprof/*"], "profiler").await;
    let epp = epp_as_its_service_account(cluster, &ns, &dir).await;
    let port = epp.metrics_port;

    let r = get(port, "/metrics", None).await;
    assert_eq!(r.status, 401, "no token: {}", r.text());
    let r = get(port, "/metrics", Some("not-a-token")).await;
    assert_eq!(r.status, 401, "an invalid token: {}", r.text());
    let r = get(port, "/metrics", Some(&nobody)).await;
    assert_eq!(
        r.status,
        403,
        "a ServiceAccount without the role: {}",
        r.text()
    );
    assert!(
        r.text().contains("system:serviceaccount:") && r.text().contains(":nobody"),
        "{}",
        r.text()
    );
    let r = get(port, "/metrics", Some(&reader)).await;
    assert_eq!(r.status, 200, "the metrics reader: {}", r.text());
    assert!(
        r.text().contains("inference_pool_ready_pods"),
        "{}",
        r.text()
    );
    let r = get(port, "/metrics", Some(&reader)).await;
    assert_eq!(r.status, 200, "again, from the cache");

    // Profiles: the same gate, for their own path.
    let profile = "/debug/pprof/profile?seconds=1";
    assert_eq!(get(port, profile, None).await.status, 401);
    assert_eq!(get(port, profile, Some(&nobody)).await.status, 403);
    assert_eq!(
        get(port, profile, Some(&reader)).await.status,
        403,
        "reading /metrics does not allow profiling"
    );
    let r = get(port, "/debug/pprof/profile?seconds=600", Some(&profiler)).await;
    assert_eq!(r.status, 400, "{}", r.text());

    // A profile under load, read by go tool pprof.
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);
    poll("a request routed", 200, || async {
        let r = http::post_hello(envoy.port, None).await.ok()?;
        (r.status == 200).then_some(())
    })
    .await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, port) = (stop.clone(), envoy.port);
        load.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let r = http::post_hello(port, None).await.unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
            }
        }));
    }
    // 5 s rather than 1: at 100 Hz and the CPU a debug build under this load
    // takes (~10 %), one second is ~10 samples, too few to be sure one lands
    // in epp's own code rather than in tokio, hyper or h2.
    let r = get(port, "/debug/pprof/profile?seconds=5", Some(&profiler)).await;
    stop.cancel();
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(r.status, 200, "{}", r.text());
    let file = dir.join("cpu.pb");
    std::fs::write(&file, &r.body).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-cum", "-nodecount=2000"])
        .arg(&file)
        .output()
        .expect("go is installed");
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(top.contains("Showing nodes accounting for"), "{top}");
    assert!(
        top.lines()
            .any(|l| l.contains(" epp_") || l.contains(" epp::")),
        "no epp function in the profile:\n{top}"
    );
    // One profile at a time: of two asked together, one is refused.
    let both = [0, 1].map(|_| {
        let token = profiler.clone();
        tokio::spawn(async move {
            get(port, "/debug/pprof/profile?seconds=3", Some(&token))
                .await
                .status
        })
    });
    let mut statuses = Vec::new();
    for b in both {
        statuses.push(b.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409]);

    // Time is charged to what epp was doing, not to the sampler's unwinder.
    let flat = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=1"])
        .arg(&file)
        .output()
        .unwrap();
    let flat = String::from_utf8_lossy(&flat.stdout);
    let hottest = flat.lines().last().unwrap_or_default();
    assert!(
        !hottest.contains("backtrace::") && !hottest.contains("pprof::"),
        "{flat}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_auth_fails_closed_while_the_api_server_is_away() {
    let cluster = KubeCluster::start("metrics-auth-outage");
    let ns = Ns::create(&cluster, "metrics-auth-outage").await;
    let dir = scratch_dir("metrics-auth-outage");
    let _pod = one_pod(&ns, &dir).await;
    let reader = ns.service_account_token("metrics-reader").await;
    bind(
        &ns,
        "epp-test-metrics-reader",
        &["/metrics"],
        "metrics-reader",
    )
    .await;
    let epp = epp_as_its_service_account(&cluster, &ns, &dir).await;

    let c = &cluster;
    tokio::task::block_in_place(|| c.stop_apiserver());
    // The token was never reviewed: nothing cached to fall back on.
    let r = get(epp.metrics_port, "/metrics", Some(&reader)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(get(epp.metrics_port, "/metrics", None).await.status, 401);
    tokio::task::block_in_place(|| c.start_apiserver());
    poll(
        "the reader served once the API server is back",
        400,
        || async {
            (get(epp.metrics_port, "/metrics", Some(&reader))
                .await
                .status
                == 200)
                .then_some(())
        },
    )
    .await;
    let log = poll("the recovery logged", 200, || async {
        let log = std::fs::read_to_string(dir.join("epp.stderr")).ok()?;
        log.contains("answers reviews again").then_some(log)
    })
    .await;
    assert_eq!(
        log.matches("cannot review tokens").count(),
        1,
        "the outage is logged once:\n{log}"
    );
}

/// A CA, a certificate for 127.0.0.1 signed by it (`dir/tls.crt`,
/// `dir/tls.key`) and a client certificate (`dir/client.crt`, `.key`).
fn certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    // Distinct subjects: rcgen's default one on both would make the leaf
    // look self-signed.
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "epp-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    for (name, san) in [("tls", "127.0.0.1"), ("client", "scraper")] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![san.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, san);
        let cert = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// `curl` to the metrics port over TLS: the HTTP status, or `None` when no
/// exchange happened (e.g. the handshake was refused).
fn curl(dir: &Path, port: u16, extra: &[&str]) -> Option<u16> {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(dir.join("ca.crt"))
        .args(extra)
        .arg(format!("https://127.0.0.1:{port}/metrics"))
        .output()
        .expect("curl is installed");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).parse().ok())
        .flatten()
}

fn curl_with_certificate(dir: &Path, port: u16, extra: &[&str]) -> Option<u16> {
    let (crt, key) = (dir.join("client.crt"), dir.join("client.key"));
    let mut args = vec![
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    curl(dir, port, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_auth_over_tls_with_client_certificates() {
    let dir = scratch_dir("metrics-tls");
    certificates(&dir);
    let sims = start_sims(&dir, 1, &[]);
    let mut cmd = epp_command();
    cmd.args(["--secure-serving=false", "--endpoints", &sims[0].addr()])
        .arg("--metrics-cert-dir")
        .arg(&dir)
        .arg("--metrics-client-ca-file")
        .arg(dir.join("ca.crt"))
        .env("EPP_METRICS_BEARER_TOKEN", "s3cret")
        .env("RUST_LOG", "info");
    let (epp, _) = spawn_epp("epp", cmd, dir.join("epp.log"));
    let port = epp.metrics_port;
    assert_eq!(
        curl_with_certificate(&dir, port, &["-H", "Authorization: Bearer s3cret"]),
        Some(200),
        "a client certificate and the token"
    );
    assert_eq!(
        curl_with_certificate(&dir, port, &[]),
        Some(401),
        "a client certificate, no token"
    );
    assert_eq!(
        curl(&dir, port, &["-H", "Authorization: Bearer s3cret"]),
        None,
        "no client certificate: the handshake is refused"
    );
    let plain = http::send(port, "GET", "/metrics", &[], "").await;
    assert!(
        !matches!(plain, Ok(ref r) if r.status == 200),
        "plaintext is not served"
    );
}

#[test]
fn metrics_auth_flags_that_cannot_work_are_errors() {
    let dir = scratch_dir("metrics-flags");
    let missing = dir.join("nowhere");
    for (args, needle) in [
        (
            vec!["--metrics-cert-dir", missing.to_str().unwrap()],
            format!("{}", missing.join("tls.crt").display()),
        ),
        (
            vec!["--metrics-client-ca-file", "/x/ca.crt"],
            "--metrics-cert-dir".to_owned(),
        ),
        (
            vec!["--metrics-endpoint-auth=true"],
            "--metrics-endpoint-auth needs a cluster".to_owned(),
        ),
    ] {
        let out = epp_command()
            .args(["--secure-serving=false", "--endpoints", "127.0.0.1:9"])
            .args(&args)
            .env("EPP_METRICS_BEARER_TOKEN", "t")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must not start");
        assert!(stderr.contains(&needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = epp_command()
        .args(["--secure-serving=false", "--endpoints", "127.0.0.1:9"])
        .args(["--metrics-cert-dir", dir.to_str().unwrap()])
        .env_remove("EPP_METRICS_BEARER_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("would serve metrics over TLS to anyone"),
        "{stderr}"
    );
}
