//! `epp`: the endpoint picker process. Flags, config loading, the ext_proc,
//! health and metrics servers, and an orderly shutdown. All scheduling and
//! data logic lives in the library crates; this file only wires them.

mod args;
mod decision_view;
mod health;
mod kube;
mod lora_syncer;
mod metrics;
mod metrics_auth;
mod metrics_server;
mod profiling;
mod reference_flags;
mod telemetry;
mod tls;

use std::{io::IsTerminal, net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;
use epp_core::{
    EndpointSource, Registry,
    config::{BuiltConfig, EndpointPickerConfig},
};
use tokio::net::TcpListener;
use tokio_stream::{StreamExt, wrappers::TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::args::Args;

/// mimalloc instead of the system allocator: each ext_proc stream allocates
/// and frees dozens of small buffers (gRPC frames, headers, the decision), and
/// glibc malloc was ~8–10 % of the server's CPU under load (docs/BENCHMARKS.md).
/// Chosen here, in the binary only; the library crates leave it to embedders.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // `epp lora-syncer ...`: the LoRA adapter syncer, a process of its own.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "lora-syncer")
    {
        return lora_syncer_main();
    }
    let args = Args::parse();
    init_logging(&args);
    if args.check_config {
        return check_config(&args);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if args.worker_threads > 0 {
        builder.worker_threads(usize::from(args.worker_threads));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("epp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn lora_syncer_main() -> ExitCode {
    let args = lora_syncer::SyncerArgs::parse_from(std::env::args_os().skip(1));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("epp lora-syncer: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(lora_syncer::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epp lora-syncer: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &Args) {
    // -v: epp's own debug lines (one per request: the decision and its
    // scores); -vv: every library's debug; -vvv: trace, prompts included.
    let verbose = args.verbose.max(args.reference.verbosity().unwrap_or(0));
    let default = match verbose {
        0 => "info",
        1 => {
            "info,epp=debug,epp_core=debug,epp_extproc=debug,epp_plugins=debug,epp_datalayer=debug"
        }
        2 => "debug,h2=info,hyper=info,tower=info",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: container and file logs stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if args.log_json || args.reference.json_logs() {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Every plugin type this binary knows: scheduling built-ins and the data
/// layer's sources and extractors.
fn registry(args: &Args) -> Registry {
    let mut registry = Registry::new();
    epp_plugins::register_builtins(&mut registry);
    epp_datalayer::register(&mut registry);
    args.reference.apply(&mut registry);
    registry
}

fn load_config(args: &Args) -> Result<EndpointPickerConfig> {
    let config = match (&args.config_file, &args.config_text) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            EndpointPickerConfig::parse(&text, &path.display().to_string())?
        }
        (None, Some(text)) => EndpointPickerConfig::parse(text, "--config-text")?,
        (None, None) => EndpointPickerConfig::default_config(&registry(args))?,
    };
    Ok(config)
}

/// `--check-config`: validate (including building every plugin), print the
/// effective config, exit 0 when valid.
fn check_config(args: &Args) -> ExitCode {
    let checked = load_config(args).and_then(|config| Ok(config.build(&registry(args))?));
    match checked {
        Ok(built) => {
            print!("{}", built.effective_yaml);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("epp: invalid config: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where endpoints come from: `--endpoints`, then `--endpoints-file`
/// (checked every refresh interval, at most every 50 ms), then the file of
/// the config's `dataLayer.discovery` plugin (llm-d's `file-discovery`,
/// watched the same way), each owning its part of the endpoint store.
/// (Kubernetes discovery would be one more.)
fn discoveries(
    args: &Args,
    discovery: Option<&epp_core::PluginRef>,
) -> Result<Vec<Box<dyn epp_datalayer::Discovery>>> {
    let mut out: Vec<Box<dyn epp_datalayer::Discovery>> = Vec::new();
    if !args.endpoints.is_empty() {
        let flag = epp_datalayer::StaticDiscovery::parse(&args.endpoints)
            .context("invalid --endpoints")?
            .named("flag:--endpoints");
        out.push(Box::new(flag));
    }
    if let Some(file) = &args.endpoints_file {
        let poll = args.refresh_metrics_interval.min(Duration::from_millis(50));
        out.push(Box::new(
            epp_datalayer::FileDiscovery::new(file.clone()).with_poll_interval(poll),
        ));
    }
    let configured = discovery.and_then(|d| d.plugin().as_endpoint_discovery()?.endpoints_file());
    if let Some(file) = configured {
        let poll = args.refresh_metrics_interval.min(Duration::from_millis(50));
        out.push(Box::new(
            epp_datalayer::FileDiscovery::new(file.to_path_buf()).with_poll_interval(poll),
        ));
    }
    Ok(out)
}

/// The ext_proc settings from flags and the config's objectives and rewrite rules.
fn extproc_options(args: &Args, built: &BuiltConfig) -> epp_extproc::ExtProcOptions {
    let model_rewrite = (!built.model_rewrites.is_empty())
        .then(|| Arc::new(built.model_rewrites.clone()) as Arc<dyn epp_extproc::ModelRewrite>);
    epp_extproc::ExtProcOptions {
        max_body_bytes: args.max_request_body_bytes,
        objectives: built.objectives.clone(),
        model_rewrite,
        parsers: built.parsers.clone(),
        renderer: renderer(built),
        prefix_lookup: built
            .plugins
            .iter()
            .find_map(|(_, p)| p.plugin().prefix_lookup()),
        pool_name: args.pool_label().to_owned(),
        ..epp_extproc::ExtProcOptions::default()
    }
}

/// The renderer a token producer provides (in-process chat templates) or
/// asks for (the `vllm` backend's render client), if any.
fn renderer(built: &BuiltConfig) -> Option<Arc<dyn epp_core::PromptRenderer>> {
    if let Some(own) = built
        .plugins
        .iter()
        .find_map(|(_, p)| p.plugin().prompt_renderer())
    {
        return Some(own);
    }
    let (name, service) = built
        .plugins
        .iter()
        .find_map(|(name, p)| Some((name, p.plugin().render_service()?)))?;
    match epp_datalayer::VllmRenderer::new(service) {
        Ok(r) => Some(Arc::new(r)),
        Err(e) => {
            // The plugin checked the URL at load; a second refusal is a bug.
            tracing::error!(plugin = %name, error = %e, "cannot create the render client");
            None
        }
    }
}

/// Connects every plugin that keeps its blocks in a shared index (Redis or
/// Valkey) to it. Connecting happens in the background: epp starts, and
/// routes by its own view, while the server is unreachable.
fn bind_shared_indexes(plugins: &[(String, epp_core::PluginRef)], shutdown: &CancellationToken) {
    for (name, p) in plugins {
        let plugin = p.plugin();
        if let Some(spec) = plugin.shared_index() {
            tracing::info!(
                plugin = %name,
                backend = %spec.backend,
                server = %format_args!("{}:{}", spec.address.host, spec.address.port),
                "shared prefix index"
            );
            let store = epp_datalayer::RedisBlockIndex::start(&spec, shutdown.clone());
            plugin.bind_shared_index(Arc::new(store));
        }
    }
}

/// The cross-replica syncer the config names (`dataLayer.crossReplicaSyncerPluginRef`),
/// bound to its address; `None` without one, or for one that shares nothing.
fn peer_sync(built: &epp_core::config::BuiltConfig) -> Result<Option<epp_datalayer::PeerSync>> {
    let Some(replicas) = &built.replicas else {
        return Ok(None);
    };
    let syncer = replicas.syncer.plugin();
    let Some(listen) = syncer.as_replica_syncer().and_then(|s| s.listen_address()) else {
        tracing::info!(
            syncer = syncer.name(),
            r#type = syncer.type_name(),
            "the cross-replica syncer shares nothing: this replica routes on its own view"
        );
        return Ok(None);
    };
    let peers = replicas
        .peers
        .as_ref()
        .and_then(|p| p.plugin().as_peer_discovery())
        .map(|d| d.peer_addresses().to_vec())
        .unwrap_or_default();
    if peers.is_empty() {
        tracing::warn!(
            syncer = syncer.name(),
            "no dataLayer.peerDiscovery: this replica hears its peers but sends to none"
        );
    }
    epp_datalayer::PeerSync::bind(listen, peers, replicas.interval)
        .map(Some)
        .with_context(|| format!("cannot listen for epp peers on {listen}"))
}

async fn bind(args: &Args, port: u16, what: &str) -> Result<TcpListener> {
    let addr = SocketAddr::new(args.bind_address, port);
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}"))
}

async fn run(args: Args) -> Result<()> {
    let mut signals = ShutdownSignals::listen();
    args.reference.report();
    let config = load_config(&args)?;
    let built = config.build(&registry(&args))?;
    let options = extproc_options(&args, &built);
    let mut prom = prometheus_client::registry::Registry::default();
    let peer_sync = peer_sync(&built)?;
    let mut scheduler = built
        .scheduler
        .with_staleness_threshold(args.metrics_staleness_threshold);
    if let Some(sync) = &peer_sync {
        scheduler = scheduler.with_replica_feed(sync.feed());
    }
    let generations = args.metrics_generations;
    metrics::register_info(&mut prom, generations);
    let plugin_durations =
        metrics::PluginDurations::register(&mut prom, &scheduler.call_sites(), generations);
    metrics::PluginReports::register(&mut prom, &built.plugins);
    let scheduler = Arc::new(scheduler.with_observer(Arc::new(plugin_durations)));
    let (options, trace_exporter) = tracing_setup(&args, options, &mut prom)?;

    let shutdown = CancellationToken::new();
    bind_shared_indexes(&built.plugins, &shutdown);
    let store = Arc::new(epp_datalayer::EndpointStore::new());
    let source: Arc<dyn EndpointSource> = store.clone();
    if let Some(sync) = peer_sync {
        sync.register_metrics(&mut prom);
        sync.start(Arc::clone(&source), &built.plugins, shutdown.child_token())
            .context("cannot start sharing state with epp peers")?;
    }

    for discovery in discoveries(&args, built.discovery.as_ref())? {
        discovery
            .start(Arc::clone(&store), shutdown.child_token())
            .with_context(|| {
                format!(
                    "cannot start endpoint discovery {}",
                    discovery.source_name()
                )
            })?;
        discovery.register_metrics(&mut prom);
    }
    let kube = kube::Kube::start(
        &args,
        built.discovery.is_some(),
        &store,
        &shutdown,
        &mut prom,
    )
    .await?;
    let options = kube.with_cluster_directives(options, &shutdown).await?;
    // Every discovery published its first set before `start` returned;
    // Kubernetes' own state (sync, pool, permissions, leadership) is the gate.
    let readiness = Arc::new(health::Readiness::new(kube.gate()));
    readiness.set_synced(true);
    let ext_proc =
        epp_extproc::ExtProcService::new(Arc::clone(&scheduler), Arc::clone(&source), options);
    // Flow control (gate `flowControl`): every scrape may free room for a
    // queued request, so the data layer tells the service after each one.
    let flow_on = built.flow_settings.is_some();
    ext_proc.set_flow_control(built.flow_settings.clone());
    let data_layer = epp_datalayer::DataLayer::start(
        Arc::clone(&store),
        &built.data_layer,
        epp_datalayer::DataLayerOptions {
            refresh_interval: args.refresh_metrics_interval,
            listener: flow_on
                .then(|| Arc::new(ext_proc.clone()) as Arc<dyn epp_core::flow::MetricsListener>),
            ..epp_datalayer::DataLayerOptions::default()
        },
        shutdown.child_token(),
    )?;

    let pool = Arc::new(metrics::PoolGauges::register(
        &mut prom,
        args.pool_label(),
        args.metrics_staleness_threshold,
        generations,
    ));
    data_layer.register_metrics(&mut prom);
    if generations.llm_d {
        data_layer.register_llm_d_metrics(&mut prom);
    }
    ext_proc.register_metrics_as(&mut prom, generations);
    let decisions = (args.decision_log_size > 0).then(|| {
        let log = Arc::new(epp_extproc::DecisionLog::new(
            args.decision_log_size,
            args.decision_log_interval,
        ));
        ext_proc.set_decision_log(Some(Arc::clone(&log)));
        decision_view::DecisionView {
            log,
            staleness: args.metrics_staleness_threshold,
        }
    });

    let metrics_port = metrics_port(&args, kube.client(), &shutdown).await?;
    let grpc_listener = bind(&args, args.grpc_port, "ext_proc").await?;
    let health_listener = bind(&args, args.grpc_health_port, "gRPC health").await?;
    let metrics_listener = bind(&args, args.metrics_port, "metrics").await?;
    // Tests and scripts wait for this line; it carries the real ports when 0 was asked.
    println!(
        "epp listening: ext_proc={} health={} metrics={} tls={}",
        grpc_listener.local_addr()?,
        health_listener.local_addr()?,
        metrics_listener.local_addr()?,
        args.secure_serving,
    );

    // Health: ready once discovery synced; first to turn on shutdown.
    let health_stop = CancellationToken::new();
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let live_reporter = reporter.clone();
    let health_task = tokio::spawn(health::track(
        reporter,
        readiness,
        Arc::clone(&source),
        args.metrics_staleness_threshold,
        health_stop.clone(),
    ));
    let health_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(health_listener),
                shutdown.clone().cancelled_owned(),
            ),
    );
    let metrics_server = tokio::spawn(metrics_server::serve(
        metrics_listener,
        Arc::new(metrics_server::MetricsServer {
            registry: Arc::new(prom),
            pool,
            source: Arc::clone(&source),
            auth: metrics_port.auth,
            profiler: metrics_port.profiler,
            tls: metrics_port.tls,
            decisions,
        }),
        shutdown.clone(),
    ));

    let serve_stop = CancellationToken::new();
    // The lean server on h2: one task per connection. Once `serve_stop`
    // fires, no connection is accepted, each one gets a GOAWAY, and the
    // task ends when the streams in flight have.
    let h2 = epp_extproc::H2Options {
        keepalive_interval: Some(Duration::from_secs(30)),
        ..epp_extproc::H2Options::default()
    };
    let stopped = serve_stop.clone().cancelled_owned();
    let ext_proc_server = if args.secure_serving {
        let acceptor = tls::acceptor(args.cert_path.clone(), shutdown.clone())?;
        let incoming = tls::incoming(grpc_listener, acceptor, serve_stop.clone());
        tokio::spawn(async move { ext_proc.serve_incoming(incoming, h2, stopped).await })
    } else {
        // Without TCP_NODELAY, replies to Envoy wait on its delayed ACKs
        // (~40 ms per request).
        let incoming = TcpListenerStream::new(grpc_listener).map(|conn| {
            conn.inspect(|tcp| {
                let _ = tcp.set_nodelay(true);
            })
        });
        tokio::spawn(async move { ext_proc.serve_incoming(incoming, h2, stopped).await })
    };

    signals.recv().await;
    // As the reference: NOT_SERVING and the lease released at once, then
    // ext_proc keeps serving (new streams too: Envoy may not have seen the
    // health change yet) for the drain timeout.
    tracing::info!(drain = ?args.drain_timeout, grace = ?args.shutdown_grace_period,
        "shutting down: health NOT_SERVING, still serving ext_proc for the drain timeout");
    health_stop.cancel();
    let _ = health_task.await;
    kube.step_down().await;
    tokio::select! {
        () = tokio::time::sleep(args.drain_timeout) => {}
        () = signals.recv() => tracing::info!("second signal: drain ended early"),
    }
    tracing::info!("drain over: no new ext_proc streams; waiting for in-flight ones");
    live_reporter
        .set_service_status("liveness", tonic_health::ServingStatus::NotServing)
        .await;
    serve_stop.cancel();
    match tokio::time::timeout(args.shutdown_grace_period, ext_proc_server).await {
        Ok(Ok(())) => tracing::info!("all ext_proc streams finished"),
        Ok(Err(e)) => tracing::warn!(error = %e, "ext_proc server task failed"),
        Err(_) => tracing::warn!("grace period over; dropping remaining streams"),
    }
    if let Some(exporter) = trace_exporter {
        exporter.shutdown().await;
    }
    shutdown.cancel();
    let _ = health_server.await;
    let _ = metrics_server.await;
    data_layer.stop().await;
    Ok(())
}

/// `--tracing` and the `OTEL_*` variables: the tracer in the ext_proc
/// options and the exporter to flush on shutdown, or neither.
fn tracing_setup(
    args: &Args,
    mut options: epp_extproc::ExtProcOptions,
    prom: &mut prometheus_client::registry::Registry,
) -> Result<(epp_extproc::ExtProcOptions, Option<telemetry::Exporter>)> {
    let env = |var: &str| std::env::var(var).ok();
    let config = telemetry::configure(args.reference.tracing, &env)
        .context("invalid tracing configuration")?;
    let Some(config) = config else {
        if args.reference.tracing == Some(true) {
            tracing::info!(
                "--tracing given, but OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none turns it off"
            );
        }
        return Ok((options, None));
    };
    let (tracer, exporter) = telemetry::start(config, prom);
    options.tracer = Some(tracer);
    Ok((options, Some(exporter)))
}

/// What the metrics port needs from the flags: who may read it, profiling,
/// TLS.
struct MetricsPort {
    auth: metrics_auth::MetricsAuth,
    profiler: Option<profiling::Profiler>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

async fn metrics_port(
    args: &Args,
    client: Option<::kube::Client>,
    shutdown: &CancellationToken,
) -> Result<MetricsPort> {
    let flags = &args.reference;
    let auth = metrics_auth::choose(
        flags.metrics_endpoint_auth,
        client,
        std::env::var("EPP_METRICS_BEARER_TOKEN").ok(),
    )
    .await?;
    let tls = match (&flags.metrics_cert_dir, &flags.metrics_client_ca_file) {
        (None, None) => None,
        (None, Some(_)) => anyhow::bail!("--metrics-client-ca-file needs --metrics-cert-dir"),
        (Some(_), None) if matches!(auth, metrics_auth::MetricsAuth::Open) => anyhow::bail!(
            "--metrics-cert-dir would serve metrics over TLS to anyone: also give --metrics-client-ca-file, keep --metrics-endpoint-auth on against a cluster, or set EPP_METRICS_BEARER_TOKEN"
        ),
        (Some(dir), ca) => Some(tls::metrics_acceptor(dir, ca.as_deref(), shutdown.clone())?),
    };
    let profiler = flags
        .enable_pprof
        .unwrap_or(true)
        .then(|| profiling::Profiler::new(shutdown.clone()));
    tracing::info!(
        auth = auth.describe(),
        tls = tls.is_some(),
        client_certificates = flags.metrics_client_ca_file.is_some(),
        pprof = profiler.is_some(),
        "metrics port"
    );
    Ok(MetricsPort {
        auth,
        profiler,
        tls,
    })
}

/// SIGTERM and SIGINT, listened for from the moment this is made. Made
/// first thing: a signal that arrives while epp starts (a pod deleted right
/// after its start, a test stopping epp as soon as it printed its ports) is
/// kept for [`Self::recv`], where it used to kill the process by the
/// default action, with no drain and no exit status.
struct ShutdownSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn listen() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Self {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// The next SIGTERM or SIGINT (never, for one that could not be
    /// listened for).
    async fn recv(&mut self) {
        async fn next(s: Option<&mut tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let Self { term, int } = self;
        tokio::select! {
            () = next(term.as_mut()) => {}
            () = next(int.as_mut()) => {}
        }
    }
}
