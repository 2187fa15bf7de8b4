//! Discovery without Kubernetes: a static list, or a YAML file of endpoints
//! watched for changes. (Kubernetes InferencePool discovery,
//! [`crate::kubernetes::KubernetesDiscovery`], is another source writing into
//! the same [`EndpointStore`].)

use std::{
    collections::BTreeMap,
    fmt,
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use prometheus_client::{metrics::counter::Counter, registry::Registry};
use tokio_util::sync::CancellationToken;

use crate::{EndpointSpec, EndpointStore, Error, Result, parse_endpoint_list};

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    address: IpAddr,
    port: u16,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// An entry of llm-d's `file-discovery` file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LlmdEntry {
    #[serde(default)]
    name: Option<String>,
    /// Accepted; endpoints are named by `name` alone, as pods are.
    #[serde(default, rename = "namespace")]
    _namespace: Option<String>,
    address: IpAddr,
    port: LlmdPort,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// llm-d writes the port as a string; a number is accepted too.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum LlmdPort {
    Number(u16),
    Text(String),
}

/// llm-d's `file-discovery` file: `{endpoints: [...]}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LlmdFile {
    #[serde(default)]
    endpoints: Vec<LlmdEntry>,
}

/// Parses an endpoints file: a YAML list of `{address, port, labels}`, or
/// llm-d's `file-discovery` shape `{endpoints: [{name, namespace, address,
/// port, labels}]}` (port a string or a number; `name` names the endpoint).
///
/// # Errors
/// Unreadable YAML or entries, with the location serde reports; a port
/// that is not a number from 1 to 65535.
pub fn parse_endpoints_file(text: &str, path: &str) -> Result<Vec<EndpointSpec>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let looks_llmd =
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text).is_ok_and(|v| v.is_mapping());
    if looks_llmd {
        let file: LlmdFile = serde_yaml_ng::from_str(text).map_err(|e| Error::EndpointsFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        return file
            .endpoints
            .into_iter()
            .map(|e| {
                let port = match &e.port {
                    LlmdPort::Number(p) => Some(*p),
                    LlmdPort::Text(t) => t.trim().parse::<u16>().ok(),
                }
                .filter(|&p| p > 0)
                .ok_or_else(|| Error::EndpointsFile {
                    path: path.to_owned(),
                    reason: format!("endpoint {:?}: port {:?} is not 1-65535", e.name, e.port),
                })?;
                let name = e.name.filter(|n| !n.is_empty()).map(Arc::<str>::from);
                Ok(EndpointSpec {
                    addr: (e.address, port).into(),
                    labels: e.labels,
                    name,
                })
            })
            .collect();
    }
    let entries: Vec<FileEntry> = serde_yaml_ng::from_str(text).map_err(|e| {
        let reason = e.to_string();
        match e.location() {
            // `file:line:column: why`, the form editors and terminals link.
            Some(at) => {
                let suffix = format!(" at line {} column {}", at.line(), at.column());
                Error::EndpointsFile {
                    path: format!("{path}:{}:{}", at.line(), at.column()),
                    reason: reason.strip_suffix(&suffix).unwrap_or(&reason).to_owned(),
                }
            }
            None => Error::EndpointsFile {
                path: path.to_owned(),
                reason,
            },
        }
    })?;
    Ok(entries
        .into_iter()
        .map(|e| EndpointSpec {
            addr: (e.address, e.port).into(),
            labels: e.labels,
            name: None,
        })
        .collect())
}

/// A way of learning the endpoint set (a static list, a watched file, a
/// Kubernetes InferencePool). Each discovery owns one named part of the
/// [`EndpointStore`] and keeps it in step until stopped.
pub trait Discovery: Send + Sync + fmt::Debug {
    /// The name of the store part this discovery writes.
    fn source_name(&self) -> String;

    /// Publishes the first endpoint set before returning (an error here is
    /// fatal to the caller), then keeps it up to date on the current tokio
    /// runtime until `stop` is cancelled. A source that needs the network for
    /// its first set (Kubernetes) starts following here and offers its own
    /// way to wait for it.
    ///
    /// # Errors
    /// When the first set cannot be obtained.
    fn start(&self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()>;

    /// Registers this discovery's own metrics (none by default).
    fn register_metrics(&self, registry: &mut Registry) {
        let _ = registry;
    }
}

/// A fixed list of endpoints (`--endpoints ip:port,...`).
#[derive(Debug, Clone)]
pub struct StaticDiscovery {
    name: String,
    endpoints: Vec<EndpointSpec>,
}

impl StaticDiscovery {
    /// The endpoints of a comma-separated `ip:port` list (or several items).
    ///
    /// # Errors
    /// The first item that is not `ip:port`.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self> {
        let split: Vec<&str> = items.iter().flat_map(|s| s.as_ref().split(',')).collect();
        Ok(Self::new(parse_endpoint_list(&split)?))
    }

