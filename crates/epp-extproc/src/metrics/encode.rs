//! Writes the request series under each generation's names and labels.
//! Generations with fewer labels get the series added together here, at
//! scrape time, never on the request path.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, PoisonError, atomic::Ordering::Relaxed},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeGaugeValue, NoLabelSet},
    metrics::MetricType,
};

use super::{
    MetricGenerations, RequestSeries, SeriesKey, Store,
    hist::{AtomicHistogram, HistogramValue},
};

/// The collector registered in the binary's registry.
#[derive(Debug)]
pub(crate) struct RequestCollector {
    pub(crate) store: Arc<Store>,
    pub(crate) generations: MetricGenerations,
}

/// Which labels a family carries.
#[derive(Debug, Clone, Copy)]
enum Labels {
    /// `model_name`.
    Model,
    /// `model_name`, `target_model_name`.
    ModelTarget,
    /// `model_name`, `target_model_name`, `priority`.
    ModelTargetPriority,
    /// `model_name`, `target_model_name`, `fairness_id`, `priority`.
    Full,
}

impl Labels {
    fn of(self, k: &SeriesKey) -> Vec<(&'static str, String)> {
        let mut v = vec![("model_name", k.model.clone())];
        if matches!(self, Self::Model) {
            return v;
        }
        v.push(("target_model_name", k.target.clone()));
        if matches!(self, Self::Full) {
            v.push(("fairness_id", k.fairness.clone()));
        }
        if matches!(self, Self::Full | Self::ModelTargetPriority) {
            v.push(("priority", k.priority.to_string()));
        }
        v
    }
}

