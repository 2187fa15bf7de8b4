//! Headless Chromium (Debian's `chromium` package, which `scripts/setup.sh`
//! installs) loading a page as a person's browser would: its script runs,
//! its fetches go out, and the DOM it built is read back.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// The browser: `$CHROMIUM` when set, else `chromium` on the `PATH`.
/// Missing Chromium fails loudly, with the command that installs it.
pub fn chromium_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "Chromium is not installed (no `chromium` on PATH, CHROMIUM unset). Install it with: \
             scripts/setup.sh (apt-get install chromium)"
        )
    })
}

/// Loads `url` in headless Chromium (its own profile under `dir`), lets the
/// page's script run for `budget` of virtual time (timers fire without
/// waiting for them; fetches complete), and returns the DOM it built, as
/// HTML.
///
/// # Panics
/// When Chromium is missing, fails, or has not finished after a minute.
pub fn dump_dom(dir: &Path, url: &str, budget: Duration) -> String {
    let profile = dir.join("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let out = dir.join("chromium-dom.html");
    let err = dir.join("chromium.stderr");
    let mut child = Command::new(chromium_bin())
        .args([
            "--headless",
            "--disable-gpu",
            // Tests run as root, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--no-first-run",
            "--disable-extensions",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish loading {url} within a minute; stderr: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "chromium failed ({status}) loading {url}; stderr: {}",
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    std::fs::read_to_string(&out).unwrap()
}
