//! A real OpenTelemetry Collector (OTLP receiver, file exporter), built from
//! its Go modules by `scripts/otelcol.sh` into a cache outside the checkout
//! (about four minutes cold; a test that needs it builds it when missing
//! rather than skipping), and the spans it wrote, read back.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::process::{Proc, free_port_on};

fn script() -> PathBuf {
    crate::process::workspace_root().join("scripts/otelcol.sh")
}

fn run_script(arg: &str) -> String {
    let out = Command::new("bash")
        .arg(script())
        .arg(arg)
        .output()
        .expect("cannot run scripts/otelcol.sh");
    assert!(
        out.status.success(),
        "scripts/otelcol.sh {arg} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The collector binary, built once per process when missing.
pub fn collector_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        run_script("build");
        PathBuf::from(run_script("path"))
    })
    .clone()
}

/// A running collector writing every span it receives to [`Self::file`].
#[derive(Debug)]
pub struct Collector {
    /// The process.
    pub proc: Proc,
    /// Its OTLP/gRPC port.
    pub grpc_port: u16,
    /// Its OTLP/HTTP port.
    pub http_port: u16,
    /// The JSON-lines file it writes (one `ExportTraceServiceRequest` a line).
    pub file: PathBuf,
}

/// One span as the collector wrote it, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    /// Its name.
    pub name: String,
    /// Trace id, lower-case hex.
    pub trace_id: String,
    /// Span id, lower-case hex.
    pub span_id: String,
    /// Parent span id, lower-case hex (empty for a root).
    pub parent_span_id: String,
    /// `SpanKind` number (1 internal, 2 server).
    pub kind: i64,
    /// Attributes: key → the OTLP JSON `AnyValue` (`{"stringValue": …}`, …).
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// The resource's attributes, the same way.
    pub resource: serde_json::Map<String, serde_json::Value>,
    /// The status (`{}` when unset, `{"code": 2, "message": …}` on error).
    pub status: serde_json::Value,
}

impl ExportedSpan {
    /// A string attribute's value.
    pub fn str_attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key)?.get("stringValue")?.as_str()
    }
}

fn attributes(list: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| Some((kv["key"].as_str()?.to_owned(), kv["value"].clone())))
        .collect()
}

/// Starts a collector on free loopback ports, writing under `dir`.
pub fn start_collector(dir: &Path) -> Collector {
    let bin = collector_bin();
    let grpc_port = free_port_on("127.0.0.1");
    let http_port = free_port_on("127.0.0.1");
    let file = dir.join(format!("spans-{grpc_port}.jsonl"));
    let config = dir.join(format!("otelcol-{grpc_port}.yaml"));
    // Logs on stdout, where the ready line is awaited; no own metrics port
    // (tests run collectors side by side).
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: 127.0.0.1:{grpc_port}}}\n      http: {{endpoint: 127.0.0.1:{http_port}}}\nexporters:\n  file: {{path: {}, flush_interval: 50ms}}\nservice:\n  telemetry:\n    metrics: {{level: none}}\n    logs: {{output_paths: [stdout], error_output_paths: [stdout]}}\n  pipelines:\n    traces: {{receivers: [otlp], exporters: [file]}}\n",
            file.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&config);
    let (proc, _) = Proc::spawn(
        &format!("otelcol:{grpc_port}"),
        cmd,
        "Everything is ready",
        dir.join(format!("otelcol-{grpc_port}.log")),
    );
    Collector {
        proc,
        grpc_port,
        http_port,
        file,
    }
}

impl Collector {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for its gRPC receiver.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// Everything written so far, as text.
    pub fn raw(&self) -> String {
        std::fs::read_to_string(&self.file).unwrap_or_default()
    }

    /// Every span written so far, in the order received.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        let mut out = Vec::new();
        // A line being written may be cut short: only whole lines parse.
        for line in self.raw().lines() {
            let Ok(doc) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                let resource = attributes(&rs["resource"]["attributes"]);
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                        out.push(ExportedSpan {
                            name: text("name"),
                            trace_id: text("traceId"),
                            span_id: text("spanId"),
                            parent_span_id: text("parentSpanId"),
                            kind: s["kind"].as_i64().unwrap_or(0),
                            attributes: attributes(&s["attributes"]),
                            resource: resource.clone(),
                            status: s["status"].clone(),
                        });
                    }
                }
            }
        }
        out
    }
}
