//! Precise prefix caching through Envoy: three simulators publish vLLM's
//! KV-cache events over ZeroMQ; epp subscribes to each (following
//! `--endpoints`), tokenizes completions with the same tokenizer, and routes
//! to the server whose engine reports holding the prompt's blocks, including
//! blocks it cached for requests epp never routed, and stops as soon as the
//! engine reports evicting them. The same with llm-d's own simulator as the
//! model servers: a publisher nobody here wrote. And two replicas sharing
//! one index in a real Redis server.

use std::{path::Path, time::Duration};

use epp_test_support::{
    http,
    process::{
        BodyMode, Envoy, Epp, Sim, free_port_on, scratch_dir, shared_loopback_port, start_envoy,
        start_epp, start_sim_at,
    },
    redis::RedisServer,
    tokenizer::write_test_tokenizer,
};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const IPS: [&str; 3] = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];

/// The token producer's in-process backend over `tokenizer` (a file or
/// the model's directory), for [`config_with`].
fn local(tokenizer: &Path) -> String {
    format!("    local: {{path: {}}}", tokenizer.display())
}

/// The config with `backend` as the token producer's backend parameters.
fn config_with(backend: &str, kv_port: u16) -> String {
    format!(
        "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: {MODEL}
{backend}
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: 4}}
    kvEventsConfig:
      podDiscoveryConfig: {{socketPort: {kv_port}}}
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
  - pluginRef: endpoint-notification-source
    extractors:
    - pluginRef: precise-prefix-cache-producer
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
  - {{pluginRef: queue-scorer, weight: 1}}
  - pluginRef: max-score-picker
"
    )
}

