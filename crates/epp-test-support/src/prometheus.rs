//! A real Prometheus server and promtool, built from the `prometheus` Go
//! module by `scripts/prometheus.sh` into a cache outside the checkout (about
//! five minutes cold; a test that needs them builds them when missing rather
//! than skipping), and queries through Prometheus's HTTP API.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use crate::process::{Proc, free_port_on, workspace_root};

fn run_script(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/prometheus.sh"))
        .args(args)
        .output()
        .expect("cannot run scripts/prometheus.sh");
    assert!(
        out.status.success(),
        "scripts/prometheus.sh {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn built(which: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        run_script(&["build"]);
    });
    PathBuf::from(run_script(&["path", which]))
}

/// The `promtool` binary, built once per process when missing.
pub fn promtool_bin() -> PathBuf {
    built("promtool")
}

/// The `prometheus` binary, built once per process when missing.
pub fn prometheus_bin() -> PathBuf {
    built("prometheus")
}

/// A running Prometheus server.
#[derive(Debug)]
pub struct Prometheus {
    /// The process.
    pub proc: Proc,
    /// Its HTTP port (API and UI).
    pub port: u16,
}

/// Starts Prometheus in `dir`, scraping each `(job, [host:port, ...])` every
/// `interval`.
pub fn start_prometheus(
    dir: &Path,
    jobs: &[(&str, Vec<String>)],
    interval: Duration,
) -> Prometheus {
    let bin = prometheus_bin();
    let port = free_port_on("127.0.0.1");
    let interval = format!("{}ms", interval.as_millis());
    let mut config = format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\nscrape_configs:\n"
    );
    for (job, targets) in jobs {
        let targets = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        config.push_str(&format!(
            "  - job_name: {job}\n    scrape_interval: {interval}\n    scrape_timeout: {interval}\n    static_configs:\n      - targets: [{targets}]\n"
        ));
    }
    let file = dir.join(format!("prometheus-{port}.yaml"));
    std::fs::write(&file, config).unwrap();
    let data = dir.join(format!("prometheus-data-{port}"));
    // Prometheus logs on stderr; the ready line is awaited on stdout.
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!(
        "exec '{}' --config.file='{}' --storage.tsdb.path='{}' --web.listen-address=127.0.0.1:{port} 2>&1",
        bin.display(),
        file.display(),
        data.display()
    ));
    let (proc, _) = Proc::spawn(
        &format!("prometheus:{port}"),
        cmd,
        "Server is ready to receive web requests",
        dir.join(format!("prometheus-{port}.log")),
    );
    Prometheus { proc, port }
}

impl Prometheus {
    /// Runs an instant query; returns the API's `data.result` (an array of
    /// `{metric, value}` for a vector).
    pub fn query(&self, expr: &str) -> serde_json::Value {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let (status, body) = crate::http::get_unchunked(self.port, &path, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("cannot query Prometheus: {e}"));
        let doc: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
        assert_eq!(status, 200, "query {expr:?}: {body}");
        assert_eq!(doc["status"], "success", "query {expr:?}: {body}");
        doc["data"]["result"].clone()
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
