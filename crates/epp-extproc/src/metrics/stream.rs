//! What the ext_proc streams cost epp, under llm-d's names: the streams
//! open, how long each stayed open and how it ended
//! (`llm_d_epp_extproc_*`), the time from a request's headers to the answer
//! of its decision (`llm_d_epp_request_processing_duration_seconds`) and
//! the time epp spent on its response
//! (`llm_d_epp_response_processing_duration_seconds`). Atomics and
//! lock-free histograms, no labels from requests: nothing is allocated.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{
    Store,
    encode::{LabelValues, encode_counters},
    hist::{self, AtomicHistogram, HistogramValue},
};

/// How an ext_proc stream ended: the gRPC status code llm-d labels it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// The gateway ended it (or reset it, `CANCELLED`), or epp answered
    /// and closed it.
    Ok,
    /// Dropped before it ended: the connection went away or the server
    /// stopped.
    Canceled,
    /// Reading from the gateway failed.
    Unknown,
}

impl StreamEnd {
    const ALL: [Self; 3] = [Self::Ok, Self::Canceled, Self::Unknown];

    /// gRPC's name of the code (Go's `codes.Code.String()`).
    fn code(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Canceled => "Canceled",
            Self::Unknown => "Unknown",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Ok => 0,
            Self::Canceled => 1,
            Self::Unknown => 2,
        }
    }

    /// How a stream whose read failed with `code` ended: a reset by the
    /// gateway is a normal end (llm-d returns no error for it).
    pub(crate) fn read_failed(code: tonic::Code) -> Self {
        match code {
            tonic::Code::Cancelled => Self::Ok,
            _ => Self::Unknown,
        }
    }
}

#[derive(Debug)]
pub(crate) struct StreamMetrics {
    open: AtomicI64,
    duration: AtomicHistogram,
    /// Per [`StreamEnd::index`].
    ended: [AtomicU64; StreamEnd::ALL.len()],
    request_processing: AtomicHistogram,
    response_processing: AtomicHistogram,
}

impl Default for StreamMetrics {
    fn default() -> Self {
        Self {
            open: AtomicI64::new(0),
            duration: AtomicHistogram::new(hist::STREAM),
            ended: std::array::from_fn(|_| AtomicU64::new(0)),
            request_processing: AtomicHistogram::new(hist::REQUEST_PROCESSING),
            response_processing: AtomicHistogram::new(hist::RESPONSE_PROCESSING),
        }
    }
}

impl StreamMetrics {
    /// A request's decision was answered (routed or refused), or it was
    /// given up while waiting in flow control, `took` after its headers.
    pub(crate) fn request_processed(&self, took: Duration) {
        self.request_processing.observe(took.as_secs_f64());
    }

    /// A routed request's stream ended after epp spent `took` on its
    /// response.
    pub(crate) fn response_processed(&self, took: Duration) {
        self.response_processing.observe(took.as_secs_f64());
    }

    /// The llm-d families.
    pub(super) fn encode(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let mut m = enc.encode_descriptor(
            "llm_d_epp_extproc_streams_inflight",
            "ext_proc gRPC streams open now",
            None,
            MetricType::Gauge,
        )?;
        m.encode_gauge(&self.open.load(Relaxed))?;
        for (name, help, h) in [
            (
                "llm_d_epp_extproc_stream_duration_seconds",
                "How long each ext_proc gRPC stream stayed open",
                &self.duration,
            ),
            (
                "llm_d_epp_request_processing_duration_seconds",
                "Time from a request's headers until its decision was answered (routed or \
                 refused), flow-control wait included",
                &self.request_processing,
            ),
            (
                "llm_d_epp_response_processing_duration_seconds",
                "Time epp spent on a routed request's response: its handling of each response \
                 message (and the time it held a plain JSON body to write a rewritten model back)",
                &self.response_processing,
            ),
        ] {
            let mut v = HistogramValue::default();
            h.add_to(&mut v);
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
            m.encode_histogram::<NoLabelSet>(v.sum, v.count(), &v.buckets(), None)?;
        }
        let ended: std::collections::BTreeMap<LabelValues, u64> = StreamEnd::ALL
            .iter()
            .map(|e| (*e, self.ended[e.index()].load(Relaxed)))
            .filter(|(_, n)| *n > 0)
            .map(|(e, n)| (vec![("code", e.code().to_owned())], n))
            .collect();
        encode_counters(
            enc,
            "llm_d_epp_extproc_streams",
            "ext_proc gRPC streams ended, by gRPC status code",
            &ended,
        )
    }
}

/// One open ext_proc stream: counted open until dropped, then counted by
/// how it ended ([`Self::end`], [`StreamEnd::Canceled`] unless set) with
/// its duration.
#[derive(Debug)]
pub(crate) struct OpenStream {
    store: Arc<Store>,
    opened: Instant,
    end: StreamEnd,
}

impl OpenStream {
    pub(super) fn new(store: Arc<Store>, opened: Instant) -> Self {
        store.streams.open.fetch_add(1, Relaxed);
        Self {
            store,
            opened,
            end: StreamEnd::Canceled,
        }
    }

    /// The stream ends this way (counted when it is dropped).
    pub(crate) fn end(&mut self, end: StreamEnd) {
        self.end = end;
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let s = &self.store.streams;
        s.open.fetch_sub(1, Relaxed);
        s.duration.observe(self.opened.elapsed().as_secs_f64());
        s.ended[self.end.index()].fetch_add(1, Relaxed);
    }
}
