//! The process surface: health that tells the truth, TLS to Envoy by default,
//! metrics names, config checking, and an orderly shutdown.

use std::{process::Command, time::Duration};

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use epp_test_support::{
    http,
    process::{
        BodyMode, Stack, epp_command, scratch_dir, spawn_epp, start_envoy_tls, start_epp,
        start_sims, workspace_bin,
    },
    wait::poll,
};

async fn health(port: u16, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let r = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap();
    r.into_inner().status()
}

async fn wait_health(port: u16, service: &str, want: ServingStatus) {
    for _ in 0..100 {
        if health(port, service).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("health of {service:?} never became {want:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_the_reference_probes_and_stale_endpoints_are_not_a_restart() {
    let dir = scratch_dir("health");
    let sims = start_sims(&dir, 1, &[]);
    // One live endpoint and one where nothing listens.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut epp = start_epp(
        &dir,
        &[
            "--endpoints",
            &format!("{},{dead}", sims[0].addr()),
            "--metrics-staleness-threshold",
            "300ms",
            "--drain-timeout",
            "1s",
        ],
    );
    let services = [
        "",
        "readiness",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
        "liveness",
    ];
    for svc in services {
        wait_health(epp.health_port, svc, ServingStatus::Serving).await;
    }
    let ready_pods = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("inference_pool_ready_pods{"))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    let metrics = || http::get_blocking(epp.metrics_port, "/metrics").unwrap().1;
    poll("one fresh endpoint", 100, || async {
        (ready_pods(&metrics()).as_deref() == Some("1")).then_some(())
    })
    .await;
    // The only live model server dies: no endpoint is fresh any more. That
    // is visible in the pool gauge, and it is no reason to take epp out of
    // service or restart it: every probe stays SERVING.
    drop(sims);
    poll("no fresh endpoint", 100, || async {
        (ready_pods(&metrics()).as_deref() == Some("0")).then_some(())
    })
    .await;
    for svc in services {
        assert_eq!(
            health(epp.health_port, svc).await,
            ServingStatus::Serving,
            "{svc:?}"
        );
    }

    let code = epp.proc.terminate(Duration::from_secs(10));
    assert_eq!(code, Some(0), "SIGTERM ends epp cleanly");
    let log = std::fs::read_to_string(dir.join("epp.stderr")).unwrap_or_default();
    assert!(
        log.contains("no endpoint has fresh metrics"),
        "the loss of every fresh endpoint is logged:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_talks_tls_to_epp_by_default() {
    let dir = scratch_dir("tls");
    let sims = start_sims(&dir, 2, &[]);
    let endpoints = sims
        .iter()
        .map(epp_test_support::process::Sim::addr)
        .collect::<Vec<_>>()
        .join(",");
    // No --secure-serving=false: the default is TLS with a self-signed certificate.
    let mut cmd = epp_command();
    cmd.args(["--endpoints", &endpoints]);
    let (epp, line) = spawn_epp("epp-tls", cmd, dir.join("epp.log"));
    assert!(line.contains("tls=true"), "{line}");
    let envoy = start_envoy_tls(&dir, epp.grpc_port);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 2});
    let r = http::post_json(envoy.port, "/v1/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_the_reference_names() {
    let stack = Stack::start(
        "metrics",
        2,
        &[],
        &["--pool-name", "my-pool"],
        BodyMode::Buffered,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 2});
    let r = http::post_json(stack.envoy.port, "/v1/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let (status, text) = http::get_blocking(stack.epp.metrics_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    for name in [
        "inference_pool_ready_pods{name=\"my-pool\"} 2",
        "inference_pool_average_kv_cache_utilization{name=\"my-pool\"}",
        "inference_pool_average_queue_size{name=\"my-pool\"}",
        "inference_pool_per_pod_queue_size{",
        "inference_objective_request_total{",
        "inference_extension_scheduler_e2e_duration_seconds_bucket{",
        "epp_metrics_scrapes_total{",
        // One request: each plugin of the default profile ran once, the
        // profile handler twice (run the profile, then "done").
        "inference_extension_plugin_duration_seconds_count{extension_point=\"Scorer\",plugin_type=\"queue-scorer\",plugin_name=\"queue-scorer\"} 1",
        "inference_extension_plugin_duration_seconds_count{extension_point=\"Scorer\",plugin_type=\"kv-cache-utilization-scorer\",plugin_name=\"kv-cache-utilization-scorer\"} 1",
        "inference_extension_plugin_duration_seconds_count{extension_point=\"Scorer\",plugin_type=\"prefix-cache-scorer\",plugin_name=\"prefix-cache-scorer\"} 1",
        "inference_extension_plugin_duration_seconds_count{extension_point=\"Picker\",plugin_type=\"max-score-picker\",plugin_name=\"max-score-picker\"} 1",
        "inference_extension_plugin_duration_seconds_count{extension_point=\"ProfilePicker\",plugin_type=\"single-profile-handler\",plugin_name=\"single-profile-handler\"} 2",
        "inference_extension_scheduler_e2e_duration_seconds_count 1",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

/// The `epp` process with `--endpoints-file`: per-endpoint scrape status in
/// its metrics, a bad edit kept out (counted, logged with its line), and an
/// editor's write-then-rename followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_file_edits_reach_the_picker_and_bad_edits_are_kept_out() {
    let dir = scratch_dir("endpoints-file");
    let sims = start_sims(&dir, 2, &[]);
    let file = dir.join("endpoints.yaml");
    let entry = |s: &epp_test_support::process::Sim| {
        format!("- {{address: 127.0.0.1, port: {}}}\n", s.port)
    };
    std::fs::write(&file, entry(&sims[0]) + &entry(&sims[1])).unwrap();
    let epp = start_epp(
        &dir,
        &[
            "--endpoints-file",
            file.to_str().unwrap(),
            "--pool-name",
            "p",
        ],
    );
    let metrics = || http::get_blocking(epp.metrics_port, "/metrics").unwrap().1;
    let wait_for = |what: &str, cond: &dyn Fn(&str) -> bool| {
        for _ in 0..400 {
            if cond(&metrics()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("never: {what}\n{}", metrics());
    };
    let up = |s: &epp_test_support::process::Sim| {
        format!("epp_metrics_scrape_up{{endpoint=\"{}\"}} 1", s.addr())
    };
    wait_for("both endpoints scraped", &|m| {
        m.contains("inference_pool_ready_pods{name=\"p\"} 2")
            && m.contains(&up(&sims[0]))
            && m.contains(&up(&sims[1]))
    });
    assert!(metrics().contains("epp_endpoints_file_errors_total 0"));

    std::fs::write(&file, "- {address: 127.0.0.1, port: not-a-port}\n").unwrap();
    wait_for("the bad edit counted", &|m| {
        m.contains("epp_endpoints_file_errors_total 1")
    });
    assert!(
        metrics().contains("inference_pool_ready_pods{name=\"p\"} 2"),
        "endpoints kept"
    );
    // Logged with file:line:column (the log line may trail the counter).
    let at = format!("{}:1:", file.display());
    let log = || std::fs::read_to_string(dir.join("epp.stderr")).unwrap_or_default();
    for _ in 0..200 {
        if log().contains(&at) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(log().contains(&at), "no {at} in the log:\n{}", log());

    let tmp = dir.join("endpoints.yaml.new");
    std::fs::write(&tmp, entry(&sims[0])).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    wait_for("the removal applied", &|m| {
        m.contains("inference_pool_ready_pods{name=\"p\"} 1") && !m.contains(&sims[1].addr())
    });
    assert!(metrics().contains(&up(&sims[0])));
}

#[test]
fn check_config_validates_and_prints_the_effective_config() {
    let epp = workspace_bin("epp");
    let ok = Command::new(&epp).arg("--check-config").output().unwrap();
    assert!(ok.status.success());
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        text.contains("pluginRef: prefix-cache-scorer\n    weight: 3.0"),
        "{text}"
    );
    assert!(text.contains("type: core-metrics-extractor"), "{text}");

    let dir = scratch_dir("check-config");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorr\n").unwrap();
    let out = Command::new(&epp)
        .arg("--config-file")
        .arg(&bad)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:6:5: schedulingProfiles[0].plugins[0].pluginRef: no plugin named \"queue-scorr\""),
        "{err}"
    );
}
