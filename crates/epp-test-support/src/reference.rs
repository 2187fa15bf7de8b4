//! The reference endpoint picker as a contender in benchmarks: its `epp`
//! binary, built from its published Go module by `scripts/reference-epp.sh`
//! (cached outside the checkout), run the way a user runs it: on a Kubernetes
//! control plane, following an InferencePool, with an EndpointPickerConfig
//! file, serving ext_proc in plaintext.
//!
//! It has no static-endpoints mode: without `--pool-name` it needs
//! `--endpoint-selector`, which also selects pods through the API server.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::process::{Epp, Proc, workspace_root};

fn script() -> PathBuf {
    workspace_root().join("scripts/reference-epp.sh")
}

fn run_script(arg: &str) -> String {
    let out = Command::new("bash")
        .arg(script())
        .arg(arg)
        .output()
        .expect("cannot run scripts/reference-epp.sh");
    assert!(
        out.status.success(),
        "scripts/reference-epp.sh {arg} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The reference `epp` binary, built once per process when not cached.
pub fn reference_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        run_script("build");
        PathBuf::from(run_script("path"))
    })
}

/// llm-d's inference simulator (`llm-d/llm-d-inference-sim`), built once
/// per process when not cached (`scripts/reference-epp.sh build-sim`).
pub fn sim_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        run_script("build-sim");
        PathBuf::from(run_script("sim-path"))
    })
}

/// Starts llm-d's simulator as pod `pod` with IP `pod_ip` (its `POD_IP`,
/// which names it in its KV-event topic `kv@<pod_ip>@<model>`), serving on
/// `port` on every address, then `extra` flags. Returns once it serves.
pub fn start_llm_d_sim(dir: &Path, pod: &str, pod_ip: &str, port: u16, extra: &[&str]) -> Proc {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec \"$0\" \"$@\" 2>&1"])
        .arg(sim_bin())
        .args(["--port", &port.to_string()])
        .args(extra)
        .env("POD_IP", pod_ip)
        .env("POD_NAME", pod);
    let (proc, _) = Proc::spawn(pod, cmd, "Server starting", dir.join(format!("{pod}.log")));
    proc
}

/// The Go module and version the binary is built from (`module@version`).
pub fn reference_version() -> String {
    run_script("version")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the reference picker on InferencePool `pool` of `namespace`, as
/// the user of `kubeconfig`, with `config` as its `--config-file`; plaintext
/// ext_proc, no tracing exporter, no pprof, metrics without authentication
/// (the rest of its defaults), then `extra` flags. Returns once its
/// controller manager starts; it routes only after its first pod sync, which
/// the caller waits for.
pub fn start_reference(
    dir: &Path,
    kubeconfig: &Path,
    namespace: &str,
    pool: &str,
    config: &Path,
    extra: &[String],
) -> Epp {
    let (grpc, health, metrics) = (free_port(), free_port(), free_port());
    // It logs to stderr; `exec` keeps the pid (CPU and memory are read from it).
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec \"$0\" \"$@\" 2>&1"])
        .arg(reference_bin())
        .args(["--pool-name", pool, "--pool-namespace", namespace])
        .args(["--grpc-port", &grpc.to_string()])
        .args(["--grpc-health-port", &health.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .arg("--config-file")
        .arg(config)
        .args([
            "--secure-serving=false",
            "--tracing=false",
            "--enable-pprof=false",
            "--metrics-endpoint-auth=false",
        ])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        // Leader election and in-cluster look-ups read these; never set here.
        .env_remove("KUBERNETES_SERVICE_HOST");
    let (proc, _) = Proc::spawn(
        "reference-epp",
        cmd,
        "Controller manager starting",
        dir.join("reference-epp.log"),
    );
    Epp {
        proc,
        grpc_port: grpc,
        health_port: health,
        metrics_port: metrics,
    }
}

/// llm-d's routing sidecar (`pd-sidecar`), built once per process when not
/// cached (`scripts/reference-epp.sh build-sidecar`).
pub fn sidecar_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        run_script("build-sidecar");
        PathBuf::from(run_script("sidecar-path"))
    })
}

/// Starts llm-d's routing sidecar as a decode pod runs it: listening on
/// `port` (every address), in front of its model server at
/// `localhost:vllm_port`, plaintext both ways, NIXL v2 connector (vLLM's
/// `kv_transfer_params`), then `extra` flags. `pod_ip` is its `POD_IP` (its
/// data-parallel ranks are addressed as `POD_IP:port+i`). Returns once its
/// first listener is up.
pub fn start_sidecar(
    dir: &Path,
    name: &str,
    port: u16,
    vllm_port: u16,
    pod_ip: &str,
    extra: &[&str],
) -> Proc {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec \"$0\" \"$@\" 2>&1"])
        .arg(sidecar_bin())
        .args(["--port", &port.to_string()])
        .args(["--vllm-port", &vllm_port.to_string()])
        .args(["--secure-proxy=false", "--kv-connector", "nixlv2"])
        .args(extra)
        .env("POD_IP", pod_ip)
        // Its tracing would export to localhost:4317; nothing listens there.
        .env("OTEL_SDK_DISABLED", "true");
    let (proc, _) = Proc::spawn(
        name,
        cmd,
        "\"msg\":\"starting\"",
        dir.join(format!("{name}.log")),
    );
    proc
}
