//! Discovery without Kubernetes: a YAML file of endpoints, watched for
//! changes. (Kubernetes InferencePool discovery will be another source
//! writing into the same [`EndpointStore`].)

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{EndpointSpec, EndpointStore, Error, Result};

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

/// Watches a YAML endpoints file and keeps its part of the store in step.
#[derive(Debug, Clone)]
pub struct FileDiscovery {
    path: PathBuf,
    poll: Duration,
}

impl FileDiscovery {
    /// Watches `path`, checking every 250 ms.
    #[must_use]
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            poll: Duration::from_millis(250),
        }
    }

    /// Sets how often the file is checked.
    #[must_use]
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
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

    /// Loads the file now (an error here is fatal to the caller) and then
    /// reloads it whenever its content changes, until `stop`. A later bad
    /// edit is logged and the previous endpoints kept.
    ///
    /// # Errors
    /// When the file cannot be read or parsed the first time.
    pub fn spawn(self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()> {
        let source = format!("file:{}", self.path.display());
        let first = self.load()?;
        store.replace_source(&source, first.clone());
        tokio::spawn(async move {
            let mut last: Result<Vec<EndpointSpec>> = Ok(first);
            let mut tick = tokio::time::interval(self.poll);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let now = self.load();
                match (&now, &last) {
                    (Ok(a), Ok(b)) if a == b => continue,
                    (Err(a), Err(b)) if a.to_string() == b.to_string() => continue,
                    (Ok(specs), _) => {
                        tracing::info!(file = %self.path.display(), endpoints = specs.len(), "endpoints file changed");
                        store.replace_source(&source, specs.clone());
                    }
                    (Err(e), _) => {
                        tracing::error!(error = %e, "endpoints file unreadable; keeping the previous endpoints")
                    }
                }
                last = now;
            }
        });
        Ok(())
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
