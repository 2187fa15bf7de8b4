//! `embedded-gateway --listen 127.0.0.1:8080 --endpoints 127.0.0.1:8001,127.0.0.1:8002 [--config epp.yaml]`
//!
//! An OpenAI-compatible reverse proxy routing every request to the model
//! server epp-rs's scheduler picks. Prints `gateway listening: ADDR` once
//! ready; Ctrl-C or SIGTERM stops it.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context, bail};
use embedded_gateway::{Gateway, GatewayOptions};

fn options() -> anyhow::Result<GatewayOptions> {
    let mut options = GatewayOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => options.listen = value()?.parse::<SocketAddr>()?,
            "--endpoints" => options.endpoints = vec![value()?],
            "--config" => {
                let path = value()?;
                options.config = Some(
                    std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read {path}"))?,
                );
            }
            "--refresh-ms" => {
                options.refresh_interval = Duration::from_millis(value()?.parse()?);
            }
            other => bail!("unknown flag {other}; see the top of src/main.rs"),
        }
    }
    if options.endpoints.is_empty() {
        bail!("--endpoints ip:port,... is required");
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let gateway = Gateway::start(options()?).await?;
    println!("gateway listening: {}", gateway.local_addr());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    gateway.stop().await;
    Ok(())
}
