//! `epp lora-syncer`: keeps a vLLM server's LoRA adapters as a config file
//! (a mounted ConfigMap, in the reference sidecar's format) says, through
//! vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`, and serves
//! `lora_syncer_adapter_status{adapter_name}` (1 loaded, 0 not) on its
//! metrics port (8080).
//!
//! The config, the reference's `vLLMLoRAConfig`:
//! ```yaml
//! vLLMLoRAConfig:
//!   host: localhost            # the model server (default localhost:8000)
//!   port: 8000
//!   defaultBaseModel: meta-llama/Llama-3.1-8B-Instruct
//!   ensureExist:
//!     models:
//!     - {id: sql-lora, source: /adapters/sql}
//!   ensureNotExist:
//!     models:
//!     - {id: old-lora, source: /adapters/old}
//! ```
//! The file is read every second: a change is applied at once, and every
//! `--reconcile-trigger` the server is reconciled anyway, so a failed load
//! or unload (or an adapter the server lost in a restart) is retried. A file
//! that does not parse keeps the last good config (logged once).
//!
//! With `--configmap [NAMESPACE/]NAME` the config is the ConfigMap's
//! `--configmap-key` entry, read through the API server instead of a mounted
//! volume: the syncer watches that one ConfigMap (RBAC: `get`, `list`,
//! `watch` on `configmaps` in its namespace), so an edit is applied as soon
//! as the API server has it, not after the kubelet's volume refresh (up to
//! a minute or more). A ConfigMap that is missing, deleted, lacks the key,
//! or cannot be watched keeps the last good config, as a bad file does.

