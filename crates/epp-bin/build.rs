//! Build information for `inference_extension_info{commit,build_ref}`: the
//! commit (`EPP_BUILD_COMMIT` when set, e.g. by an image build without a git
//! checkout; else `git rev-parse HEAD`; else `unknown`) and the version
//! (`EPP_BUILD_REF` when set, else `v` + the crate version).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=EPP_BUILD_COMMIT");
    println!("cargo:rerun-if-env-changed=EPP_BUILD_REF");
    // A new commit moves HEAD's log: rebuild the info then.
    if let Some(log) = git(&["rev-parse", "--git-path", "logs/HEAD"]) {
        println!("cargo:rerun-if-changed={log}");
    }
    let commit = std::env::var("EPP_BUILD_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    let build_ref = std::env::var("EPP_BUILD_REF").unwrap_or_else(|_| {
        format!(
            "v{}",
            std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
        )
    });
    println!("cargo:rustc-env=EPP_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=EPP_BUILD_REF={build_ref}");
}
