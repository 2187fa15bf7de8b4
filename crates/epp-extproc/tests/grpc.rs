//! gRPC-level tests: a tonic client speaking ext_proc to the service on a
//! loopback port, playing Envoy's part message by message. Every test runs
//! against both servers: the tonic service (`into_server()`) and the lean
//! one on `h2` (`serve_incoming`).
#![expect(
    clippy::duplicate_mod,
    reason = "the shared tests are compiled once per server, each against its own `start`"
)]

mod grpc {
    pub(crate) mod harness;
    mod lean;
    mod tonic;
}