use std::{
    collections::BTreeSet,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::ConfigMap;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::Deserialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use crate::args::parse_duration;

/// `epp lora-syncer`: loads and unloads a vLLM server's LoRA adapters as a
/// config file says.
#[derive(Debug, Clone, Parser)]
#[command(name = "epp lora-syncer", version)]
pub(crate) struct SyncerArgs {
    /// The desired adapters (the reference's `vLLMLoRAConfig` YAML; a
    /// mounted ConfigMap). Default: `$DYNAMIC_LORA_ROLLOUT_CONFIG`, else
    /// `/config/configmap.yaml`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Port of `GET /metrics` (`lora_syncer_adapter_status`); 0 = any free port.
    #[arg(long, default_value_t = 8080)]
    metrics_port: u16,
    /// Address the metrics server binds to.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: IpAddr,
    /// Reconcile at least this often even when the file did not change
    /// (retries failed updates); `5s`, or bare seconds as the reference.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    reconcile_trigger: Duration,
    /// How long a reconcile waits for the server's `/health` to answer 200.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    health_check_timeout: Duration,
    /// Between two health probes.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    health_check_interval: Duration,
    /// Read the config from this ConfigMap (`NAME`, or `NAMESPACE/NAME`;
    /// the namespace defaults to `$POD_NAMESPACE`, else the pod's service
    /// account namespace, else `default`) through the API server instead
    /// of a file.
    #[arg(long, conflicts_with = "config")]
    configmap: Option<String>,
    /// The ConfigMap's key holding the config.
    #[arg(long, default_value = "configmap.yaml")]
    configmap_key: String,
    /// Kubeconfig for `--configmap` (default: `$KUBECONFIG`, `~/.kube/config`,
    /// or the pod's service account).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Accepted for the reference's flag; the config is always validated
    /// (unknown keys and missing fields are errors).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    config_validation: bool,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(rename = "vLLMLoRAConfig")]
    config: LoraConfig,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LoraConfig {
    #[serde(default)]
    name: Option<String>,
    #[serde(default = "default_host")]
    host: String,
    #[serde(default = "default_port")]
    port: u16,
    #[serde(default)]
    default_base_model: Option<String>,
    #[serde(default)]
    ensure_exist: Option<ModelList>,
    #[serde(default)]
    ensure_not_exist: Option<ModelList>,
}

fn default_host() -> String {
    "localhost".to_owned()
}
const fn default_port() -> u16 {
    8000
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct ModelList {
    models: Vec<Adapter>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct Adapter {
    id: String,
    source: String,
    #[serde(default, rename = "base-model")]
    base_model: Option<String>,
}

impl LoraConfig {
    fn parse(text: &str) -> Result<Self, String> {
        let file: ConfigFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let c = file.config;
        for a in c.wanted().chain(c.unwanted()) {
            if a.id.trim().is_empty() {
                return Err("an adapter's id is empty".to_owned());
            }
        }
        Ok(c)
    }

    fn wanted(&self) -> impl Iterator<Item = &Adapter> {
        self.ensure_exist.iter().flat_map(|l| &l.models)
    }

    fn unwanted(&self) -> impl Iterator<Item = &Adapter> {
        self.ensure_not_exist.iter().flat_map(|l| &l.models)
    }

    /// Adapters to load and to unload; one named in both lists is neither.
    fn plan(&self) -> (Vec<&Adapter>, Vec<&Adapter>, Vec<&str>) {
        let wanted: BTreeSet<&str> = self.wanted().map(|a| a.id.as_str()).collect();
        let unwanted: BTreeSet<&str> = self.unwanted().map(|a| a.id.as_str()).collect();
        let both = wanted.intersection(&unwanted).copied().collect();
        let load = self
            .wanted()
            .filter(|a| !unwanted.contains(a.id.as_str()))
            .collect();
        let unload = self
            .unwanted()
            .filter(|a| !wanted.contains(a.id.as_str()))
            .collect();
        (load, unload, both)
    }

    fn server(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// `adapter_name`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdapterLabels {
    adapter_name: String,
}

/// One HTTP/1.0 exchange with the model server (plain HTTP: the sidecar
/// and the server share the pod); the status and the body.
async fn call(server: &str, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
    let exchange = async {
        let mut s = TcpStream::connect(server).await?;
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: {server}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).await?;
        anyhow::Ok(reply)
    };
    let reply = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .context("no answer within 30 s")??;
    let text = String::from_utf8_lossy(&reply);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("not an HTTP response")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The ids the server lists on `/v1/models` (the base model and adapters).
async fn served(server: &str) -> Result<BTreeSet<String>> {
    let (status, body) = call(server, "GET", "/v1/models", None).await?;
    anyhow::ensure!(status == 200, "/v1/models answered {status}: {body}");
    let doc: serde_json::Value = serde_json::from_str(&body).context("/v1/models: not JSON")?;
    Ok(doc["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect())
}

/// Tries `attempts` times, waiting longer after each failure.
async fn with_retries(what: &str, attempts: u32, f: impl AsyncFn() -> Result<()>) -> Result<()> {
    let mut last = None;
    for attempt in 1..=attempts {
        match f().await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::debug!(attempt, error = %e, "{what} failed");
                last = Some(e);
                if attempt < attempts {
                    tokio::time::sleep(Duration::from_millis(200) * attempt).await;
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("{what}: no attempt")))
}

/// Posts `body` to `path` on `server` (vLLM's adapter load or unload),
/// three tries; anything but 200 is a failure.
async fn update(server: &str, path: &str, body: &serde_json::Value) -> Result<()> {
    let body = body.to_string();
    with_retries(path, 3, async || {
        let (status, text) = call(server, "POST", path, Some(&body)).await?;
        anyhow::ensure!(status == 200, "answered {status}: {}", text.trim());
        Ok(())
    })
    .await
}

struct Syncer {
    args: SyncerArgs,
    status: Family<AdapterLabels, Gauge>,
    /// Adapters with a status series (so ones dropped from the config lose it).
    tracked: BTreeSet<String>,
}

impl Syncer {
    async fn healthy(&self, server: &str) -> bool {
        let start = Instant::now();
        loop {
            if matches!(call(server, "GET", "/health", None).await, Ok((200, _))) {
                return true;
            }
            if start.elapsed() >= self.args.health_check_timeout {
                return false;
            }
            tokio::time::sleep(self.args.health_check_interval).await;
        }
    }

    /// Brings the server to `config`; failures are logged and left to the
    /// next reconcile. The status gauges follow what the server lists after.
    async fn reconcile(&mut self, config: &LoraConfig) {
        let server = config.server();
        if !self.healthy(&server).await {
            tracing::error!(server, "model server not healthy; nothing changed");
            return;
        }
        let (load, unload, both) = config.plan();
        if !both.is_empty() {
            tracing::warn!(adapters = ?both, "in both ensureExist and ensureNotExist: skipped");
        }
        let present = match served(&server).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(server, error = %e, "cannot list the server's models");
                return;
            }
        };
        for a in load.iter().filter(|a| !present.contains(&a.id)) {
            let base = a.base_model.as_ref().or(config.default_base_model.as_ref());
            let mut body = serde_json::json!({"lora_name": a.id, "lora_path": a.source});
            if let Some(b) = base {
                body["base_model_name"] = serde_json::Value::from(b.as_str());
            }
            match update(&server, "/v1/load_lora_adapter", &body).await {
                Ok(()) => tracing::info!(adapter = a.id, source = a.source, "loaded"),
                Err(e) => {
                    tracing::error!(adapter = a.id, error = %e, "cannot load; retried at the next reconcile")
                }
            }
        }
        for a in unload.iter().filter(|a| present.contains(&a.id)) {
            let body = serde_json::json!({"lora_name": a.id});
            match update(&server, "/v1/unload_lora_adapter", &body).await {
                Ok(()) => tracing::info!(adapter = a.id, "unloaded"),
                Err(e) => {
                    tracing::error!(adapter = a.id, error = %e, "cannot unload; retried at the next reconcile")
                }
            }
        }
        // What the server says now, not what the calls answered.
        let present = match served(&server).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(server, error = %e, "cannot list the server's models");
                return;
            }
        };
        let configured: BTreeSet<String> = config
            .wanted()
            .chain(config.unwanted())
            .map(|a| a.id.clone())
            .collect();
        for gone in self.tracked.difference(&configured) {
            self.status.remove(&AdapterLabels {
                adapter_name: gone.clone(),
            });
        }
        for id in &configured {
            self.status
                .get_or_create(&AdapterLabels {
                    adapter_name: id.clone(),
                })
                .set(i64::from(present.contains(id)));
        }
        self.tracked = configured;
    }
}

/// Where the desired adapters are read from.
enum Source {
    /// A file (a mounted ConfigMap), read at every poll.
    File(PathBuf),
    /// A ConfigMap's key, as a watch of the API server last saw it (None
    /// until its first list).
    ConfigMap {
        what: String,
        latest: tokio::sync::watch::Receiver<Option<Result<String, String>>>,
    },
}

impl Source {
    /// `--configmap` and `--configmap-key`, or the file.
    async fn from_args(args: &SyncerArgs) -> Result<Self> {
        let Some(cm) = &args.configmap else {
            let path = args.config.clone().unwrap_or_else(|| {
                std::env::var_os("DYNAMIC_LORA_ROLLOUT_CONFIG")
                    .map_or_else(|| PathBuf::from("/config/configmap.yaml"), PathBuf::from)
            });
            return Ok(Self::File(path));
        };
        let (namespace, name) = match cm.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (own_namespace(), cm.clone()),
        };
        anyhow::ensure!(
            !namespace.is_empty() && !name.is_empty() && !name.contains('/'),
            "--configmap {cm:?}: expected NAME or NAMESPACE/NAME"
        );
        let client = epp_datalayer::kubernetes::client(args.kubeconfig.as_deref()).await?;
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &namespace);
        let what = format!("configmap {namespace}/{name} key {}", args.configmap_key);
        let (tx, latest) = tokio::sync::watch::channel(None);
        tokio::spawn(watch_configmap(
            api,
            name,
            args.configmap_key.clone(),
            what.clone(),
            tx,
        ));
        Ok(Self::ConfigMap { what, latest })
    }

    /// What is read, for logs.
    fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::ConfigMap { what, .. } => what.clone(),
        }
    }

    /// The config's text now, or why there is none (None: not read yet).
    fn read(&self) -> Option<Result<String, String>> {
        match self {
            Self::File(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display())),
            ),
            Self::ConfigMap { latest, .. } => latest.borrow().clone(),
        }
    }

    /// Resolves when the text may have changed before the next poll (never
    /// for a file: it is polled).
    async fn changed(&mut self) {
        match self {
            Self::File(_) => std::future::pending().await,
            Self::ConfigMap { latest, .. } => {
                if latest.changed().await.is_err() {
                    // The watch ended (it does not, short of shutdown).
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// The namespace the syncer runs in: `$POD_NAMESPACE`, else its service
/// account's, else `default`.
fn own_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

/// Keeps `tx` at the text of `key` in ConfigMap `name`, or why not, for as
/// long as the syncer runs (the watch re-lists after errors, backing off).
async fn watch_configmap(
    api: kube::Api<ConfigMap>,
    name: String,
    key: String,
    what: String,
    tx: tokio::sync::watch::Sender<Option<Result<String, String>>>,
) {
    use kube::runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    };
    use tokio_stream::StreamExt;
    let text_of = |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get(&key))
            .cloned()
            .ok_or_else(|| format!("{what}: the ConfigMap has no such key"))
    };
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    // Whether the list in progress found the ConfigMap.
    let mut listed = false;
    while let Some(event) = events.next().await {
        let update = match event {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitApply(cm)) => {
                listed = true;
                text_of(&cm)
            }
            Ok(Event::InitDone) if listed => continue,
            Ok(Event::InitDone) => Err(format!("{what}: no such ConfigMap")),
            Ok(Event::Apply(cm)) => text_of(&cm),
            Ok(Event::Delete(_)) => Err(format!("{what}: the ConfigMap was deleted")),
            Err(e) => Err(format!("{what}: {e}")),
        };
        let _previous = tx.send_replace(Some(update));
    }
}