    /// A fixed set.
    #[must_use]
    pub fn new(endpoints: Vec<EndpointSpec>) -> Self {
        Self {
            name: "static".into(),
            endpoints,
        }
    }

    /// Names the store part (default `static`).
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl Discovery for StaticDiscovery {
    fn source_name(&self) -> String {
        self.name.clone()
    }

    fn start(&self, store: Arc<EndpointStore>, _stop: CancellationToken) -> Result<()> {
        store.replace_source(&self.name, self.endpoints.clone());
        Ok(())
    }
}

/// Watches a YAML endpoints file and keeps its part of the store in step.
///
/// The file's identity, modification time and length are checked every poll
/// interval (default 50 ms, one `stat`); the content is re-read when they
/// change and at least once a second, so an edit that keeps all three is
/// still seen. Both in-place writes and editors that write a new file and
/// rename it over the old one are followed.
///
/// A file can be read while it is being written. So a changed content is
/// applied only once a second read, a short moment later, finds the same
/// bytes; and only a file that parses replaces the endpoint set. An empty
/// file (write `[]` to remove every endpoint), a missing one or invalid YAML
/// keeps the last good set: the problem is logged once per change of state
/// (with `file:line:column` for YAML errors) and counted in
/// [`FileDiscovery::errors`].
#[derive(Debug, Clone)]
pub struct FileDiscovery {
    path: PathBuf,
    poll: Duration,
    errors: Counter,
}

/// How often the content is re-read even when `stat` shows no change.
const FULL_READ_EVERY: Duration = Duration::from_secs(1);

/// What identifies one version of the file without reading it.
type Stamp = Option<(SystemTime, u64, u64)>;

/// The watcher's view of the file.
#[derive(Debug)]
struct Watch {
    /// The content the store holds (last good parse).
    applied: String,
    /// How many endpoints it lists.
    applied_len: usize,
    /// What a read found that differs from `applied`, waiting to be found
    /// again before it is used (content, or why it could not be read).
    pending: Option<Result<String, String>>,
    /// The problem currently reported, if any (logged when it changes).
    problem: Option<String>,
}

impl FileDiscovery {
    /// Watches `path`, checking every 50 ms.
    #[must_use]
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            poll: Duration::from_millis(50),
            errors: Counter::default(),
        }
    }

    /// Sets how often the file is checked; a change is applied within two
    /// intervals.
    #[must_use]
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }

    /// Versions of the file rejected so far (unreadable, empty or invalid),
    /// each counted once however long it stays.
    #[must_use]
    pub fn errors(&self) -> u64 {
        self.errors.get()
    }

    fn shown(&self) -> String {
        self.path.display().to_string()
    }

    fn read(&self) -> Result<String> {
        std::fs::read_to_string(&self.path).map_err(|e| Error::EndpointsFile {
            path: self.shown(),
            reason: e.to_string(),
        })
    }

    fn stamp(&self) -> Stamp {
        let meta = std::fs::metadata(&self.path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Some((meta.modified().ok()?, meta.len(), inode))
    }

    /// Loads the file now (an error here is fatal to the caller) and then
    /// follows its changes until `stop` (see [`FileDiscovery`]).
    ///
    /// # Errors
    /// When the file cannot be read or parsed the first time.
    pub fn spawn(self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()> {
        let source = self.source_name();
        let mut stamp = self.stamp();
        let text = self.read()?;
        let first = parse_endpoints_file(&text, &self.shown())?;
        let mut watch = Watch {
            applied_len: first.len(),
            applied: text,
            pending: None,
            problem: None,
        };
        store.replace_source(&source, first);
        // A second look at changed content, soon but not in the same instant.
        let settle = (self.poll / 4).max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut last_read = tokio::time::Instant::now();
            let mut wait = self.poll;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                wait = self.poll;
                let now_stamp = self.stamp();
                if now_stamp == stamp
                    && watch.pending.is_none()
                    && last_read.elapsed() < FULL_READ_EVERY
                {
                    continue;
                }
                stamp = now_stamp;
                last_read = tokio::time::Instant::now();
                if self.step(&mut watch, &store, &source) {
                    wait = settle;
                }
            }
        });
        Ok(())
    }

    /// One look at the file. Returns whether a change awaits a second look.
    fn step(&self, watch: &mut Watch, store: &EndpointStore, source: &str) -> bool {
        let seen = self.read().map_err(|e| e.to_string());
        if seen.as_ref().is_ok_and(|text| *text == watch.applied) {
            watch.pending = None;
            self.report(watch, None);
            return false;
        }
        if watch.pending.as_ref() != Some(&seen) {
            // Half written, or being replaced: act only if it stays so.
            watch.pending = Some(seen);
            return true;
        }
        watch.pending = None;
        let problem = match seen {
            Err(why) => Some(why),
            Ok(text) if text.trim().is_empty() => Some(format!(
                "endpoints file {}: empty (write `[]` to remove every endpoint)",
                self.shown()
            )),
            Ok(text) => match parse_endpoints_file(&text, &self.shown()) {
                Ok(specs) => {
                    tracing::info!(file = %self.path.display(), endpoints = specs.len(), "endpoints file changed");
                    watch.applied_len = specs.len();
                    store.replace_source(source, specs);
                    watch.applied = text;
                    None
                }
                Err(e) => Some(e.to_string()),
            },
        };
        self.report(watch, problem);
        false
    }

    /// Logs a change of state (a new problem, or recovery) once.
    fn report(&self, watch: &mut Watch, problem: Option<String>) {
        if problem == watch.problem {
            return;
        }
        match &problem {
            Some(why) => {
                self.errors.inc();
                let kept = watch.applied_len;
                tracing::error!(error = %why, kept, "endpoints file rejected; keeping the last good endpoints");
            }
            None => tracing::info!(file = %self.path.display(), "endpoints file readable again"),
        }
        watch.problem = problem;
    }
}

