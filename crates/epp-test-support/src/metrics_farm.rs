//! A metrics farm: one child process serving a fixed Prometheus page at
//! `/metrics` (any path, in fact) on every loopback address at one port, as
//! the pods of an InferencePool serve theirs on their `targetPorts`, and
//! counting the scrapes it answers per client `User-Agent` and the distinct
//! pod IPs each client reached. Its CPU is its own, not the caller's.
//!
//! The child is the calling executable run again with
//! `EPP_METRICS_FARM_PAGE=<file>`: a bench calls [`serve_if_child`] first
//! thing in `main`, then [`MetricsFarm::start`].
//!
//! ```no_run
//! # use epp_test_support::metrics_farm::{MetricsFarm, serve_if_child, vllm_page};
//! serve_if_child();
//! let dir = epp_test_support::process::scratch_dir("farm");
//! let farm = MetricsFarm::start(&dir, &vllm_page());
//! // Pods at 127.1.0.1:<farm.port>, 127.1.0.2:<farm.port>, … all reach it.
//! let counts = farm.counts(); // user agent -> (scrapes, distinct pod IPs)
//! # drop(counts);
//! ```

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    path::Path,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    http,
    process::{Proc, workspace_root},
};

const PAGE_ENV: &str = "EPP_METRICS_FARM_PAGE";

/// The page scrape benchmarks serve: the first ~100 KiB (whole lines) of the
/// parser crate's large vLLM fixture (`epp-promtext/tests/fixtures/vllm-1mb.txt`),
/// a data-parallel vLLM page with three engine ranks and their histograms.
/// It has `vllm:num_requests_waiting`, `vllm:num_requests_running`,
/// `vllm:kv_cache_usage_perc` and `vllm:cache_config_info` (block size 16,
/// 27,912 GPU blocks), and no `vllm:lora_requests_info`.
pub fn vllm_page() -> String {
    const PAGE_BYTES: usize = 100 * 1024;
    let path = workspace_root().join("crates/epp-promtext/tests/fixtures/vllm-1mb.txt");
    let full = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let cut = full[..PAGE_BYTES].rfind('\n').unwrap() + 1;
    full[..cut].to_owned()
}