async fn serve_metrics(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let registry = Arc::clone(&registry);
                async move {
                    let mut r = Response::new(Full::new(Bytes::new()));
                    if req.uri().path() == "/metrics" {
                        let mut text = String::new();
                        if encode(&mut text, &registry).is_ok() {
                            *r.body_mut() = Full::new(Bytes::from(text));
                            r.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static(
                                    "text/plain; version=0.0.4; charset=utf-8",
                                ),
                            );
                        } else {
                            *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                        }
                    } else {
                        *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                    }
                    Ok::<_, Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Runs the syncer until SIGTERM or SIGINT.
pub(crate) async fn run(args: SyncerArgs) -> Result<()> {
    let mut source = Source::from_args(&args).await?;
    if !args.config_validation {
        tracing::warn!("--config-validation=false: epp validates the config anyway");
    }
    let mut registry = Registry::default();
    let status = Family::<AdapterLabels, Gauge>::default();
    registry.register(
        "lora_syncer_adapter_status",
        "Status of LoRA adapters (1=loaded, 0=not_loaded), as the model server lists them",
        status.clone(),
    );
    let addr = SocketAddr::new(args.bind_address, args.metrics_port);
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    // Tests and scripts wait for this line; it carries the real port when 0 was asked.
    println!(
        "lora-syncer listening: metrics={} config={}",
        listener.local_addr()?,
        source.describe()
    );
    tokio::spawn(serve_metrics(listener, Arc::new(registry)));

    let mut syncer = Syncer {
        args,
        status,
        tracked: BTreeSet::new(),
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut last_text: Option<String> = None;
    let mut config: Option<LoraConfig> = None;
    let mut last_error: Option<String> = None;
    let mut last_reconcile: Option<Instant> = None;
    let poll = syncer.args.reconcile_trigger.min(Duration::from_secs(1));
    loop {
        let text = source.read();
        let changed = match &text {
            None => false,
            Some(Ok(t)) if last_text.as_deref() != Some(t.as_str()) => {
                last_text = Some(t.clone());
                match LoraConfig::parse(t) {
                    Ok(c) => {
                        tracing::info!(
                            name = c.name.as_deref().unwrap_or(""),
                            server = c.server(),
                            "config loaded"
                        );
                        config = Some(c);
                        last_error = None;
                        true
                    }
                    Err(e) => {
                        let e = format!("{}: {e}", source.describe());
                        tracing::error!(error = %e, "invalid config; keeping the last good one");
                        last_error = Some(e);
                        false
                    }
                }
            }
            Some(Ok(_)) => false,
            Some(Err(e)) => {
                if last_error.as_ref() != Some(e) {
                    tracing::error!(error = %e, "keeping the last good config");
                    last_error = Some(e.clone());
                }
                false
            }
        };
        let due = last_reconcile.is_none_or(|t| t.elapsed() >= syncer.args.reconcile_trigger);
        if let Some(c) = &config
            && (changed || due)
        {
            syncer.reconcile(c).await;
            last_reconcile = Some(Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = source.changed() => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    tracing::info!("lora-syncer stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_config_parses_and_plans() {
        let c = LoraConfig::parse(
            "vLLMLoRAConfig:\n  name: demo\n  port: 8001\n  defaultBaseModel: base\n  ensureExist:\n    models:\n    - {id: a, source: /a}\n    - {id: both, source: /b, base-model: other}\n  ensureNotExist:\n    models:\n    - {id: gone, source: /g}\n    - {id: both, source: /b}\n",
        )
        .unwrap();
        assert_eq!(c.server(), "localhost:8001");
        let (load, unload, both) = c.plan();
        assert_eq!(
            load.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(
            unload.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
            ["gone"]
        );
        assert_eq!(both, ["both"]);
    }

    #[test]
    fn mistakes_are_errors_with_their_place() {
        let e = LoraConfig::parse("vLLMLoRAConfig:\n  ensureExist:\n    models:\n    - {id: a}\n")
            .unwrap_err();
        assert!(e.contains("source"), "{e}");
        let e = LoraConfig::parse("vLLMLoRAConfig:\n  prot: 8000\n").unwrap_err();
        assert!(e.contains("prot") && e.contains("line 2"), "{e}");
        assert!(
            LoraConfig::parse(
                "vLLMLoRAConfig:\n  ensureExist:\n    models:\n    - {id: ' ', source: /a}\n"
            )
            .is_err()
        );
    }

    #[test]
    fn flags_take_the_reference_syntax() {
        let a = SyncerArgs::try_parse_from([
            "epp lora-syncer",
            "--reconcile-trigger",
            "10",
            "--health-check-timeout",
            "600",
            "--config",
            "/tmp/c.yaml",
        ])
        .unwrap();
        assert_eq!(a.reconcile_trigger, Duration::from_secs(10));
        assert_eq!(a.health_check_timeout, Duration::from_secs(600));
        assert_eq!(a.metrics_port, 8080);
    }
}
