//! Serves ext_proc on a port with a static endpoint list and a least-queue
//! scheduler, for trying the service behind a real Envoy without the binary.
//!
//! `cargo run -p epp-extproc --example serve -- 9002 127.0.0.1:8001,127.0.0.1:8002`

use std::{net::SocketAddr, sync::Arc};

use arc_swap::ArcSwap;
use epp_core::{
    Candidate, CycleContext, Endpoint, EndpointMetrics, EndpointSnapshot, Picker, Plugin,
    PluginRef, Scheduler, SchedulingProfile, SingleProfileHandler,
};
use epp_extproc::{ExtProcOptions, ExtProcService};

/// Fewest in-flight requests, ties to the first.
#[derive(Debug)]
struct LeastInflight;
impl Plugin for LeastInflight {
    fn type_name(&self) -> &str {
        "least-inflight"
    }
    fn name(&self) -> &str {
        "least-inflight"
    }
    fn as_picker(&self) -> Option<&dyn Picker> {
        Some(self)
    }
}
impl Picker for LeastInflight {
    fn pick(&self, _: &mut CycleContext<'_>, c: &[Candidate], _: &[f64], out: &mut Vec<usize>) {
        out.extend((0..c.len()).min_by_key(|&i| c[i].endpoint.inflight().requests()));
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().unwrap_or_else(|| "9002".into()).parse()?;
    let list = args.next().unwrap_or_else(|| "127.0.0.1:8000".into());
    let mut endpoints = Vec::new();
    for (i, a) in list.split(',').filter(|s| !s.is_empty()).enumerate() {
        let addr: SocketAddr = a.parse()?;
        let ep = Arc::new(Endpoint::new(u32::try_from(i)?, addr));
        ep.set_metrics(EndpointMetrics::fresh());
        endpoints.push(ep);
    }
    let source = Arc::new(ArcSwap::from_pointee(EndpointSnapshot::new(endpoints)));
    let profile =
        SchedulingProfile::new("default").with_picker(PluginRef::new(Arc::new(LeastInflight)));
    let scheduler = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))?;
    let service = ExtProcService::new(Arc::new(scheduler), source, ExtProcOptions::default());
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    println!("ext_proc listening on {addr}");
    tonic::transport::Server::builder()
        .add_service(service.into_server())
        .serve(addr)
        .await?;
    Ok(())
}
