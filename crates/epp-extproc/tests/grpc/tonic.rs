//! The shared gRPC tests, against the tonic service (`into_server()`).

/// The harness, starting this server.
mod harness {
    pub(crate) use super::super::harness::*;
    use epp_extproc::ExtProcOptions;

    pub(crate) const SERVER: Server = Server::Tonic;

    pub(crate) async fn start(queues: &[u32], options: ExtProcOptions) -> Fixture {
        start_on(SERVER, queues, options).await
    }
}

#[path = "edges.rs"]
mod edges;
#[path = "protocol.rs"]
mod protocol;
#[path = "request_path.rs"]
mod request_path;
#[path = "response_path.rs"]
mod response_path;
