//! `epp lora-syncer` end to end: it loads and unloads adapters on a
//! simulator through vLLM's `/v1/load_lora_adapter` and
//! `/v1/unload_lora_adapter` as its config file says, retries the updates
//! the server refuses, follows edits of the file, and reports each
//! adapter's state in `lora_syncer_adapter_status`; a loaded adapter is then
//! served through Envoy and epp. With `--configmap`, the same from a
//! ConfigMap on the real test cluster, read through the API server as a
//! ServiceAccount granted only the documented rules.

use std::{ffi::OsStr, path::Path, process::Command};

use epp_test_support::{
    http,
    kube::{KubeCluster, Ns},
    process::{BodyMode, Proc, Stack, scratch_dir, start_sim, workspace_bin},
    wait::eventually,
};

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn config(port: u16, exist: &[&str], not_exist: &[&str]) -> String {
    let list = |ids: &[&str]| {
        ids.iter()
            .map(|id| format!("    - {{id: {id}, source: /adapters/{id}}}\n"))
            .collect::<String>()
    };
    format!(
        "vLLMLoRAConfig:\n  name: demo\n  host: 127.0.0.1\n  port: {port}\n  defaultBaseModel: {BASE}\n  ensureExist:\n    models:\n{}  ensureNotExist:\n    models:\n{}",
        list(exist),
        list(not_exist)
    )
}

/// The ids the simulator lists on `/v1/models`.
fn served(port: u16) -> Vec<String> {
    let (status, body) = http::get_blocking(port, "/v1/models").unwrap();
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    doc["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

/// `lora_syncer_adapter_status` samples, `adapter=value` sorted.
fn status(port: u16) -> Vec<String> {
    let (code, page) = http::get_blocking(port, "/metrics").unwrap();
    assert_eq!(code, 200, "{page}");
    let mut out: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("lora_syncer_adapter_status{adapter_name=\""))
        .map(|l| l.replace("\"} ", "="))
        .collect();
    out.sort();
    out
}

/// Starts `epp lora-syncer` with its metrics on a free local port,
/// reconciling every `reconcile`, its config from `source` (`--config
/// FILE` or the `--configmap` flags), logging into `dir`; returns it and
/// its metrics port.
fn start_syncer(dir: &Path, reconcile: &str, source: &[&OsStr]) -> (Proc, u16) {
    let mut cmd = Command::new(workspace_bin("epp"));
    cmd.args([
        "lora-syncer",
        "--metrics-port",
        "0",
        "--bind-address",
        "127.0.0.1",
    ])
    .args([
        "--reconcile-trigger",
        reconcile,
        "--health-check-interval",
        "100ms",
    ])
    .args(source);
    let (syncer, line) = Proc::spawn(
        "lora-syncer",
        cmd,
        "lora-syncer listening",
        dir.join("lora-syncer.log"),
    );
    let port = line
        .split("metrics=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no metrics port in {line:?}"));
    (syncer, port)
}

