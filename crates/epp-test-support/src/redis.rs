//! A real Redis server (Debian's `redis-server`, installed by
//! `scripts/setup.sh`) on a loopback port, without persistence: a restart
//! starts it empty, as a restarted cache server is.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::process::{Proc, free_port_on};

/// A `redis-server` child process, stopped on drop.
#[derive(Debug)]
pub struct RedisServer {
    proc: Option<Proc>,
    /// Its port on 127.0.0.1 (kept across restarts).
    pub port: u16,
    dir: PathBuf,
    starts: u32,
}

impl RedisServer {
    /// Starts one on a free port, logging into `dir`.
    pub fn start(dir: &Path) -> Self {
        let mut server = Self {
            proc: None,
            port: free_port_on("127.0.0.1"),
            dir: dir.to_owned(),
            starts: 0,
        };
        server.start_again();
        server
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL: no shutdown handshake, as a crash).
    pub fn kill(&mut self) {
        self.proc = None;
    }

    /// Starts it again on the same port, empty.
    pub fn start_again(&mut self) {
        assert!(self.proc.is_none(), "redis-server is running");
        self.starts += 1;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir);
        let log = self.dir.join(format!("redis-{}.log", self.starts));
        let (proc, _) = Proc::spawn("redis-server", cmd, "Ready to accept connections", log);
        self.proc = Some(proc);
    }

    /// Runs `redis-cli` with `args` against it and returns its output lines.
    pub fn cli(&self, args: &[&str]) -> Vec<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Waits up to `timeout` until `check` holds on what `cli(args)` prints.
    pub fn wait_for(&self, args: &[&str], timeout: Duration, check: impl Fn(&[String]) -> bool) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let out = self.cli(args);
            if check(&out) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-cli {args:?} still prints {out:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