/// The families of [`vllm_page`] the default extractors of epp and of the
/// reference read (queue, running, KV usage, cache geometry), engine rank 0
/// only: one vLLM server's gauges, ~1.5 KB.
pub fn vllm_core_page() -> String {
    const FAMILIES: [&str; 4] = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
    ];
    let mut out = String::new();
    for line in vllm_page().lines() {
        let keep = match line.strip_prefix("# ") {
            Some(comment) => comment
                .split_whitespace()
                .nth(1)
                .is_some_and(|f| FAMILIES.contains(&f)),
            None => {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                FAMILIES.contains(&name) && line.contains("engine=\"0\"")
            }
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Scrapes answered for one client (`User-Agent`) so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCount {
    /// Responses written.
    pub scrapes: u64,
    /// Distinct local (pod) IPs the client connected to.
    pub pod_ips: usize,
}

/// The farm process, killed on drop.
#[derive(Debug)]
pub struct MetricsFarm {
    /// The process (its pid for CPU figures).
    pub proc: Proc,
    /// The port it serves on, on every address.
    pub port: u16,
    /// Its control port on 127.0.0.1 (`GET /counts`).
    pub control_port: u16,
}

impl MetricsFarm {
    /// Starts the farm serving `page` on a port free on every address;
    /// returns once it listens. The page goes through a file in `dir`.
    pub fn start(dir: &Path, page: &str) -> Self {
        let file = dir.join("metrics-farm-page.txt");
        std::fs::write(&file, page).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env(PAGE_ENV, &file);
        let (proc, line) = Proc::spawn(
            "metrics-farm",
            cmd,
            "metrics farm listening",
            dir.join("metrics-farm.log"),
        );
        let field = |key: &str| -> u16 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        Self {
            port: field("port="),
            control_port: field("control="),
            proc,
        }
    }

    /// Counts so far, by `User-Agent` (`""` for a client that sends none).
    pub fn counts(&self) -> BTreeMap<String, ClientCount> {
        let (status, body) =
            http::get_unchunked(self.control_port, "/counts", Duration::from_secs(5))
                .expect("the metrics farm answers");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON counts");
        v.as_object()
            .expect("an object")
            .iter()
            .map(|(ua, c)| {
                (
                    ua.clone(),
                    ClientCount {
                        scrapes: c[0].as_u64().unwrap_or(0),
                        pod_ips: c[1].as_u64().unwrap_or(0) as usize,
                    },
                )
            })
            .collect()
    }

    /// Waits until a client not in `known` has reached `pods` distinct pod
    /// IPs; returns its `User-Agent`. This is how a newly started picker is
    /// told apart from those already scraping.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn wait_new_client(&self, known: &[String], pods: usize, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let counts = self.counts();
            if let Some((ua, _)) = counts
                .iter()
                .find(|(ua, c)| !known.contains(ua) && c.pod_ips >= pods)
            {
                return ua.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no new client scraped all {pods} pods within {timeout:?}: {counts:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// When this process is a farm child ([`MetricsFarm::start`]), serves until
/// killed and never returns; otherwise returns at once.
pub fn serve_if_child() {
    let Some(file) = std::env::var_os(PAGE_ENV) else {
        return;
    };
    let page = std::fs::read_to_string(&file).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(serve(page));
    std::process::exit(0);
}

type Counts = Arc<Mutex<HashMap<String, (u64, HashSet<IpAddr>)>>>;

async fn serve(page: String) {
    let response: Arc<[u8]> = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{page}",
        page.len()
    )
    .into_bytes()
    .into();
    let counts: Counts = Arc::default();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let control = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!(
        "metrics farm listening port={} control={} page_bytes={}",
        listener.local_addr().unwrap().port(),
        control.local_addr().unwrap().port(),
        page.len()
    );
    let c = Arc::clone(&counts);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = control.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let body = {
                let map = c.lock().unwrap();
                let obj: serde_json::Map<String, serde_json::Value> = map
                    .iter()
                    .map(|(ua, (n, ips))| (ua.clone(), serde_json::json!([n, ips.len()])))
                    .collect();
                serde_json::Value::Object(obj).to_string()
            };
            let _ = s
                .write_all(
                    format!("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{body}")
                        .as_bytes(),
                )
                .await;
        }
    });
    while let Ok((s, _)) = listener.accept().await {
        let (response, counts) = (Arc::clone(&response), Arc::clone(&counts));
        tokio::spawn(connection(s, response, counts));
    }
}

/// Answers every request on `s` with `response`, counting it.
async fn connection(mut s: tokio::net::TcpStream, response: Arc<[u8]>, counts: Counts) {
    let Ok(local) = s.local_addr() else { return };
    let mut buf = [0u8; 4096];
    let mut head = Vec::new();
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(k) => head.extend_from_slice(&buf[..k]),
        }
        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let ua = user_agent(&head[..end]);
            head.drain(..end + 4);
            if s.write_all(&response).await.is_err() {
                return;
            }
            let mut map = counts.lock().unwrap();
            let entry = map.entry(ua).or_default();
            entry.0 += 1;
            entry.1.insert(local.ip());
        }
    }
}

fn user_agent(head: &[u8]) -> String {
    String::from_utf8_lossy(head)
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("user-agent")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_page_keeps_one_engine_of_the_read_families() {
        let page = vllm_core_page();
        assert!(page.contains("vllm:num_requests_waiting{engine=\"0\""));
        assert!(page.contains("vllm:kv_cache_usage_perc{engine=\"0\""));
        assert!(page.contains("num_gpu_blocks=\"27912\""));
        assert!(!page.contains("engine=\"1\""));
        assert!(!page.contains("_bucket"));
        assert!(page.len() < 4096, "{}", page.len());
    }

    #[test]
    fn user_agent_is_read_case_insensitively() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nuser-agent: Go-http-client/1.1";
        assert_eq!(user_agent(head), "Go-http-client/1.1");
        assert_eq!(user_agent(b"GET / HTTP/1.1\r\nHost: x"), "");
    }
}
