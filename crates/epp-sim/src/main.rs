//! `epp-sim`: a simulated vLLM-compatible model server.

use std::process::ExitCode;

use clap::Parser;
use epp_sim::config::SimConfig;

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = SimConfig::parse();
    let result = epp_sim::serve(cfg, |addr| {
        // Tests and scripts wait for this line (it carries the real port).
        println!("epp-sim listening on {addr}");
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
