//! A zero-copy Prometheus text (0.0.4) / OpenMetrics 1.0 sample parser and a
//! series selector that extracts many series from one page in a single pass.
//!
//! Names and label values borrow from the input; a label value is unescaped
//! (allocating) only when it contains an escape. Comment lines (`# HELP`,
//! `# TYPE`, `# UNIT`, `# EOF`, plain comments) and blank lines are skipped by
//! the sample iterator. Errors carry line and column and never panic.
//!
//! ```
//! use epp_promtext::{SelectorSet, Selector};
//!
//! let page = "# TYPE vllm:num_requests_waiting gauge\n\
//!             vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
//!             vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 4.0\n\
//!             vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n";
//! let set = SelectorSet::new(vec![
//!     Selector::parse("vllm:num_requests_waiting").unwrap(),
//!     Selector::parse("vllm:kv_cache_usage_perc{engine=\"0\"}").unwrap(),
//! ]);
//! let mut waiting = 0.0;
//! let mut kv = None;
//! let report = set.scan(page, |i, sample| match i {
//!     0 => waiting += sample.value,
//!     _ => kv = Some(sample.value),
//! });
//! assert_eq!((waiting, kv, report.errors), (7.0, Some(0.25), 0));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod parse;
mod selector;

pub use parse::{ErrorKind, Labels, ParseError, Sample, Samples, parse_sample, samples};
pub use selector::{ScanReport, Selector, SelectorError, SelectorSet};
