//! The routing benchmark's own load generator (Rust), for what inference-perf
//! cannot do here: the LoRA mix (inference-perf insists every adapter is listed
//! by the router's `/v1/models`, which sglang-router does not do), rates
//! beyond what a Python client sustains on a shared 2-core machine, and the
//! same arrivals for every contender (a fixed seed; inference-perf's send rate
//! wanders by 10–20 % near saturation, as large as the differences measured).
//!
//! The benchmark itself is `benches/routing/run.sh`; it calls this as
//!
//! ```sh
//! cargo bench -p epp-bin --bench routing -- --url http://127.0.0.1:PORT \
//!     --workload lora-mix --rates 8,16,24 --secs 10 --warmup-secs 8 --seed 1 --out stages.jsonl
//! ```
//!
//! Open loop: Poisson arrivals at each rate in turn (a warm-up stage first, not
//! reported), streamed `/v1/completions`, one connection per request. Each stage
//! waits for its requests (at most `--timeout` seconds each) and writes one
//! JSON line: wall-clock start and end, TTFT p50/p90/p99, time per output token
//! p50/p90, output tokens/s, requests sent/ok/failed and the rate actually sent.
//! `--requests-out FILE` also writes a line per request (stage, send time,
//! tenant, answering server, TTFT, total time, and the server's cached
//! prompt tokens when usage is asked for; nulls for a failed one), so
//! that two contenders, which get the same arrivals, compare request by request.
//! Prompts are words of exactly 4 bytes (3 letters and a space), so the
//! simulator's 4-byte token rule counts what the workload asks for; with
//! `--words FILE` (one word a line) they are drawn from that vocabulary, whose
//! words a fleet that tokenizes for real (precise prefix) also counts one each.
//!
//! `--side HOST:PORT,... --side-rate R` also sends, from the warm-up to the
//! last stage's end, R requests/s of the same workload (its own arrivals and
//! tenants, a seed of their own) straight to those servers, one chosen at
//! random per request: a second gateway on the same pool that the router under
//! test never sees. Its requests are counted per stage (`side_sent`), not
//! timed. With it, the router's requests ask for usage, and each stage line
//! carries the prefix-cache hit rate of the router's requests alone
//! (`hit_rate`, the servers' cached prompt tokens over prompt tokens).
//! `--usage` asks for usage without side traffic, so that `--requests-out`
//! says which of the router's requests were cache hits.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use epp_test_support::{http, stats::percentile};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const ADAPTERS: usize = 8;

/// xorshift64*: deterministic, seedable, enough for arrival times and lengths.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
    /// A length from N(mean, sd) clamped to [min, max].
    fn length(&mut self, min: u64, max: u64, mean: f64, sd: f64) -> u64 {
        (mean + sd * self.normal())
            .round()
            .clamp(min as f64, max as f64) as u64
    }
}

/// Where prompt words come from: random 3-letter words, or a vocabulary
/// (`--words FILE`, one word a line) whose every word the fleet's tokenizer
/// counts as one token, as the simulators' 4-byte rule does.
#[derive(Clone)]
struct Words(Vec<String>);

impl Words {
    /// `tokens` words, each followed by a space.
    fn draw(&self, rng: &mut Rng, tokens: u64) -> String {
        let mut s = String::with_capacity(tokens as usize * 4);
        for _ in 0..tokens {
            if self.0.is_empty() {
                for _ in 0..3 {
                    s.push((b'a' + rng.below(26) as u8) as char);
                }
            } else {
                s.push_str(&self.0[rng.below(self.0.len())]);
            }
            s.push(' ');
        }
        s
    }
}

/// A length drawn from N(mean, sd), clamped to [min, max].
#[derive(Clone, Copy)]
struct Lengths {
    min: u64,
    max: u64,
    mean: f64,
    sd: f64,
}

impl Lengths {
    fn draw(self, rng: &mut Rng) -> u64 {
        rng.length(self.min, self.max, self.mean, self.sd)
    }
}

