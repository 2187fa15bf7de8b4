//! A [`MetricSink`] that keeps what plugins report, for their tests.

use epp_core::{MetricFamily, MetricSink};

/// One reported series: family name, label values in order, and the value
/// (a histogram's is its count).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: &'static str,
    pub(crate) labels: Vec<String>,
    pub(crate) value: f64,
}

/// Every series reported, in order.
#[derive(Debug, Default)]
pub(crate) struct Sink(pub(crate) Vec<Series>);

impl Sink {
    /// The value of `name` whose label values start with `labels`.
    pub(crate) fn get(&self, name: &str, labels: &[&str]) -> Option<f64> {
        self.0
            .iter()
            .find(|s| s.name == name && s.labels.iter().zip(labels).all(|(a, b)| a == b))
            .map(|s| s.value)
    }

    fn push(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: f64) {
        self.0.push(Series {
            name: family.name,
            labels: labels.iter().map(|(_, v)| (*v).to_owned()).collect(),
            value,
        });
    }
}

impl MetricSink for Sink {
    fn gauge(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: f64) {
        self.push(family, labels, value);
    }
    fn counter(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: u64) {
        self.push(family, labels, value as f64);
    }
    fn histogram(
        &mut self,
        family: MetricFamily,
        labels: &[(&str, &str)],
        _buckets: &[(f64, u64)],
        _sum: f64,
        count: u64,
    ) {
        self.push(family, labels, count as f64);
    }
}
