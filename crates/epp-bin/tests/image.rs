//! The container image, run with podman: what it holds, the user it runs as,
//! health and metrics from inside it, traffic through Envoy to a simulator,
//! and a clean stop on SIGTERM.
//!
//! These tests need the image and root podman, which a plain `cargo test`
//! does not have, so they are ignored there. `scripts/test-image.sh` builds
//! the image, loads it into podman and runs them with `--ignored`, naming the
//! image in `EPP_IMAGE`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use epp_test_support::{
    http,
    process::{BodyMode, scratch_dir, spawn_epp, start_envoy, start_sim, workspace_root},
    wait::poll,
};

/// The user the image runs epp as (distroless's `nonroot`).
const UID: u32 = 65532;

fn image() -> String {
    std::env::var("EPP_IMAGE").expect(
        "EPP_IMAGE names the image to test; run these tests with scripts/test-image.sh, \
         which builds and loads it",
    )
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run podman {args:?}: {e}"))
}

/// Runs podman and returns its trimmed stdout; panics with its stderr on failure.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A container removed (whatever state it is in) when dropped, so a failed
/// assertion leaves nothing running.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", "--ignore", &self.0]);
    }
}

/// An image mounted read-only on the host, unmounted when dropped.
struct Mounted {
    image: String,
    root: String,
}

impl Mounted {
    fn new(image: &str) -> Self {
        let root = podman_ok(&["image", "mount", image]);
        Self {
            image: image.to_owned(),
            root,
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = podman(&["image", "unmount", &self.image]);
    }
}

/// Every path under `root`, relative to it, directories included.
fn tree(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.insert(
            path.strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
        if path.symlink_metadata().unwrap().is_dir() {
            tree(root, &path, out);
        }
    }
}

/// Whether a 64-bit little-endian ELF executable names a program
/// interpreter (`PT_INTERP`, the dynamic loader): a static one does not.
fn has_interpreter(elf: &[u8]) -> bool {
    assert!(
        elf.starts_with(b"\x7fELF\x02\x01"),
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |at: usize| usize::from(u16::from_le_bytes([elf[at], elf[at + 1]]));
    let phoff = usize::try_from(u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap())).unwrap();
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3
    })
}

#[test]
fn has_interpreter_tells_a_dynamic_executable_from_a_static_one() {
    // This test binary links glibc dynamically; the image's epp must not.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(has_interpreter(&me));
    let mut no_interp = me.clone();
    let phoff = usize::try_from(u64::from_le_bytes(me[0x20..0x28].try_into().unwrap())).unwrap();
    let (phentsize, phnum) = (
        usize::from(u16::from_le_bytes([me[0x36], me[0x37]])),
        usize::from(u16::from_le_bytes([me[0x38], me[0x39]])),
    );
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        if no_interp[at..at + 4] == 3u32.to_le_bytes() {
            no_interp[at..at + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        }
    }
    assert!(!has_interpreter(&no_interp));
}

