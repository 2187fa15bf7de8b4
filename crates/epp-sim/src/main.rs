//! `epp-sim`: a simulated vLLM-compatible model server.

use std::process::ExitCode;

use clap::Parser;
use epp_sim::config::SimConfig;

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = SimConfig::parse();
    let topic = cfg
        .kv_events_config
        .as_ref()
        .map(|k| k.topic.clone())
        .unwrap_or_default();
    let result = epp_sim::serve(cfg, |bound| {
        // Tests and scripts wait for this line (it carries the real port).
        println!("epp-sim listening on {}", bound.http);
        if let Some(ep) = &bound.kv_events {
            println!("epp-sim kv events on {ep} (topic {topic:?})");
        }
        if let Some(ep) = &bound.kv_events_replay {
            println!("epp-sim kv events replay on {ep}");
        }
    })
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epp-sim: {e}");
            ExitCode::FAILURE
        }
    }
}