/// The requests of a workload, as benches/routing/run.py's workload of the
/// same name describes them.
#[derive(Clone, Copy)]
enum Workload {
    /// `tenants` system prompts of `system_tokens` each; every request is one
    /// of them (chosen at random) and a 32-token question.
    Tenants {
        tenants: usize,
        system_tokens: u64,
        output_tokens: u64,
    },
    /// Unique prompts of random lengths; with `lora`, each names one of the
    /// adapters (uniform).
    Random {
        prompt: Lengths,
        output: Lengths,
        lora: bool,
    },
}

/// inference-perf's random data of the routing benchmark (no-sharing, lora-mix).
const MIXED_PROMPTS: Lengths = Lengths {
    min: 64,
    max: 4000,
    mean: 1000.0,
    sd: 800.0,
};
const MIXED_OUTPUTS: Lengths = Lengths {
    min: 8,
    max: 64,
    mean: 32.0,
    sd: 16.0,
};

/// The workloads, by the name `--workload` takes.
const WORKLOADS: &[(&str, Workload)] = &[
    (
        "shared-prefix",
        Workload::Tenants {
            tenants: 16,
            system_tokens: 6000,
            output_tokens: 32,
        },
    ),
    (
        "many-tenants",
        Workload::Tenants {
            tenants: 64,
            system_tokens: 6000,
            output_tokens: 32,
        },
    ),
    (
        "short-prompts",
        Workload::Tenants {
            tenants: 32,
            system_tokens: 256,
            output_tokens: 8,
        },
    ),
    (
        "long-answers",
        Workload::Tenants {
            tenants: 64,
            system_tokens: 2000,
            output_tokens: 256,
        },
    ),
    (
        "no-sharing",
        Workload::Random {
            prompt: MIXED_PROMPTS,
            output: MIXED_OUTPUTS,
            lora: false,
        },
    ),
    (
        "lora-mix",
        Workload::Random {
            prompt: MIXED_PROMPTS,
            output: MIXED_OUTPUTS,
            lora: true,
        },
    ),
    (
        "long-outputs",
        Workload::Random {
            prompt: Lengths {
                min: 64,
                max: 2000,
                mean: 500.0,
                sd: 400.0,
            },
            output: Lengths {
                min: 64,
                max: 256,
                mean: 160.0,
                sd: 48.0,
            },
            lora: false,
        },
    ),
];

/// One request: model, prompt, output tokens.
struct Req {
    model: String,
    prompt: String,
    max_tokens: u64,
    /// The tenant whose system prompt leads the prompt, if any.
    tenant: Option<usize>,
}

struct Gen {
    workload: Workload,
    rng: Rng,
    words: Words,
    prefixes: Vec<String>,
}

impl Gen {
    fn new(workload: Workload, seed: u64, words: Words) -> Self {
        let mut rng = Rng::new(seed);
        // Tenants and their system prompts' tokens (as in the inference-perf
        // workloads; each request picks its tenant at random, where
        // inference-perf's data set has a fixed number of questions per
        // tenant, so hit rates are not comparable between the clients).
        let prefixes = match workload {
            Workload::Tenants {
                tenants,
                system_tokens,
                ..
            } => (0..tenants)
                .map(|_| words.draw(&mut rng, system_tokens))
                .collect(),
            Workload::Random { .. } => Vec::new(),
        };
        Self {
            workload,
            rng,
            words,
            prefixes,
        }
    }

    /// The same tenants' system prompts, its own requests (tenants, questions,
    /// lengths) from `seed`.
    fn sibling(&self, seed: u64) -> Self {
        Self {
            workload: self.workload,
            rng: Rng::new(seed),
            words: self.words.clone(),
            prefixes: self.prefixes.clone(),
        }
    }

