//! A zero-copy parser for the Prometheus text exposition format 0.0.4 and
//! OpenMetrics 1.0 text, and a series selector that extracts many series
//! from one page in a single pass.
//!
//! Three ways in, from cheapest to richest:
//!
//! - [`SelectorSet::scan`]: the data layer's hot path. Lines whose name no
//!   selector wants are skipped after reading the name; the rest are parsed
//!   and handed to a callback with the selector's index. No allocation per
//!   line.
//! - [`lines`] / [`samples`]: streaming iterators over every line; names,
//!   label names and values borrow from the page (a value is unescaped, and
//!   allocated, only if it contains a backslash).
//! - [`families`]: families with HELP/TYPE/UNIT attached and histograms and
//!   summaries assembled (allocates).
//!
//! Errors are small `Copy` values ([`ParseError`]: line, column, what was
//! expected, an excerpt). [`Mode::Strict`] stops at the first malformed line,
//! [`Mode::Lenient`] reports it and goes on. No input makes the parser panic
//! (fuzzed; see `fuzz/`).
//!
//! # What is accepted
//!
//! - `# HELP` (escapes `\\`, `\n`, `\"`), `# TYPE` (any 0.0.4 or OpenMetrics
//!   type, case-insensitive), `# UNIT`, `# EOF` (anything after it is an
//!   error), other `#` comments, blank lines.
//! - Samples: `name{label="value",...} value [timestamp] [# {labels} value
//!   [timestamp]]`, with blanks or tabs between tokens, blanks inside the
//!   braces, `{}`, a trailing comma, leading indentation, `\r\n` line ends and
//!   no final newline. Values and timestamps: decimals with exponents,
//!   `NaN`, `Inf`/`+Inf`/`-Inf`/`infinity` in any case; integers without `.0`.
//! - Label values may escape any character; `\\`, `\"` and `\n` are
//!   translated and other escapes are kept as written (as Prometheus' own
//!   parser does).
//! - `_bucket`, `_count`, `_sum`, `_created`, `_total`, quantile lines in any
//!   order and interleaving.
//!
//! A label name repeated within one label set is an error
//! ([`ErrorKind::DuplicateLabel`]): the line is skipped and reported in
//! lenient mode, and stops a strict parse. Not checked (accepted as
//! written): duplicate series, sample order within a family. Not supported: the
//! Prometheus 3 quoted UTF-8 metric-name syntax (`{"my.metric"}`) and the
//! protobuf format.
//!
//! ```
//! use epp_promtext::{SelectorSet, samples};
//!
//! let page = "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
//!             ## TYPE vllm:num_requests_waiting gauge\n\
//!             vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
//!             vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 4.0\n\
//!             vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
//!             vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n";
//!
//! // One pass, many selectors: sum waiting over engines, average KV usage.
//! let set = SelectorSet::from_specs(&["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"])?;
//! let (mut waiting, mut kv, mut engines) = (0.0, 0.0, 0);
//! let report = set.scan(page, |i, s| match i {
//!     0 => waiting += s.value,
//!     _ => (kv, engines) = (kv + s.value, engines + 1),
//! });
//! assert_eq!((waiting, kv / f64::from(engines)), (7.0, 0.5));
//! assert_eq!(report.errors, 0);
//!
//! // Or every sample, borrowed from the page.
//! let first = samples(page).next().unwrap()?;
//! assert_eq!(first.label("engine").as_deref(), Some("0"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod family;
mod grammar;
mod lines;
mod sample;
mod selector;
mod value;

pub use error::{ErrorKind, ParseError, SNIPPET_LEN, SelectorError};
pub use family::{Family, Label, Metric, families, families_lenient};
pub use lines::{Line, Lines, MetricType, Mode, Samples, lines, samples};
pub use sample::{Exemplar, Labels, Sample, parse_sample};
pub use selector::{ScanReport, Selector, SelectorSet};