async fn post(port: u16, path: &str, body: &serde_json::Value) -> u16 {
    http::post_json(port, path, body).await.unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_syncer_loads_and_unloads_adapters_as_its_config_says() {
    let stack = Stack::start(
        "lora-syncer",
        1,
        &["--max-loras", "4"],
        &[],
        BodyMode::Streamed,
    );
    let sim = stack.sims[0].port;
    // Already on the server, and unwanted: the syncer unloads it.
    let old = serde_json::json!({"lora_name": "old-lora", "lora_path": "/adapters/old"});
    assert_eq!(post(sim, "/v1/load_lora_adapter", &old).await, 200);
    // The next four updates fail: the first adapter's three attempts and the
    // second's first; the first is loaded at the next reconcile.
    let fail = serde_json::json!({"fail_lora_updates": 4});
    assert_eq!(post(sim, "/admin/state", &fail).await, 200);

    let file = stack.dir.join("lora-config.yaml");
    std::fs::write(
        &file,
        config(sim, &["sql-lora", "chat-lora"], &["old-lora"]),
    )
    .unwrap();
    let (syncer, metrics) = start_syncer(&stack.dir, "1s", &["--config".as_ref(), file.as_ref()]);

    let want = ["chat-lora=1", "old-lora=0", "sql-lora=1"];
    eventually(
        "both adapters loaded, the unwanted one unloaded",
        || async { status(metrics) == want },
    )
    .await;
    let mut ids = served(sim);
    ids.sort();
    assert_eq!(ids, ["chat-lora", BASE, "sql-lora"]);
    let log = std::fs::read_to_string(stack.dir.join("lora-syncer.stderr")).unwrap_or_default();
    assert!(
        log.contains("cannot load; retried at the next reconcile"),
        "the refused updates were logged:\n{log}"
    );

    // A loaded adapter is served through Envoy and epp.
    let ask = serde_json::json!({"model": "sql-lora", "prompt": "select", "max_tokens": 2});
    let r = http::post_json(stack.envoy.port, "/v1/completions", &ask)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // An edit: chat-lora is no longer wanted.
    std::fs::write(
        &file,
        config(sim, &["sql-lora"], &["old-lora", "chat-lora"]),
    )
    .unwrap();
    eventually("chat-lora unloaded", || async {
        status(metrics) == ["chat-lora=0", "old-lora=0", "sql-lora=1"]
    })
    .await;
    assert!(!served(sim).contains(&"chat-lora".to_owned()));

    // An adapter the server lost (a restart) is loaded again by the periodic
    // reconcile, without any edit.
    let unload = serde_json::json!({"lora_name": "sql-lora"});
    assert_eq!(post(sim, "/v1/unload_lora_adapter", &unload).await, 200);
    eventually("sql-lora loaded again", || async {
        served(sim).contains(&"sql-lora".to_owned())
            && status(metrics).contains(&"sql-lora=1".to_owned())
    })
    .await;
    drop(syncer);
}

/// Applies the ConfigMap `name` of `ns` with `config` under `key`.
async fn apply_configmap(ns: &Ns, name: &str, key: &str, config: &str) {
    ns.apply_manifest(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {key: config},
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_syncer_follows_a_configmap_through_the_api_server() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "e2e-lora").await;
    // The rules docs/operations.md lists, for the `restricted` user only.
    ns.apply_manifest(&serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "lora-syncer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "verbs": ["get", "list", "watch"]}],
    }))
    .await;
    ns.apply_manifest(&serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "lora-syncer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "lora-syncer"},
        "subjects": [{"kind": "User", "name": "system:serviceaccount:default:restricted"}],
    }))
    .await;
    let dir = scratch_dir("lora-syncer-configmap");
    let sim = start_sim(&dir, 0, &["--max-loras", "4"]);
    // Not there yet: the syncer starts anyway and waits for it.
    let configmap = format!("{}/adapters", ns.name);
    let kubeconfig = cluster.kubeconfig_for("restricted");
    let (syncer, metrics) = start_syncer(
        &dir,
        "30s",
        &[
            "--configmap".as_ref(),
            configmap.as_ref(),
            "--configmap-key".as_ref(),
            "lora.yaml".as_ref(),
            "--kubeconfig".as_ref(),
            kubeconfig.as_ref(),
        ],
    );
    let log = dir.join("lora-syncer.stderr");
    let logged = |what: &'static str| {
        let log = log.clone();
        move || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            std::future::ready(text.contains(what))
        }
    };
    eventually("the missing ConfigMap logged", logged("no such ConfigMap")).await;
    apply_configmap(
        &ns,
        "adapters",
        "lora.yaml",
        &config(sim.port, &["sql-lora"], &[]),
    )
    .await;
    eventually("sql-lora loaded from the ConfigMap", || async {
        status(metrics) == ["sql-lora=1"]
    })
    .await;
    // An edit is applied when the watch sees it: well before the 30 s
    // periodic reconcile.
    let edited = config(sim.port, &["chat-lora"], &["sql-lora"]);
    apply_configmap(&ns, "adapters", "lora.yaml", &edited).await;
    eventually("the edit applied", || async {
        status(metrics) == ["chat-lora=1", "sql-lora=0"]
    })
    .await;
    let mut ids = served(sim.port);
    ids.sort();
    assert_eq!(ids, ["chat-lora", BASE]);
    // A ConfigMap without the key, then an invalid one: both keep the last
    // good config, each logged.
    apply_configmap(&ns, "adapters", "other.yaml", &edited).await;
    eventually("the missing key logged", logged("has no such key")).await;
    ns.apply_manifest(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "adapters"},
        "data": {"lora.yaml": "vLLMLoRAConfig:\n  prot: 1\n"},
    }))
    .await;
    eventually("the invalid config logged", logged("unknown field `prot`")).await;
    assert_eq!(status(metrics), ["chat-lora=1", "sql-lora=0"]);
    drop(syncer);
}