/// A completion of `prompt` (under `salt`, when given) at `host:port`.
async fn complete(host: &str, port: u16, prompt: &str, salt: Option<&str>) -> http::Response {
    let mut body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 2});
    if let Some(salt) = salt {
        body["cache_salt"] = salt.into();
    }
    let r = http::post_json_at(host, port, "/v1/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

/// Sends `prompt` through Envoy; the index of the simulator that served it.
async fn routed(envoy: u16, prompt: &str) -> usize {
    let r = complete("127.0.0.1", envoy, prompt, None).await;
    let pod = r.header("x-inference-pod").unwrap().to_owned();
    pod.strip_prefix("sim-").unwrap().parse().unwrap()
}

/// `epp_kv_events_blocks_total{endpoint, kind}` in epp's metrics
/// (`endpoint` is `ip:port`).
async fn blocks(metrics_port: u16, endpoint: &str, kind: &str) -> f64 {
    series(&metrics(metrics_port).await, &blocks_series(endpoint, kind))
}

fn blocks_series(endpoint: &str, kind: &str) -> String {
    format!("epp_kv_events_blocks_total{{endpoint=\"{endpoint}\",kind=\"{kind}\"}}")
}

async fn wait_for_blocks(metrics_port: u16, endpoint: &str, kind: &str, above: f64) -> f64 {
    let name = blocks_series(endpoint, kind);
    let page = page_when(
        metrics_port,
        &format!("more than {above} {kind} blocks from {endpoint}"),
        |page| series(page, &name) > above,
    )
    .await;
    series(&page, &name)
}

/// epp's metrics page.
pub(super) async fn metrics(metrics_port: u16) -> String {
    http::send(metrics_port, "GET", "/metrics", &[], "")
        .await
        .unwrap()
        .text()
}

/// epp's metrics page once `ready` holds for it (polled for 5 s, then a
/// panic naming `what`).
async fn page_when(metrics_port: u16, what: &str, ready: impl Fn(&str) -> bool) -> String {
    for _ in 0..100 {
        let page = metrics(metrics_port).await;
        if ready(&page) {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("epp's metrics never showed {what}");
}

/// `ip:port` of simulator `sim` on `ip`.
fn at(ip: &str, sim: &Sim) -> String {
    format!("{ip}:{}", sim.port)
}

/// Three simulators on 127.0.0.2–4 publishing KV events on `kv_port`, each
/// with `extra` arguments.
fn start_publishers(
    dir: &Path,
    tokenizer: &Path,
    http_port: u16,
    kv_port: u16,
    extra: &[&str],
) -> Vec<Sim> {
    IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let events = format!(
                r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://{ip}:{kv_port}","topic":"kv@{ip}@{MODEL}"}}"#
            );
            let mut args = vec![
                "--tokenizer",
                tokenizer.to_str().unwrap(),
                "--block-size",
                "4",
                "--kv-events-config",
                &events,
            ];
            args.extend_from_slice(extra);
            start_sim_at(dir, &format!("sim-{i}"), ip, http_port, &args)
        })
        .collect()
}

/// The three publishers (`sim_args` added to each), epp with the token
/// producer's `backend` over them, and Envoy in front.
async fn start_fleet(
    dir: &Path,
    tokenizer: &Path,
    sim_args: &[&str],
    backend: &str,
) -> (Vec<Sim>, Epp, Envoy) {
    let http_port = shared_loopback_port();
    let kv_port = free_port_on("127.0.0.2");
    let sims = start_publishers(dir, tokenizer, http_port, kv_port, sim_args);
    let (epp, envoy) = start_picker(dir, &config_with(backend, kv_port), http_port).await;
    (sims, epp, envoy)
}

/// A chat request for `MODEL` after `system`.
fn chat(system: &str, question: &str) -> serde_json::Value {
    serde_json::json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
}

/// Caches `system` on `sims[on]` by a chat request sent to it directly (epp
/// never sees it), waits for its blocks to reach epp, then requires eight
/// chat requests after the same system prompt, sent through Envoy, to go
/// to that simulator.
async fn chats_follow(epp: &Epp, envoy: &Envoy, sims: &[Sim], on: usize, system: &str) {
    warm_directly(epp, sims, on, system).await;
    assert_eq!(chats_to(envoy.port, on, system).await, 8);
}

/// epp with `config` over the three publishers on `http_port`, and Envoy in
/// front; returns once the KV-event subscribers had time to connect.
async fn start_picker(dir: &Path, config: &str, http_port: u16) -> (Epp, Envoy) {
    let file = dir.join("precise.yaml");
    std::fs::write(&file, config).unwrap();
    let endpoints = IPS
        .iter()
        .map(|ip| format!("{ip}:{http_port}"))
        .collect::<Vec<_>>()
        .join(",");
    let epp = start_epp(
        dir,
        &[
            "--config-file",
            file.to_str().unwrap(),
            "--endpoints",
            &endpoints,
        ],
    );
    let envoy = start_envoy(dir, BodyMode::Streamed, epp.grpc_port);
    // The subscribers connect within a second of start.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    (epp, envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_what_the_engines_report_holding() {
    let dir = scratch_dir("precise-prefix");
    let tokenizer = write_test_tokenizer(&dir).unwrap();
    let (sims, epp, envoy) = start_fleet(&dir, &tokenizer, &[], &local(&tokenizer)).await;

    // Warm sim-1 DIRECTLY: epp never routes this prompt, so only the
    // engine's events can tell it where the prefix is cached.
    let system = "The system prompt is the same for every user of the application. ".repeat(6);
    complete(IPS[1], sims[1].port, &format!("{system}Warm up."), None).await;
    let stored = wait_for_blocks(epp.metrics_port, &at(IPS[1], &sims[1]), "stored", 0.0).await;
    assert!(stored >= 20.0, "{stored} blocks");
    for q in 0..12 {
        let sim = routed(envoy.port, &format!("{system}Question {q}?")).await;
        assert_eq!(sim, 1, "question {q} should follow sim-1's cached blocks");
    }

    // sim-1 drops its cache and sim-2 gets the prefix (again directly): the
    // eviction and the new blocks move the requests.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = http::post_json_at(
        IPS[1],
        sims[1].port,
        "/reset_prefix_cache",
        &serde_json::json!({}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    complete(IPS[2], sims[2].port, &format!("{system}Warm up."), None).await;
    wait_for_blocks(epp.metrics_port, &at(IPS[2], &sims[2]), "stored", 0.0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let page = metrics(epp.metrics_port).await;
    assert!(
        page.contains(&format!(
            "epp_kv_events_total{{endpoint=\"{}\",kind=\"all_blocks_cleared\"}} 1",
            at(IPS[1], &sims[1])
        )),
        "sim-1's AllBlocksCleared reached epp:\n{page}"
    );
    for q in 12..20 {
        let sim = routed(envoy.port, &format!("{system}Question {q}?")).await;
        assert_eq!(sim, 2, "question {q} should follow the blocks to sim-2");
    }
    assert!(page.contains("epp_kv_block_index_keys{plugin=\"precise-prefix-cache-producer\"}"));
    drop(envoy);
}

/// The engines hash a request's `cache_salt` into its first block and
/// report it in their events' `extra_keys`; epp keys salted requests the
/// same way, so the same prompt under two salts follows two engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salted_requests_follow_the_blocks_of_their_own_salt() {
    let dir = scratch_dir("precise-prefix-salt");
    let tokenizer = write_test_tokenizer(&dir).unwrap();
    let (sims, epp, envoy) = start_fleet(&dir, &tokenizer, &[], &local(&tokenizer)).await;

    // The same prompt, cached directly under salt "a" on sim-1 and "b" on sim-2.
    let system = "Every tenant has the same long system prompt in this application. ".repeat(6);
    for (i, salt) in [(1, "a"), (2, "b")] {
        complete(
            IPS[i],
            sims[i].port,
            &format!("{system}Warm up."),
            Some(salt),
        )
        .await;
        wait_for_blocks(epp.metrics_port, &at(IPS[i], &sims[i]), "stored", 0.0).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for q in 0..8 {
        for (want, salt) in [(1, "a"), (2, "b")] {
            let r = complete(
                "127.0.0.1",
                envoy.port,
                &format!("{system}Q{q}?"),
                Some(salt),
            )
            .await;
            let pod = r.header("x-inference-pod").unwrap().to_owned();
            assert_eq!(
                pod,
                format!("sim-{want}"),
                "salt {salt:?}, question {q}: should follow the blocks cached under it"
            );
        }
    }
    drop(envoy);
}

/// `name{labels}` in `page` (0 when absent).
pub(super) fn series(page: &str, name_and_labels: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name_and_labels))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A publisher written with pyzmq and msgpack in the shape vLLM emits
/// (`kv_publisher.py`): integer and byte hashes, a gap filled from its
/// replay socket, a removal naming a byte hash by its integer, garbage. The
/// config declares no data layer: the producer gets the default event
/// source, as llm-d's older configs expect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_publisher_in_vllms_shape_is_indexed_with_replay() {
    let dir = scratch_dir("kv-publisher");
    let ip = "127.0.0.5";
    let (kv_port, replay_port) = (free_port_on(ip), free_port_on(ip));
    let file = dir.join("precise.yaml");
    std::fs::write(
        &file,
        format!(
            "\
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: 4}}
    kvEventsConfig:
      podDiscoveryConfig: {{socketPort: {kv_port}, replaySocketPort: {replay_port}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"
        ),
    )
    .unwrap();
    let endpoint = format!("{ip}:8000");
    let epp = start_epp(
        &dir,
        &[
            "--config-file",
            file.to_str().unwrap(),
            "--endpoints",
            &endpoint,
        ],
    );
    let python = epp_test_support::process::workspace_root().join(".venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/kv_publisher.py");
    let mut cmd = std::process::Command::new(python);
    cmd.arg(script).args([
        format!("tcp://{ip}:{kv_port}"),
        format!("tcp://{ip}:{replay_port}"),
        format!("kv@{ip}@m"),
    ]);
    let (publisher, _) =
        epp_test_support::process::Proc::spawn("publisher", cmd, "published", dir.join("pub.log"));

    let at = format!("{{endpoint=\"{endpoint}\",outcome=");
    let plugin = "{plugin=\"precise-prefix-cache-producer\"}";
    let decode_error = format!("epp_kv_events_messages_total{at}\"decode_error\"}}");
    let page = page_when(epp.metrics_port, "the garbage message", |page| {
        series(page, &decode_error) >= 1.0
    })
    .await;
    let got = |s: &str| series(&page, s);
    // 0, 1, 3 and 4 live; 2 from the replay socket; 5 undecodable.
    assert_eq!(
        got(&format!("epp_kv_events_messages_total{at}\"applied\"}}")),
        4.0,
        "{page}"
    );
    assert_eq!(
        got(&format!("epp_kv_events_messages_total{at}\"replayed\"}}")),
        1.0,
        "{page}"
    );
    assert_eq!(got(&decode_error), 1.0);
    // Every block chained (byte hashes included): none was an orphan, and
    // the removal named by an integer found its byte-hashed block.
    assert_eq!(
        got(&format!("epp_kv_block_index_blocks_stored_total{plugin}")),
        5.0,
        "{page}"
    );
    assert_eq!(
        got(&format!("epp_kv_block_index_orphan_events_total{plugin}")),
        0.0
    );
    assert_eq!(
        got(&format!("epp_kv_block_index_blocks_removed_total{plugin}")),
        1.0
    );
    // The undecodable batch lost events: what the endpoint held is forgotten.
    assert!(got(&format!("epp_kv_block_index_clears_total{plugin}")) >= 1.0);
    assert_eq!(got(&format!("epp_kv_block_index_keys{plugin}")), 0.0);
    let subscribed = format!("epp_kv_events_subscribed{{endpoint=\"{endpoint}\"}}");
    assert_eq!(got(&subscribed), 1.0, "{page}");
    // The publisher goes away: the gauge says so.
    drop(publisher);
    page_when(epp.metrics_port, "epp_kv_events_subscribed at 0", |page| {
        series(page, &subscribed) == 0.0
    })
    .await;
    assert!(
        epp_test_support::process::Proc::exited(&mut { epp }.proc).is_none(),
        "epp survived the garbage"
    );
}

/// The token producer renders chat requests through the model's chat
/// template in process (`chat_template.jinja` beside its tokenizer), as the
/// engines render them with theirs: a system prompt cached on one engine by
/// a chat request epp never saw draws the chat requests that share it,
/// through Envoy, with no render call to any server.
/// A chat template beside the test tokenizer in `dir`; the simulator
/// arguments that render with it too.
fn with_chat_template(dir: &Path) -> Vec<String> {
    write_template(
        dir,
        "chat_template.jinja",
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content | trim }}\n{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    )
}

/// Writes chat template `source` as `dir/name`, with a `tokenizer_config.json`
/// naming the BOS token; the simulator arguments that render with it.
fn write_template(dir: &Path, name: &str, source: &str) -> Vec<String> {
    let template = dir.join(name);
    std::fs::write(&template, source).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|bos|>"}"#,
    )
    .unwrap();
    vec!["--chat-template".into(), template.to_str().unwrap().into()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_follows_the_engines_blocks_rendered_in_process() {
    let dir = scratch_dir("precise-chat-template");
    let tokenizer = write_test_tokenizer(&dir).unwrap();
    let sim_args = with_chat_template(&dir);
    let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
    let (sims, epp, envoy) = start_fleet(&dir, &tokenizer, &sim_args, &local(&dir)).await;
    let system = "You answer questions about tides and harbours, briefly. ".repeat(6);
    chats_follow(&epp, &envoy, &sims, 1, &system).await;
    drop(envoy);
}

/// Sends eight chat questions after `system` through Envoy at `envoy`; how
/// many went to simulator `on`.
async fn chats_to(envoy: u16, on: usize, system: &str) -> usize {
    let mut n = 0;
    for q in 0..8 {
        let r = http::post_json(
            envoy,
            "/v1/chat/completions",
            &chat(system, &format!("Question {q}?")),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        n += usize::from(r.header("x-inference-pod") == Some(format!("sim-{on}").as_str()));
    }
    n
}

/// Two replicas over one Redis server (`redisConfig`): replica A subscribes
/// to the engines and writes what they hold; replica B, whose subscriptions
/// never connect (as a replica that just started, before any event), routes
/// by what A wrote. Redis killed: B still answers every request, as if
/// nothing matched (its own view is empty). Redis back, empty: A writes its
/// whole view again, and B follows a prompt cached during the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_index_through_redis_across_its_restart() {
    let dir = scratch_dir("precise-redis");
    let tokenizer = write_test_tokenizer(&dir).unwrap();
    let sim_args = with_chat_template(&dir);
    let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
    let mut redis = RedisServer::start(&dir);
    let shared = |kv_port: u16| {
        config_with(&local(&dir), kv_port).replace(
            "    tokenProcessorConfig: {blockSize: 4}\n",
            &format!(
                "    tokenProcessorConfig: {{blockSize: 4}}\n    indexerConfig: \
                 {{kvBlockIndexConfig: {{redisConfig: {{address: '{}', lookupTimeout: 200ms}}}}}}\n",
                redis.url()
            ),
        )
    };
    let http_port = shared_loopback_port();
    let kv_port = free_port_on("127.0.0.2");
    let sims = start_publishers(&dir, &tokenizer, http_port, kv_port, &sim_args);
    let (a, _envoy_a) = start_picker(&dir, &shared(kv_port), http_port).await;
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let nowhere = free_port_on("127.0.0.2");
    let (b, envoy_b) = start_picker(&b_dir, &shared(nowhere), http_port).await;

    // The engine of sim-1 caches the system prompt (a request epp never
    // sees); A hears of it and writes it to Redis.
    let system = "You answer questions about tides and harbours, briefly. ".repeat(6);
    warm_directly(&a, &sims, 1, &system).await;
    redis.wait_for(&["DBSIZE"], Duration::from_secs(10), |out| {
        out.first().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) > 0
    });
    // B never heard an event, and follows the blocks anyway.
    assert_eq!(chats_to(envoy_b.port, 1, &system).await, 8);
    let page = metrics(b.metrics_port).await;
    assert_eq!(
        series(&page, &blocks_series(&at(IPS[1], &sims[1]), "stored")),
        0.0,
        "B heard events"
    );
    assert!(
        series(
            &page,
            "epp_kv_block_index_shared_lookups_total{plugin=\"precise-prefix-cache-producer\"}"
        ) >= 8.0
    );
    // Completions too: B tokenizes their prompts at the edge for the shared
    // lookup (in the cycle, it would be too late to look up there).
    let text = "Tide tables give the times and heights of high and low water. ".repeat(6);
    let endpoint = at(IPS[1], &sims[1]);
    let before = blocks(a.metrics_port, &endpoint, "stored").await;
    complete(IPS[1], sims[1].port, &text, None).await;
    wait_for_blocks(a.metrics_port, &endpoint, "stored", before).await;
    let mut on_1 = 0;
    for q in 0..8 {
        let r = complete(
            "127.0.0.1",
            envoy_b.port,
            &format!("{text}Question {q}?"),
            None,
        )
        .await;
        on_1 += usize::from(r.header("x-inference-pod") == Some("sim-1"));
    }
    assert_eq!(on_1, 8, "completions followed the shared index");

    // Redis dies: every request is still answered (B's own view is empty:
    // no match).
    redis.kill();
    chats_to(envoy_b.port, 1, &system).await;
    let page = metrics(b.metrics_port).await;
    assert!(
        series(
            &page,
            "epp_kv_block_index_shared_unanswered_total{plugin=\"precise-prefix-cache-producer\"}"
        ) >= 8.0,
        "{page}"
    );
    // Meanwhile sim-2's engine caches another prompt: A hears of it but
    // cannot write it.
    let other = "You translate shipping forecasts into plain words. ".repeat(6);
    warm_directly(&a, &sims, 2, &other).await;

    // Back, empty: A writes its whole view again, and B follows it, the
    // prompt cached during the outage included.
    redis.start_again();
    redis.wait_for(&["DBSIZE"], Duration::from_secs(20), |out| {
        out.first().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) > 0
    });
    page_when(b.metrics_port, "B connected again", |page| {
        page.contains(
            "epp_kv_block_index_shared_connected{plugin=\"precise-prefix-cache-producer\"} 1",
        )
    })
    .await;
    assert_eq!(chats_to(envoy_b.port, 2, &other).await, 8);
    drop((a, b));
}

/// Caches `system` on `sims[on]` by a chat request sent to it directly (epp
/// never sees it), and waits for the blocks to reach `epp`.
async fn warm_directly(epp: &Epp, sims: &[Sim], on: usize, system: &str) {
    let endpoint = at(IPS[on], &sims[on]);
    let before = blocks(epp.metrics_port, &endpoint, "stored").await;
    let warm = chat(system, "Warm up.");
    let r = http::post_json_at(IPS[on], sims[on].port, "/v1/chat/completions", &warm)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for_blocks(epp.metrics_port, &endpoint, "stored", before).await;
}

/// llm-d's `vllm` token-producer backend: the prompts are rendered to token
/// ids by the engine's render endpoint (here a simulator with the same
/// tokenizer, as `vllm launch render` would be) before scheduling, so chat
/// requests, which the in-process tokenizer does not render, follow the
/// engines' reported blocks too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_follows_the_engines_blocks_with_the_engine_rendering_prompts() {
    let dir = scratch_dir("precise-render");
    let tokenizer = write_test_tokenizer(&dir).unwrap();
    let render = epp_test_support::process::start_sim(
        &dir,
        9,
        &["--tokenizer", tokenizer.to_str().unwrap()],
    );
    let backend = format!(
        "    vllm: {{url: 'http://127.0.0.1:{}', timeout: 2s}}",
        render.port
    );
    let (sims, epp, envoy) = start_fleet(&dir, &tokenizer, &[], &backend).await;

    let system = "You answer questions about lighthouses, briefly and kindly. ".repeat(6);
    // Only sim-2's events say where the prefix is.
    chats_follow(&epp, &envoy, &sims, 2, &system).await;

    // Token ids sent by the client (vLLM's generate API) are used as they
    // are: warmed directly on sim-0, the same ids follow its blocks.
    let ids: Vec<u32> = (0..120).map(|i| 3 + (i * 37) % 500).collect();
    let generate = |tail: u32| {
        let mut all = ids.clone();
        all.extend([tail, tail + 1]);
        serde_json::json!({"model": MODEL, "token_ids": all, "sampling_params": {"max_tokens": 2}})
    };
    let r = http::post_json_at(
        IPS[0],
        sims[0].port,
        "/inference/v1/generate",
        &generate(900),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for_blocks(epp.metrics_port, &at(IPS[0], &sims[0]), "stored", 0.0).await;
    for q in 0..6 {
        let r = http::post_json(envoy.port, "/inference/v1/generate", &generate(910 + q))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-inference-pod"), Some("sim-0"), "generate {q}");
    }

    // The render service gone: requests are still served (without tokens).
    drop(render);
    let r = http::post_json(
        envoy.port,
        "/v1/chat/completions",
        &chat(&system, "And now?"),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A chat template beside the test tokenizer in `dir`, message contents as
/// strings: the simulators put an `<image>` marker before a message's text
/// for each image part (vLLM's string content format) and expand it into
/// `--mm-tokens` placeholder tokens, as a multimodal model's processor does;
/// the simulator arguments that render so, eight tokens an image.
fn with_media_template(dir: &Path) -> Vec<String> {
    let mut args = write_template(
        dir,
        "media_template.jinja",
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    );
    args.extend(["--mm-tokens".into(), "8".into()]);
    args
}

/// A chat after `system` asking `question` about the image at `url`.
fn image_chat(system: &str, url: &str, question: &str) -> serde_json::Value {
    serde_json::json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": question}]}]})
}

/// Multimodal prompts: an image's placeholder tokens are the same whatever
/// the image, and the engines hash the image's identifier into the blocks
/// they overlap (the simulators as vLLM, in their KV events' extra keys).
/// Two engines cached the same system prompt and question with two
/// different images; each image's requests, rendered by the engine's render
/// endpoint (which reports the images' places), go through Envoy to the
/// engine that cached that image. Before, both engines matched every image
/// alike, and the picks split between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_images_requests_follow_the_blocks_of_that_image() {
    let dir = scratch_dir("precise-media");
    let tokenizer = write_test_tokenizer(&dir).unwrap();
    let sim_args = with_media_template(&dir);
    let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
    let mut render_args = vec!["--tokenizer", tokenizer.to_str().unwrap()];
    render_args.extend_from_slice(&sim_args);
    let render = epp_test_support::process::start_sim(&dir, 9, &render_args);
    let backend = format!(
        "    vllm: {{url: 'http://127.0.0.1:{}', timeout: 2s}}",
        render.port
    );
    let (sims, epp, envoy) = start_fleet(&dir, &tokenizer, &sim_args, &backend).await;

    let system = "You describe pictures of boats and harbours, briefly. ".repeat(4);
    let images = ["http://img/ketch.png", "http://img/schooner.png"];
    for (on, url) in [(1, images[0]), (2, images[1])] {
        let endpoint = at(IPS[on], &sims[on]);
        let before = blocks(epp.metrics_port, &endpoint, "stored").await;
        let warm = image_chat(&system, url, "What is this?");
        let r = http::post_json_at(IPS[on], sims[on].port, "/v1/chat/completions", &warm)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        wait_for_blocks(epp.metrics_port, &endpoint, "stored", before).await;
    }
    for (on, url) in [(1, images[0]), (2, images[1])] {
        for q in 0..6 {
            let r = http::post_json(
                envoy.port,
                "/v1/chat/completions",
                &image_chat(&system, url, "What is this?"),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(
                r.header("x-inference-pod"),
                Some(format!("sim-{on}").as_str()),
                "{url}, request {q}"
            );
        }
    }
    drop((render, envoy));
}

/// llm-d's simulator (llm-d/llm-d-inference-sim, built from its Go module)
/// as two model servers: each publishes its KV-cache events to the socket
/// epp binds (`zmqEndpoint`), naming itself by `POD_IP` in the topic, and
/// renders prompts with its own tokenizer, which the token producer's
/// `vllm` backend asks for (offline it is llm-d's simulated tokenizer, so
/// epp's ids are the engine's only if epp asks the engine). A prefix one
/// server cached for a request epp never routed draws every later request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_ds_simulator_publishes_and_epp_follows_its_blocks() {
    // Not a Hugging Face model: the simulator then never looks one up.
    const LLM_D_MODEL: &str = "epp-test/llm-d-sim";
    let dir = scratch_dir("llm-d-sim-events");
    let kv_port = free_port_on("127.0.0.1");
    let ips = ["127.0.0.2", "127.0.0.3"];
    let ports = [free_port_on("0.0.0.0"), free_port_on("0.0.0.0")];
    let zmq = format!("tcp://127.0.0.1:{kv_port}");
    let sims: Vec<_> = (0..2)
        .map(|i| {
            epp_test_support::reference::start_llm_d_sim(
                &dir,
                &format!("lsim-{i}"),
                ips[i],
                ports[i],
                &[
                    "--model",
                    LLM_D_MODEL,
                    "--enable-kvcache",
                    "--kv-cache-size",
                    "1024",
                    "--block-size",
                    "16",
                    "--zmq-endpoint",
                    &zmq,
                ],
            )
        })
        .collect();
    let config = format!(
        "\
plugins:
- type: token-producer
  parameters:
    modelName: {LLM_D_MODEL}
    vllm: {{url: \"http://{}:{}\"}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: 16}}
    kvEventsConfig: {{zmqEndpoint: \"{zmq}\", discoverPods: false}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
",
        ips[0], ports[0]
    );
    let file = dir.join("precise.yaml");
    std::fs::write(&file, config).unwrap();
    let endpoints = format!("{}:{},{}:{}", ips[0], ports[0], ips[1], ports[1]);
    let epp = start_epp(
        &dir,
        &[
            "--config-file",
            file.to_str().unwrap(),
            "--endpoints",
            &endpoints,
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    let complete_at = |host: &'static str, port: u16, prompt: String| async move {
        let body = serde_json::json!({"model": LLM_D_MODEL, "prompt": prompt, "max_tokens": 2});
        let r = http::post_json_at(host, port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("x-inference-pod").unwrap().to_owned()
    };
    // The simulator's publisher dials epp's socket in the background, and
    // a PUB socket drops what it publishes before then: probe with prompts
    // of their own until epp has seen lsim-1's blocks.
    let lsim1 = format!("{}:{}", ips[1], ports[1]);
    let mut seen = 0.0;
    for probe in 0..100 {
        let words = (0..40)
            .map(|w| format!("probe{probe}word{w}"))
            .collect::<Vec<_>>();
        complete_at(ips[1], ports[1], words.join(" ")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = blocks(epp.metrics_port, &lsim1, "stored").await;
        if seen > 0.0 {
            break;
        }
    }
    assert!(seen > 0.0, "epp never saw a block from lsim-1");
    // Warm lsim-1 DIRECTLY: epp never routes this prompt, so only the
    // engine's events can tell it where the prefix is cached.
    let system = "Every answer starts from the same long system prompt of this application, \
                  written once and sent with every question. "
        .repeat(4);
    complete_at(ips[1], ports[1], format!("{system}Warm up.")).await;
    // Its blocks (two at least) reached epp.
    wait_for_blocks(epp.metrics_port, &lsim1, "stored", seen + 1.0).await;
    for q in 0..8 {
        let pod = complete_at("127.0.0.1", envoy.port, format!("{system}Question {q}?")).await;
        if pod != "lsim-1" {
            let why = http::send(epp.metrics_port, "GET", "/debug/decisions.json", &[], "")
                .await
                .unwrap()
                .text();
            panic!("question {q} went to {pod}, not to lsim-1 which holds its prefix:\n{why}");
        }
    }
    drop((envoy, sims));
}