    fn next(&mut self) -> Req {
        match self.workload {
            Workload::Tenants { output_tokens, .. } => {
                let tenant = self.rng.below(self.prefixes.len());
                Req {
                    model: MODEL.to_owned(),
                    prompt: format!(
                        "{}{}",
                        self.prefixes[tenant],
                        self.words.draw(&mut self.rng, 32)
                    ),
                    max_tokens: output_tokens,
                    tenant: Some(tenant),
                }
            }
            Workload::Random {
                prompt,
                output,
                lora,
            } => {
                let prompt_tokens = prompt.draw(&mut self.rng);
                let max_tokens = output.draw(&mut self.rng);
                let model = if lora {
                    format!("adapter-{}", self.rng.below(ADAPTERS))
                } else {
                    MODEL.to_owned()
                };
                Req {
                    model,
                    prompt: self.words.draw(&mut self.rng, prompt_tokens),
                    max_tokens,
                    tenant: None,
                }
            }
        }
    }
}

/// What one request observed.
struct Obs {
    ttft: Duration,
    total: Duration,
    tokens: u64,
    /// The server that answered (its `x-inference-pod` header), if it said.
    pod: Option<String>,
    /// Prompt tokens and the server's cached ones, when usage was asked for.
    usage: Option<(u64, u64)>,
}

