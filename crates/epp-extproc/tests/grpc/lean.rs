//! The shared gRPC tests, against the lean server on `h2` (`serve_incoming`).

/// The harness, starting this server.
mod harness {
    pub(crate) use super::super::harness::*;
    use epp_extproc::ExtProcOptions;

    pub(crate) const SERVER: Server = Server::Lean;

    pub(crate) async fn start(queues: &[u32], options: ExtProcOptions) -> Fixture {
        start_on(SERVER, queues, options).await
    }
}

#[path = "edges.rs"]
mod edges;
#[path = "lean_only.rs"]
mod lean_only;
#[path = "protocol.rs"]
mod protocol;
#[path = "request_path.rs"]
mod request_path;
#[path = "response_path.rs"]
mod response_path;