#[test]
#[ignore = "needs root podman and the image: scripts/test-image.sh"]
fn the_image_holds_epp_its_user_and_ca_roots_and_nothing_else() {
    let image = image();
    let inspect: serde_json::Value =
        serde_json::from_str(&podman_ok(&["image", "inspect", &image])).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/epp"]),
        "{config}"
    );
    let ports: BTreeSet<&str> = config["ExposedPorts"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        ports,
        BTreeSet::from(["9002/tcp", "9003/tcp", "9090/tcp"]),
        "ext_proc, gRPC health and metrics"
    );
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    // The image is of this checkout's commit, not a stale one.
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    let head = String::from_utf8(head.stdout).unwrap();
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !head.trim().is_empty() && revision.starts_with(head.trim()),
        "image revision {revision:?}, checkout at {head:?}"
    );

    let mounted = Mounted::new(&image);
    let root = Path::new(&mounted.root);
    let mut files = BTreeSet::new();
    tree(root, root, &mut files);
    let expected = [
        "epp",
        "etc",
        "etc/group",
        "etc/passwd",
        "etc/ssl",
        "etc/ssl/certs",
        "etc/ssl/certs/ca-certificates.crt",
    ];
    assert_eq!(
        files,
        expected.iter().map(|s| (*s).to_owned()).collect(),
        "the image holds exactly these paths"
    );
    assert!(!root.join("bin/sh").exists());
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with(&format!("nonroot:x:{UID}:{UID}:"))),
        "{passwd}"
    );
    let roots = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(
        roots.matches("BEGIN CERTIFICATE").count() > 10,
        "a CA bundle, not an empty file"
    );
    // Debian's roots, not the building machine's bundle: CAs added locally
    // (a proxy's, a company's) stay out of the image.
    let pem_body =
        |pem: &str| -> String { pem.lines().filter(|l| !l.starts_with("-----")).collect() };
    let image_roots: String = roots.lines().collect();
    for local in std::fs::read_dir("/usr/local/share/ca-certificates")
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "crt"))
    {
        let body = pem_body(&std::fs::read_to_string(&local).unwrap());
        assert!(
            !body.is_empty() && !image_roots.contains(&body),
            "the image trusts the local CA {}",
            local.display()
        );
    }
    let epp = std::fs::read(root.join("epp")).unwrap();
    assert!(
        !has_interpreter(&epp),
        "/epp asks for a dynamic loader, and the image has no libc"
    );
    drop(mounted);

    // And so nothing can start a shell in it, while the same run of /epp works.
    let run = |entrypoint: &str, args: &[&str]| {
        let name = format!("epp-image-run-{}", std::process::id());
        let _container = Container(name.clone());
        let mut all = vec![
            "run",
            "--rm",
            "--name",
            &name,
            "--network",
            "none",
            "--entrypoint",
            entrypoint,
            &image,
        ];
        all.extend(args);
        podman(&all)
    };
    let version = run("/epp", &["--version"]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("epp {}", env!("CARGO_PKG_VERSION")),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );
    let shell = run("/bin/sh", &["-c", "echo a shell ran"]);
    let stderr = String::from_utf8_lossy(&shell.stderr);
    assert_eq!(
        shell.status.code(),
        Some(127),
        "podman's code for a command not found; stdout {:?}, stderr {stderr}",
        String::from_utf8_lossy(&shell.stdout)
    );
    assert!(stderr.contains("/bin/sh"), "{stderr}");
}

async fn health(port: u16, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .ok()?;
    let r = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .ok()?;
    Some(r.into_inner().status())
}

/// The `uid` and `gid` lines of /proc/PID/status: real, effective, saved, fs.
fn ids(pid: &str) -> (String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    (line("Uid:"), line("Gid:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root podman and the image: scripts/test-image.sh"]
async fn the_image_runs_epp_as_nonroot_serving_health_metrics_and_traffic() {
    let image = image();
    let dir = scratch_dir("image");
    let sim = start_sim(&dir, 0, &[]);
    let name = format!("epp-image-test-{}", std::process::id());
    let container = Container(name.clone());

    // As a restrictive pod would run it: read-only root, no capabilities.
    let mut cmd = Command::new("podman");
    cmd.args([
        "run",
        "--rm",
        "--name",
        &name,
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--env",
        "RUST_LOG=info",
        &image,
        "--grpc-port",
        "0",
        "--grpc-health-port",
        "0",
        "--metrics-port",
        "0",
        "--bind-address",
        "127.0.0.1",
        "--secure-serving=false",
        "--shutdown-grace-period",
        "1s",
        "--drain-timeout",
        "1s",
        "--endpoints",
        &sim.addr(),
    ]);
    let (mut epp, _) = spawn_epp("epp-image", cmd, dir.join("epp.log"));

    for service in [
        "",
        "liveness",
        "readiness",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        poll(&format!("health {service:?} SERVING"), 200, || async {
            (health(epp.health_port, service).await == Some(ServingStatus::Serving)).then_some(())
        })
        .await;
    }

    // The metrics server answers, and the data layer inside the container
    // scrapes the simulator outside it.
    poll("/metrics with one fresh endpoint", 200, || async {
        let (status, body) = http::get_blocking(epp.metrics_port, "/metrics").ok()?;
        (status == 200
            && body
                .lines()
                .any(|l| l.starts_with("inference_pool_ready_pods{") && l.ends_with(" 1")))
        .then_some(())
    })
    .await;

    // The process in the container is epp, as 65532:65532, with no capabilities.
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &name]);
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "epp"
    );
    let (uid, gid) = ids(&pid);
    assert_eq!(uid, format!("{UID} {UID} {UID} {UID}"), "uids of epp");
    assert_eq!(gid, format!("{UID} {UID} {UID} {UID}"), "gids of epp");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        "{status}"
    );

    // A request through Envoy is routed by the containerized picker.
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);
    let r = http::post_hello(envoy.port, None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-inference-pod"), Some("sim-0"));

    // SIGTERM (forwarded by podman) drains and exits 0; --rm removes the container.
    let code = epp.proc.terminate(Duration::from_secs(30));
    assert_eq!(code, Some(0), "epp's exit code through podman");
    let exists = podman(&["container", "exists", &name]);
    assert_eq!(
        exists.status.code(),
        Some(1),
        "container {name} left behind"
    );
    drop(container);
}