impl Discovery for FileDiscovery {
    fn source_name(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn start(&self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()> {
        self.clone().spawn(store, stop)
    }

    fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "epp_endpoints_file_errors",
            "Versions of the endpoints file rejected (unreadable, empty or invalid YAML); the last good endpoints were kept",
            self.errors.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_format() {
        let text = "- address: 10.0.0.1\n  port: 8000\n  labels: {llm-d.ai/engine-type: sglang}\n- {address: '::1', port: 9}\n";
        let specs = parse_endpoints_file(text, "e.yaml").unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].labels["llm-d.ai/engine-type"], "sglang");
        assert_eq!(specs[1].addr.to_string(), "[::1]:9");
        let err = parse_endpoints_file("- {address: nope, port: 1}\n", "e.yaml").unwrap_err();
        assert!(
            err.to_string().starts_with("endpoints file e.yaml:"),
            "{err}"
        );
        assert!(parse_endpoints_file("- {address: 1.1.1.1, port: 1, extra: 2}\n", "e").is_err());
        let err = parse_endpoints_file(
            "- {address: 10.0.0.1, port: 1}\n- {address: 10.0.0.2, port: x}\n",
            "e.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("endpoints file e.yaml:2:"), "{err}");
        assert!(
            !err.contains(" at line "),
            "the location is said once: {err}"
        );
        assert_eq!(parse_endpoints_file("[]", "e").unwrap(), Vec::new());
    }

    /// llm-d's `file-discovery` shape: `{endpoints: [...]}`, port a string.
    #[test]
    fn llm_d_file_format() {
        let text = "endpoints:\n- name: vllm-0\n  namespace: ns\n  address: 10.0.0.1\n  port: \"8000\"\n  \
                    labels: {llm-d.ai/role: decode}\n- {name: vllm-1, address: 10.0.0.2, port: 8001}\n";
        let specs = parse_endpoints_file(text, "e.yaml").unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].addr.to_string(), "10.0.0.1:8000");
        assert_eq!(specs[0].name.as_deref(), Some("vllm-0"));
        assert_eq!(specs[0].labels["llm-d.ai/role"], "decode");
        assert_eq!(specs[1].addr.to_string(), "10.0.0.2:8001");
        let err = parse_endpoints_file(
            "endpoints:\n- {address: 10.0.0.1, port: \"http\"}\n",
            "e.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("is not 1-65535"), "{err}");
        assert!(
            parse_endpoints_file("endpoints:\n- {address: 10.0.0.1, port: 1, zone: a}\n", "e")
                .is_err()
        );
        assert!(
            parse_endpoints_file("endpoints: []\n", "e")
                .unwrap()
                .is_empty()
        );
    }
}