async fn one(
    host: &str,
    port: u16,
    path: Arc<str>,
    req: Req,
    timeout: Duration,
    usage: bool,
) -> Option<Obs> {
    let mut body = serde_json::json!({
        "model": req.model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "stream": true,
    });
    if usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    let r = tokio::time::timeout(timeout, http::post_json_at(host, port, &path, &body))
        .await
        .ok()?
        .ok()?;
    if r.status != 200 {
        return None;
    }
    // Tokens = SSE events carrying text; the first such chunk's arrival is the TTFT.
    let mut tokens = 0;
    let mut ttft = None;
    let mut cached = None;
    for (at, chunk) in &r.chunks {
        let text = String::from_utf8_lossy(chunk);
        for line in text.lines() {
            let Some(json) = line.strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
                continue;
            };
            let has_text = v["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty());
            if has_text {
                tokens += 1;
                ttft.get_or_insert(*at);
            }
            let u = &v["usage"];
            if let (Some(p), Some(c)) = (
                u["prompt_tokens"].as_u64(),
                u["prompt_tokens_details"]["cached_tokens"].as_u64(),
            ) {
                cached = Some((p, c));
            }
        }
    }
    let pod = r.header("x-inference-pod").map(str::to_owned);
    Some(Obs {
        ttft: ttft?,
        total: r.total,
        tokens,
        pod,
        usage: cached,
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

struct Args {
    port: u16,
    path: String,
    workload: Workload,
    rates: Vec<f64>,
    secs: f64,
    warmup_secs: f64,
    warmup_rate: f64,
    seed: u64,
    timeout: Duration,
    out: Option<String>,
    /// One line per request (stage, send time, tenant, server, TTFT), to
    /// compare contenders request by request: they get the same arrivals.
    requests_out: Option<String>,
    words: Words,
    /// Servers the side traffic goes to, past the router, and its total rate.
    side: Vec<(String, u16)>,
    side_rate: f64,
    /// Ask every answer for its usage (always with side traffic).
    usage: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    let Some(url) = get("--url") else {
        return Ok(None);
    };
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .ok_or("--url must be http://127.0.0.1:PORT (loopback only)")?;
    let port = rest
        .trim_end_matches('/')
        .parse()
        .map_err(|e| format!("--url port: {e}"))?;
    let name = get("--workload").unwrap_or_default();
    let Some(&(_, workload)) = WORKLOADS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = WORKLOADS.iter().map(|(n, _)| *n).collect();
        return Err(format!("--workload {}, got {name:?}", names.join("|")));
    };
    let words = match get("--words") {
        None => Vec::new(),
        Some(f) => {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("--words {f}: {e}"))?;
            let words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
            if words.is_empty() {
                return Err(format!("--words {f}: no words"));
            }
            words
        }
    };
    let num = |name: &str, default: f64| -> Result<f64, String> {
        get(name).map_or(Ok(default), |v| {
            v.parse().map_err(|e| format!("{name} {v:?}: {e}"))
        })
    };
    let rates = get("--rates")
        .ok_or("--rates R1,R2,... required")?
        .split(',')
        .map(|r| r.parse::<f64>().map_err(|e| format!("--rates {r:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err("rates must be positive".into());
    }
    let side = get("--side")
        .map(|list| {
            list.split(',')
                .map(|hp| {
                    let (h, p) = hp
                        .rsplit_once(':')
                        .ok_or_else(|| format!("--side {hp:?}: HOST:PORT"))?;
                    let port = p.parse().map_err(|e| format!("--side {hp:?}: {e}"))?;
                    Ok((h.to_owned(), port))
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .transpose()?
        .unwrap_or_default();
    let side_rate = num("--side-rate", 0.0)?;
    if side.is_empty() != (side_rate == 0.0) || !(side_rate.is_finite() && side_rate >= 0.0) {
        return Err("--side HOST:PORT,... and a positive --side-rate go together".into());
    }
    Ok(Some(Args {
        port,
        path: "/v1/completions".into(),
        workload,
        rates,
        secs: num("--secs", 10.0)?,
        warmup_secs: num("--warmup-secs", 8.0)?,
        warmup_rate: num("--warmup-rate", 8.0)?,
        seed: num("--seed", 1.0)? as u64,
        timeout: Duration::from_secs_f64(num("--timeout", 30.0)?),
        out: get("--out"),
        requests_out: get("--requests-out"),
        words: Words(words),
        side,
        side_rate,
        usage: argv.iter().any(|a| a == "--usage"),
    }))
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            // `cargo bench --workspace` runs every bench without arguments.
            println!(
                "routing: the load generator of benches/routing/run.sh (the routing benchmark); \
                 run that, or pass --url http://127.0.0.1:PORT --workload W --rates R1,R2"
            );
            return;
        }
        Err(e) => {
            eprintln!("routing: {e}");
            std::process::exit(2);
        }
    };
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::fs::File::create(p).expect("cannot create --out file")),
        None => Box::new(std::io::stdout()),
    };
    let mut per_request: Option<Box<dyn Write>> = args.requests_out.as_ref().map(|p| {
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).expect("cannot create --requests-out file"),
        )) as Box<dyn Write>
    });
    let path: Arc<str> = Arc::from(args.path.as_str());
    let mut requests = Gen::new(args.workload, args.seed, args.words);
    let mut arrivals = Rng::new(args.seed ^ 0xA5A5);
    let side = (!args.side.is_empty()).then(|| {
        Side::start(
            requests.sibling(args.seed ^ 0x51DE),
            args.side.clone(),
            args.side_rate,
            Arc::clone(&path),
            args.timeout,
        )
    });
    let usage = side.is_some() || args.usage;
    let stages = std::iter::once((0usize, args.warmup_rate, args.warmup_secs))
        .filter(|s| s.2 > 0.0)
        .chain(
            args.rates
                .iter()
                .enumerate()
                .map(|(i, &r)| (i + 1, r, args.secs)),
        );
    for (index, rate, secs) in stages {
        let start_wall = unix_now();
        let start = Instant::now();
        let side_before = side.as_ref().map(Side::sent);
        let n = (rate * secs).round() as u64;
        let mut tasks = Vec::with_capacity(n as usize);
        let mut at = 0.0;
        for _ in 0..n {
            at += -(1.0 - arrivals.unit()).ln() / rate;
            let req = requests.next();
            let tenant = req.tenant;
            tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
            let task = tokio::spawn(one(
                "127.0.0.1",
                args.port,
                Arc::clone(&path),
                req,
                args.timeout,
                usage,
            ));
            tasks.push((at, tenant, task));
        }
        let send_time = start.elapsed().as_secs_f64();
        let (mut ttft, mut tpot) = (Vec::new(), Vec::new());
        let (mut errors, mut tokens) = (0u64, 0u64);
        let (mut prompt_tokens, mut cached_tokens) = (0u64, 0u64);
        for (i, (at, tenant, t)) in tasks.into_iter().enumerate() {
            let o = t.await.ok().flatten();
            if let Some(w) = per_request.as_mut() {
                let line = serde_json::json!({
                    "stage": index,
                    "i": i,
                    "at_ms": at * 1000.0,
                    "tenant": tenant,
                    "pod": o.as_ref().and_then(|o| o.pod.as_deref()),
                    "ttft_ms": o.as_ref().map(|o| o.ttft.as_secs_f64() * 1000.0),
                    "cached_tokens": o.as_ref().and_then(|o| o.usage).map(|(_, c)| c),
                    "total_ms": o.as_ref().map(|o| o.total.as_secs_f64() * 1000.0),
                });
                writeln!(w, "{line}").expect("cannot write --requests-out");
            }
            match o {
                Some(o) => {
                    ttft.push(o.ttft.as_secs_f64() * 1000.0);
                    if o.tokens > 1 {
                        tpot.push(
                            (o.total - o.ttft).as_secs_f64() * 1000.0 / (o.tokens - 1) as f64,
                        );
                    }
                    tokens += o.tokens;
                    if let Some((p, c)) = o.usage {
                        prompt_tokens += p;
                        cached_tokens += c;
                    }
                }
                None => errors += 1,
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        ttft.sort_by(f64::total_cmp);
        tpot.sort_by(f64::total_cmp);
        let line = serde_json::json!({
            "stage": index,
            "rate": rate,
            "start": start_wall,
            "end": unix_now(),
            "sent": n,
            "sent_rate": n as f64 / send_time.max(1e-9),
            "ok": ttft.len(),
            "errors": errors,
            "ttft_p50_ms": percentile(&ttft, 50.0),
            "ttft_p90_ms": percentile(&ttft, 90.0),
            "ttft_p99_ms": percentile(&ttft, 99.0),
            "tpot_p50_ms": percentile(&tpot, 50.0),
            "tpot_p90_ms": percentile(&tpot, 90.0),
            "output_tokens_per_s": tokens as f64 / elapsed,
            "requests_per_s": ttft.len() as f64 / elapsed,
            "hit_rate": (prompt_tokens > 0).then(|| cached_tokens as f64 / prompt_tokens as f64),
            "side_sent": side.as_ref().zip(side_before).map(|(s, b)| s.sent() - b),
        });
        writeln!(out, "{line}").expect("cannot write results");
        out.flush().expect("cannot write results");
        if let Some(w) = per_request.as_mut() {
            w.flush().expect("cannot write --requests-out");
        }
    }
    if let Some(side) = side {
        let (sent, failed) = side.stop().await;
        eprintln!(
            "routing: side traffic: {sent} requests straight to the servers, {failed} failed"
        );
    }
}

/// The side traffic (`--side`): requests of the workload sent straight to the
/// servers at Poisson arrivals until stopped, each to a server chosen at random.
struct Side {
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Side {
    fn start(
        mut requests: Gen,
        servers: Vec<(String, u16)>,
        rate: f64,
        path: Arc<str>,
        timeout: Duration,
    ) -> Self {
        let sent = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let servers: Arc<[(String, u16)]> = servers.into();
        let (sent2, failed2) = (Arc::clone(&sent), Arc::clone(&failed));
        let task = tokio::spawn(async move {
            let mut rng = Rng::new(requests.rng.next_u64());
            let start = Instant::now();
            let mut at = 0.0;
            let mut inflight = tokio::task::JoinSet::new();
            loop {
                at += -(1.0 - rng.unit()).ln() / rate;
                let req = requests.next();
                let (host, port) = servers[rng.below(servers.len())].clone();
                tokio::select! {
                    _ = tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()) => {}
                    _ = stopped.changed() => break,
                }
                sent2.fetch_add(1, Ordering::Relaxed);
                let (path, failed) = (Arc::clone(&path), Arc::clone(&failed2));
                inflight.spawn(async move {
                    if one(&host, port, path, req, timeout, false).await.is_none() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                });
                // Reap finished requests so the set stays the size of what is in flight.
                while inflight.try_join_next().is_some() {}
            }
            while inflight.join_next().await.is_some() {}
        });
        Self {
            sent,
            failed,
            stop,
            task,
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops sending, waits for what is in flight; (sent, failed).
    async fn stop(self) -> (u64, u64) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}
