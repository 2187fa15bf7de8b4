//! gRPC-level tests: a tonic client speaking ext_proc to the service on a
//! loopback port, playing Envoy's part message by message.

mod grpc {
    mod edges;
    pub(crate) mod harness;
    mod request_path;
    mod response_path;
}
