//! Test support of the epp-rs workspace, shared by the crates' tests, benches
//! and examples (never published).
//!
//! It depends on epp-core alone, so that epp-plugins, epp-datalayer and
//! epp-extproc can take it as a dev-dependency, in-crate unit tests included,
//! without a second copy of themselves in the build.
//!
//! - [`endpoints`]: endpoints, candidates and cycle contexts, built one way.
//! - [`plugins`]: small plugins whose decisions a test can work out by hand.
//! - [`workload`]: the scheduling cycle the cycle benchmark measures.
//! - [`process`] and [`http`]: simulators, epp and Envoy as real processes on
//!   loopback, and a small HTTP client, for end-to-end tests and benchmarks.
//! - [`metrics_farm`]: one child process serving a vLLM metrics page on every
//!   loopback address, counting scrapes per client, for data-layer benchmarks.
//! - [`kube`]: a real kube-apiserver (and etcd) started through
//!   `scripts/kube-env.sh`, and the objects Kubernetes discovery reads.
//! - [`helm`]: real helm (built from its Go module by `scripts/helm.sh`)
//!   rendering the charts under `deploy/charts/`.
//! - [`otelcol`]: a real OpenTelemetry Collector (built from its Go modules
//!   by `scripts/otelcol.sh`) and the spans it wrote.
//! - [`chromium`]: headless Chromium (Debian's package) loading a page and
//!   returning the DOM its script built.
//! - [`wait`]: bounded waiting for what another task or process does.
//! - [`stats`]: percentiles of measured samples.
//! - [`tokenizer`]: a small byte-level BPE `tokenizer.json` built here, for
//!   tests that need real token ids (never fetched from a hub).
//!
//! ```
//! use epp_core::{EndpointSnapshot, InferenceRequest};
//! use epp_test_support::{
//!     endpoints::with_queues,
//!     plugins::{BestScoresPicker, scheduler, short_queue_profile},
//! };
//!
//! // Three endpoints with queues 4, 0 and 2: the shortest queue wins, the
//! // next shortest is the fallback.
//! let snapshot = EndpointSnapshot::new(with_queues(&[4, 0, 2]));
//! let request = InferenceRequest::builder("m").build();
//! let profile = short_queue_profile(BestScoresPicker::new(2));
//! let result = scheduler(profile).schedule(&request, &snapshot).unwrap();
//! let picked: Vec<String> = result.primary_run().unwrap().targets.iter()
//!     .map(|e| e.addr().to_string())
//!     .collect();
//! assert_eq!(picked, ["10.0.0.2:8000", "10.0.0.3:8000"]);
//! ```
#![warn(missing_docs)]
#![expect(
    clippy::unwrap_used,
    reason = "test support: a failed set-up is a failed test, and panics say where"
)]

pub mod chromium;
pub mod endpoints;
pub mod flow;
pub mod helm;
pub mod http;
pub mod kube;
pub mod metrics_farm;
pub mod otelcol;
pub mod plugins;
pub mod process;
pub mod prometheus;
pub mod redis;
pub mod reference;
pub mod side_by_side;
pub mod stats;
pub mod tokenizer;
pub mod wait;
pub mod workload;
