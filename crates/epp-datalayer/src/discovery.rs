//! Discovery without Kubernetes: a YAML file of endpoints, watched for
//! changes. (Kubernetes InferencePool discovery will be another source
//! writing into the same [`EndpointStore`].)

use std::{
    collections::BTreeMap,
    fmt,
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

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

/// Parses an endpoints file: a YAML list of `{address, port, labels}`.
///
/// # Errors
/// Unreadable YAML or entries, with the location serde reports.
pub fn parse_endpoints_file(text: &str, path: &str) -> Result<Vec<EndpointSpec>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<FileEntry> =
        serde_yaml_ng::from_str(text).map_err(|e| Error::EndpointsFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(entries
        .into_iter()
        .map(|e| EndpointSpec {
            addr: (e.address, e.port).into(),
            labels: e.labels,
        })
        .collect())
}

/// A way of learning the endpoint set (a static list, a watched file, later
/// Kubernetes InferencePools). Each discovery owns one named part of the
/// [`EndpointStore`] and keeps it in step until stopped.
pub trait Discovery: Send + Sync + fmt::Debug {
    /// The name of the store part this discovery writes.
    fn source_name(&self) -> String;

    /// Publishes the first endpoint set before returning (an error here is
    /// fatal to the caller), then keeps it up to date on the current tokio
    /// runtime until `stop` is cancelled.
    ///
    /// # Errors
    /// When the first set cannot be obtained.
    fn start(&self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()>;
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
/// The file's modification time and length are checked every poll interval
/// (default 50 ms, a `stat` call); the content is re-read when they change
/// and at least once a second, so an edit that keeps both is still seen.
#[derive(Debug, Clone)]
pub struct FileDiscovery {
    path: PathBuf,
    poll: Duration,
}

/// How often the content is re-read even when `stat` shows no change.
const FULL_READ_EVERY: Duration = Duration::from_secs(1);

impl FileDiscovery {
    /// Watches `path`, checking every 50 ms.
    #[must_use]
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            poll: Duration::from_millis(50),
        }
    }

    /// Sets how often the file is checked.
    #[must_use]
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }

    fn load(&self) -> Result<Vec<EndpointSpec>> {
        let shown = self.path.display().to_string();
        let text = std::fs::read_to_string(&self.path).map_err(|e| Error::EndpointsFile {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        parse_endpoints_file(&text, &shown)
    }

    fn stamp(&self) -> Option<(SystemTime, u64)> {
        let meta = std::fs::metadata(&self.path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    }

    /// Loads the file now (an error here is fatal to the caller) and then
    /// reloads it whenever it changes, until `stop`. A later bad edit is
    /// logged once and the previous endpoints kept; a deleted file too.
    ///
    /// # Errors
    /// When the file cannot be read or parsed the first time.
    pub fn spawn(self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()> {
        let source = self.source_name();
        let mut stamp = self.stamp();
        let first = self.load()?;
        store.replace_source(&source, first.clone());
        tokio::spawn(async move {
            let mut last: Result<Vec<EndpointSpec>> = Ok(first);
            let mut tick = tokio::time::interval(self.poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_read = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let now_stamp = self.stamp();
                if now_stamp == stamp && last_read.elapsed() < FULL_READ_EVERY {
                    continue;
                }
                stamp = now_stamp;
                last_read = tokio::time::Instant::now();
                let now = self.load();
                match (&now, &last) {
                    (Ok(a), Ok(b)) if a == b => continue,
                    (Err(a), Err(b)) if a.to_string() == b.to_string() => continue,
                    (Ok(specs), _) => {
                        tracing::info!(file = %self.path.display(), endpoints = specs.len(), "endpoints file changed");
                        store.replace_source(&source, specs.clone());
                    }
                    (Err(e), _) => {
                        tracing::error!(error = %e, "endpoints file unreadable; keeping the previous endpoints");
                    }
                }
                last = now;
            }
        });
        Ok(())
    }
}

impl Discovery for FileDiscovery {
    fn source_name(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn start(&self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()> {
        self.clone().spawn(store, stop)
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
    }
}
