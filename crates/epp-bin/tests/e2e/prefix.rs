//! Prefix affinity with the default config: requests sharing a long prefix
//! keep going to the simulator that cached it, while unrelated prompts spread.

use std::{collections::HashMap, time::Duration};

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
};

async fn served_by(stack: &Stack, prompt: String) -> usize {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": prompt,
        "max_tokens": 2,
    });
    let r = http::post_json(stack.envoy.port, "/v1/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    stack
        .sim_index(r.header("x-inference-pod").unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_stick_while_unrelated_prompts_spread() {
    let stack = Stack::start("prefix", 4, &[], &[], BodyMode::Streamed);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Four tenants with 8 KiB system prompts, interleaved.
    let groups = 4;
    let per_group = 8;
    let mut homes: Vec<HashMap<usize, usize>> = vec![HashMap::new(); groups];
    for round in 0..per_group {
        for (g, home) in homes.iter_mut().enumerate() {
            let prefix = format!("Tenant {g} system prompt: be precise and kind. ").repeat(180);
            let sim = served_by(&stack, format!("{prefix}\nQuestion {round}?")).await;
            *home.entry(sim).or_default() += 1;
        }
    }
    for (g, home) in homes.iter().enumerate() {
        let (&sim, &n) = home.iter().max_by_key(|(_, n)| **n).unwrap();
        assert!(
            n >= per_group - 1,
            "tenant {g} should stick to one simulator (best: sim-{sim} with {n}/{per_group}): {home:?}"
        );
    }

    // Unrelated short prompts: no prefix to follow, so the load spreads.
    let mut counts = [0usize; 4];
    for i in 0..40 {
        counts[served_by(&stack, format!("unrelated prompt {i} {}", i * 7919)).await] += 1;
    }
    let used = counts.iter().filter(|&&c| c > 0).count();
    let max = counts.iter().max().copied().unwrap_or(0);
    assert!(
        used >= 3 && max <= 20,
        "unrelated prompts should spread: {counts:?}"
    );
}

/// Two epp replicas with the default config, each behind its own Envoy,
/// sharing their state over `udp-peer-syncer`: a tenant whose first request
/// went through one replica keeps going to the same simulator through the
/// other, which saw none of its requests before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_picks_route_a_tenant_where_the_other_sent_it() {
    use epp_test_support::process::{scratch_dir, start_envoy, start_epp, start_sim};

    let dir = scratch_dir("replica-sync");
    let sims: Vec<_> = (0..4).map(|i| start_sim(&dir, i, &[])).collect();
    let endpoints = sims
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect::<Vec<_>>()
        .join(",");
    let udp = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let ports = [udp(), udp()];
    let replica = |r: usize| {
        let sync = format!(
            "plugins:\n- type: udp-peer-syncer\n  parameters: {{address: \"127.0.0.1:{}\"}}\n\
             - type: static-peer-discovery\n  parameters: {{peers: [\"127.0.0.1:{}\", \"127.0.0.1:{}\"]}}\n",
            ports[r], ports[0], ports[1]
        );
        let config = epp_plugins::DEFAULT_CONFIG.replacen("plugins:\n", &sync, 1)
            + "dataLayer:\n  peerDiscovery: {pluginRef: static-peer-discovery}\n  \
               crossReplicaSyncerPluginRef: udp-peer-syncer\n";
        let sub = dir.join(format!("replica-{r}"));
        std::fs::create_dir_all(&sub).unwrap();
        let file = sub.join("epp.yaml");
        std::fs::write(&file, config).unwrap();
        let epp = start_epp(
            &sub,
            &[
                "--config-file",
                file.to_str().unwrap(),
                "--endpoints",
                &endpoints,
            ],
        );
        let envoy = start_envoy(&sub, BodyMode::Streamed, epp.grpc_port);
        (epp, envoy)
    };
    let (a, envoy_a) = replica(0);
    let (b, envoy_b) = replica(1);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let send = |port: u16, prompt: String| async move {
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "prompt": prompt,
            "max_tokens": 2,
        });
        let r = http::post_json(port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("x-inference-pod").unwrap().to_owned()
    };
    // Three tenants start on A; their next requests go through B. Without
    // sharing, B would place each by load alone (one chance in four each).
    for tenant in 0..3 {
        let prefix = format!("Tenant {tenant} system prompt: answer in rhyme. ").repeat(150);
        let home = send(envoy_a.port, format!("{prefix}\nFirst question?")).await;
        // B has the pick once its counter says so.
        let mut received = 0.0;
        for _ in 0..100 {
            received = pick_messages(b.metrics_port).await;
            if received > f64::from(tenant) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(received > f64::from(tenant), "B never heard of the pick");
        for q in 0..4 {
            let served = send(envoy_b.port, format!("{prefix}\nQuestion {q}?")).await;
            assert_eq!(served, home, "tenant {tenant}, question {q} through B");
        }
    }
    let page = super::precise_prefix::metrics(b.metrics_port).await;
    let value = |series: &str| super::precise_prefix::series(&page, series);
    assert!(
        value("epp_replica_sync_messages_total{direction=\"received\",kind=\"load\"}") >= 1.0,
        "{page}"
    );
    assert_eq!(value("epp_replica_sync_peers"), 1.0, "{page}");
    drop((a, b, envoy_a, envoy_b, sims));
}

/// Picks replica `port`'s syncer received from its peers.
async fn pick_messages(port: u16) -> f64 {
    super::precise_prefix::series(
        &super::precise_prefix::metrics(port).await,
        "epp_replica_sync_messages_total{direction=\"received\",kind=\"pick\"}",
    )
}
