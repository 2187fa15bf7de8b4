//! Real helm (v3) for the chart tests, built from its Go module by
//! `scripts/helm.sh` into a cache outside the checkout (a few minutes cold;
//! a test that needs it builds it when missing rather than skipping).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

fn script() -> PathBuf {
    crate::process::workspace_root().join("scripts/helm.sh")
}

/// The helm binary, built once per process when missing.
pub fn helm_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let t = Instant::now();
        let out = Command::new("bash")
            .arg(script())
            .arg("build")
            .output()
            .expect("cannot run scripts/helm.sh");
        assert!(
            out.status.success(),
            "scripts/helm.sh build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if t.elapsed() > Duration::from_secs(5) {
            eprintln!("built helm in {:?}", t.elapsed());
        }
        let out = Command::new("bash")
            .arg(script())
            .arg("path")
            .output()
            .expect("cannot run scripts/helm.sh");
        assert!(
            out.status.success(),
            "scripts/helm.sh path failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// The chart in this checkout, `deploy/charts/<name>`.
pub fn chart_dir(name: &str) -> PathBuf {
    crate::process::workspace_root()
        .join("deploy/charts")
        .join(name)
}

/// Runs helm with `args`; returns (success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm_bin())
        .args(args)
        // No repositories, plugins or caches of the machine's user.
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("epp-helm-config"),
        )
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("epp-helm-cache"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("epp-helm-data"))
        .output()
        .expect("cannot run helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes `values` (JSON, which helm reads as YAML) to a file under `dir`
/// and returns its path.
pub fn values_file(dir: &Path, name: &str, values: &serde_json::Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(values).unwrap()).unwrap();
    path
}

/// `helm template <release> <chart> --namespace <ns> -f <file>...`: the
/// rendered manifests. Panics with helm's message when rendering fails.
pub fn template(chart: &Path, release: &str, namespace: &str, values: &[&Path]) -> String {
    let mut args = vec![
        "template".to_owned(),
        release.to_owned(),
        chart.to_str().unwrap().to_owned(),
        "--namespace".to_owned(),
        namespace.to_owned(),
    ];
    for v in values {
        args.push("-f".to_owned());
        args.push(v.to_str().unwrap().to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "helm {args:?} failed:\n{stderr}");
    stdout
}
