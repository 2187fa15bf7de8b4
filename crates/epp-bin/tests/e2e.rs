//! End-to-end tests: real Envoy, real epp, simulator processes, on loopback.
//! If Envoy is missing they fail with the command that installs it.

mod common;

mod e2e {
    mod errors;
    mod prefix;
    mod routing;
    mod streaming;
}