pub(super) type LabelValues = Vec<(&'static str, String)>;

/// One family's name in each generation (`None`: not in that generation).
struct Names {
    inference_model: Option<(&'static str, Labels)>,
    inference_objective: Option<(&'static str, Labels)>,
    llm_d: Option<(&'static str, Labels)>,
    help: &'static str,
}

impl Names {
    fn served(&self, g: MetricGenerations) -> impl Iterator<Item = (&'static str, Labels)> {
        [
            self.inference_model.filter(|_| g.inference_model),
            self.inference_objective.filter(|_| g.inference_objective),
            self.llm_d.filter(|_| g.llm_d),
        ]
        .into_iter()
        .flatten()
    }
}

const fn names(
    inference_model: Option<&'static str>,
    inference_objective: Option<&'static str>,
    llm_d: &'static str,
    reference_labels: Labels,
    help: &'static str,
) -> Names {
    Names {
        inference_model: match inference_model {
            Some(n) => Some((n, reference_labels)),
            None => None,
        },
        inference_objective: match inference_objective {
            Some(n) => Some((n, reference_labels)),
            None => None,
        },
        llm_d: Some((llm_d, Labels::Full)),
        help,
    }
}

type HistOf = fn(&RequestSeries) -> &AtomicHistogram;

/// The histogram families: names, labels, where the values are.
fn histograms() -> [(Names, HistOf); 9] {
    use Labels::ModelTarget as MT;
    [
        (
            names(
                Some("inference_model_request_duration_seconds"),
                Some("inference_objective_request_duration_seconds"),
                "llm_d_epp_request_duration_seconds",
                MT,
                "Time from request headers to the end of the response",
            ),
            |s| &s.duration,
        ),
        (
            names(
                Some("inference_model_request_sizes"),
                Some("inference_objective_request_sizes"),
                "llm_d_epp_request_size_bytes",
                MT,
                "Request body sizes in bytes",
            ),
            |s| &s.request_bytes,
        ),
        (
            names(
                Some("inference_model_response_sizes"),
                Some("inference_objective_response_sizes"),
                "llm_d_epp_response_size_bytes",
                MT,
                "Response body sizes in bytes",
            ),
            |s| &s.response_bytes,
        ),
        (
            names(
                Some("inference_model_input_tokens"),
                Some("inference_objective_input_tokens"),
                "llm_d_epp_request_input_tokens",
                MT,
                "Prompt tokens reported by the model server",
            ),
            |s| &s.input_tokens,
        ),
        (
            names(
                Some("inference_model_output_tokens"),
                Some("inference_objective_output_tokens"),
                "llm_d_epp_request_output_tokens",
                MT,
                "Output tokens reported by the model server",
            ),
            |s| &s.output_tokens,
        ),
        (
            names(
                None,
                Some("inference_objective_prompt_cached_tokens"),
                "llm_d_epp_request_cached_tokens",
                MT,
                "Prompt tokens the model server reported read from its prefix cache",
            ),
            |s| &s.cached_tokens,
        ),
        (
            names(
                Some("normalized_time_per_output_token_seconds"),
                Some("inference_objective_normalized_time_per_output_token_seconds"),
                "llm_d_epp_request_ntpot_seconds",
                MT,
                "Request duration divided by output tokens",
            ),
            |s| &s.ntpot,
        ),
        (
            names(
                None,
                None,
                "llm_d_epp_request_streaming_tpot_seconds",
                MT,
                "Streamed responses: (duration - time to first token) / (output tokens - 1)",
            ),
            |s| &s.tpot,
        ),
        (
            names(
                None,
                None,
                "llm_d_epp_request_streaming_itl_seconds",
                MT,
                "Streamed responses: time between two consecutive response body chunks",
            ),
            |s| &s.itl,
        ),
    ]
}

impl Collector for RequestCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let g = self.generations;
        let mut series = self.store.series.all();
        series.sort_by(|a, b| a.key.cmp(&b.key));

        // Requests.
        let requests = names(
            Some("inference_model_request"),
            Some("inference_objective_request"),
            "llm_d_epp_request",
            Labels::ModelTarget,
            "Requests routed, per model and target model",
        );
        for (name, labels) in requests.served(g) {
            // The reference's current generation counts per priority too.
            let labels = match (name, labels) {
                ("inference_objective_request", _) => Labels::ModelTargetPriority,
                (_, l) => l,
            };
            let sums = sum_by(&series, labels, |s| s.requests.load(Relaxed));
            encode_counters(&mut enc, name, requests.help, &sums)?;
        }
        // Running requests: per model in the reference generations.
        let running = Names {
            inference_model: Some(("inference_model_running_requests", Labels::Model)),
            inference_objective: Some(("inference_objective_running_requests", Labels::Model)),
            llm_d: Some(("llm_d_epp_request_running", Labels::Full)),
            help: "Requests routed whose response has not ended",
        };
        for (name, labels) in running.served(g) {
            let sums = sum_by(&series, labels, |s| s.running.load(Relaxed));
            encode_gauges(&mut enc, name, running.help, &sums)?;
        }
        for (family, of) in histograms() {
            for (name, labels) in family.served(g) {
                let mut sums: BTreeMap<LabelValues, HistogramValue> = BTreeMap::new();
                for s in &series {
                    of(s).add_to(sums.entry(labels.of(&s.key)).or_default());
                }
                encode_histograms(&mut enc, name, family.help, &sums)?;
            }
        }
        if g.llm_d {
            // Time to first token, with `streaming`.
            let mut sums: BTreeMap<LabelValues, HistogramValue> = BTreeMap::new();
            for s in &series {
                for (streaming, h) in ["false", "true"].into_iter().zip(&s.ttft) {
                    let mut l = Labels::Full.of(&s.key);
                    l.push(("streaming", streaming.to_owned()));
                    h.add_to(sums.entry(l).or_default());
                }
            }
            sums.retain(|_, v| v.count() > 0);
            encode_histograms(
                &mut enc,
                "llm_d_epp_request_ttft_seconds",
                "Time from request headers to the first response body bytes \
                 (non-streamed responses: the whole duration)",
                &sums,
            )?;
        }
        if g.llm_d {
            self.store.streams.encode(&mut enc)?;
        }
        self.encode_errors(&mut enc)?;
        self.encode_attempts(&mut enc)?;
        self.encode_rewrites(&mut enc)?;
        let p = &self.store.prefix_hit_ratio;
        for (name, h, help) in [
            (
                "inference_extension_prefix_indexer_hit_ratio",
                &p.ratio,
                "Share of the prompt the picked endpoint has cached (prefix index)",
            ),
            (
                "inference_extension_prefix_indexer_hit_bytes",
                &p.bytes,
                "Prompt bytes the picked endpoint has cached (prefix index)",
            ),
        ] {
            let mut v = HistogramValue::default();
            h.add_to(&mut v);
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
            m.encode_histogram::<NoLabelSet>(v.sum, v.count(), &v.buckets(), None)?;
        }
        Ok(())
    }
}

impl RequestCollector {
    fn encode_errors(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let errors: Vec<((SeriesKey, &'static str), u64)> = {
            let e = self
                .store
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            e.iter().map(|(k, v)| (k.clone(), *v)).collect()
        };
        let names = names(
            Some("inference_model_request_error"),
            Some("inference_objective_request_error"),
            "llm_d_epp_request_error",
            Labels::ModelTarget,
            "Requests refused or failed, per error code",
        );
        for (name, labels) in names.served(self.generations) {
            let mut sums: BTreeMap<LabelValues, u64> = BTreeMap::new();
            for ((key, code), n) in &errors {
                let mut l = labels.of(key);
                l.push(("error_code", (*code).to_owned()));
                *sums.entry(l).or_default() += n;
            }
            encode_counters(enc, name, names.help, &sums)?;
        }
        Ok(())
    }

    fn encode_attempts(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let g = self.generations;
        let attempts = self.store.attempts.all();
        for (name, endpoint_label, on) in [
            (
                "inference_extension_scheduler_attempts",
                "pod_name",
                g.reference(),
            ),
            ("llm_d_epp_scheduler_attempts", "endpoint_name", g.llm_d),
        ] {
            if !on {
                continue;
            }
            let mut sums: BTreeMap<LabelValues, u64> = BTreeMap::new();
            for a in &attempts {
                let k = &a.0;
                let l = vec![
                    ("status", k.status.to_owned()),
                    ("target_model_name", k.target.clone()),
                    (endpoint_label, k.endpoint.clone()),
                    ("namespace", k.namespace.clone()),
                    ("port", k.port.clone()),
                ];
                *sums.entry(l).or_default() += a.1.load(Relaxed);
            }
            encode_counters(
                enc,
                name,
                "Scheduling attempts, by status (success, failure), target model and endpoint picked",
                &sums,
            )?;
        }
        Ok(())
    }

    fn encode_rewrites(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        if !self.generations.llm_d {
            return Ok(());
        }
        let sums: BTreeMap<LabelValues, u64> = {
            let r = self
                .store
                .rewrites
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            r.iter()
                .map(|((source, model, target), n)| {
                    (
                        vec![
                            ("model_rewrite_name", (*source).to_owned()),
                            ("model_name", model.clone()),
                            ("target_model", target.clone()),
                        ],
                        *n,
                    )
                })
                .collect()
        };
        encode_counters(
            enc,
            "llm_d_epp_model_rewrite_decisions",
            "Requests whose model was rewritten, by what rewrote it (header, rule), model and target",
            &sums,
        )
    }
}

fn sum_by<T: std::ops::AddAssign + Default + Copy>(
    series: &[Arc<RequestSeries>],
    labels: Labels,
    value: impl Fn(&RequestSeries) -> T,
) -> BTreeMap<LabelValues, T> {
    let mut sums: BTreeMap<LabelValues, T> = BTreeMap::new();
    for s in series {
        *sums.entry(labels.of(&s.key)).or_default() += value(s);
    }
    sums
}

pub(super) fn encode_counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    sums: &BTreeMap<LabelValues, u64>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (l, v) in sums {
        m.encode_family(l)?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

pub(super) fn encode_gauges<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &BTreeMap<LabelValues, V>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (l, v) in values {
        m.encode_family(l)?.encode_gauge(v)?;
    }
    Ok(())
}

pub(super) fn encode_histograms(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    sums: &BTreeMap<LabelValues, HistogramValue>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (l, v) in sums {
        m.encode_family(l)?
            .encode_histogram::<NoLabelSet>(v.sum, v.count(), &v.buckets(), None)?;
    }
    Ok(())
}
