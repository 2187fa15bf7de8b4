//! Family grouping: samples gathered under their `# HELP` / `# TYPE` /
//! `# UNIT`, histograms and summaries assembled from their `_bucket`,
//! `_count`, `_sum`, `_created` and quantile lines in any order.
//!
//! This view allocates (a vector per family and per series); the hot path
//! is [`crate::SelectorSet`].

use std::{borrow::Cow, collections::HashMap};

use crate::{
    error::ParseError,
    lines::{Line, Lines, MetricType, Mode, lines},
    sample::Sample,
    value::parse_f64,
};

/// A label pair; the value is unescaped only if it had escapes.
pub type Label<'a> = (&'a str, Cow<'a, str>);

/// A metric family.
#[derive(Debug, Clone, PartialEq)]
pub struct Family<'a> {
    /// The family name (`# TYPE` name, or the sample name if untyped).
    pub name: &'a str,
    /// Its type; [`MetricType::Unknown`] without a `# TYPE` line.
    pub kind: MetricType,
    /// `# HELP` text.
    pub help: Option<Cow<'a, str>>,
    /// `# UNIT` (OpenMetrics).
    pub unit: Option<&'a str>,
    /// Its series, in order of first appearance.
    pub metrics: Vec<Metric<'a>>,
}

/// One series of a family: one label set (without `le` / `quantile`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metric<'a> {
    /// Labels, sorted by name, without histogram `le` or summary `quantile`.
    pub labels: Vec<Label<'a>>,
    /// The value of a counter (`_total` or bare), gauge, info, stateset or
    /// untyped series.
    pub value: Option<f64>,
    /// Timestamp of the last sample seen for this series.
    pub timestamp: Option<f64>,
    /// `_created`.
    pub created: Option<f64>,
    /// Histogram / summary `_count` (`_gcount` for gauge histograms).
    pub count: Option<f64>,
    /// Histogram / summary `_sum` (`_gsum` for gauge histograms).
    pub sum: Option<f64>,
    /// Histogram buckets `(le, cumulative count)`, sorted by `le`.
    pub buckets: Vec<(f64, f64)>,
    /// Summary quantiles `(quantile, value)`, in page order.
    pub quantiles: Vec<(f64, f64)>,
}

impl Metric<'_> {
    /// One label's value.
    #[must_use]
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_ref())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Value,
    Bucket,
    Count,
    Sum,
    Created,
}

/// Suffixes that attach a sample to a family of a given type.
const SUFFIXES: [(&str, Part, &[MetricType]); 8] = {
    use MetricType::{Counter, GaugeHistogram, Histogram, Info, Summary};
    [
        ("_bucket", Part::Bucket, &[Histogram, GaugeHistogram]),
        ("_count", Part::Count, &[Histogram, Summary]),
        ("_sum", Part::Sum, &[Histogram, Summary]),
        ("_gcount", Part::Count, &[GaugeHistogram]),
        ("_gsum", Part::Sum, &[GaugeHistogram]),
        ("_created", Part::Created, &[Counter, Histogram, Summary]),
        ("_total", Part::Value, &[Counter]),
        ("_info", Part::Value, &[Info]),
    ]
};

#[derive(Debug, Default)]
struct Builder<'a> {
    families: Vec<Family<'a>>,
    by_name: HashMap<&'a str, usize>,
    series: Vec<HashMap<Vec<Label<'a>>, usize>>,
}

impl<'a> Builder<'a> {
    fn family(&mut self, name: &'a str) -> &mut Family<'a> {
        let i = *self.by_name.entry(name).or_insert_with(|| {
            self.families.push(Family {
                name,
                kind: MetricType::Unknown,
                help: None,
                unit: None,
                metrics: Vec::new(),
            });
            self.series.push(HashMap::new());
            self.families.len() - 1
        });
        &mut self.families[i]
    }

    fn resolve(&mut self, name: &'a str) -> (usize, Part) {
        if let Some(&i) = self.by_name.get(name) {
            return (i, Part::Value);
        }
        for (suffix, part, kinds) in SUFFIXES {
            if let Some(base) = name.strip_suffix(suffix)
                && let Some(&i) = self.by_name.get(base)
                && kinds.contains(&self.families[i].kind)
            {
                return (i, part);
            }
        }
        self.family(name);
        (self.families.len() - 1, Part::Value)
    }

    fn sample(&mut self, s: &Sample<'a>) {
        let (fi, part) = self.resolve(s.name);
        let kind = self.families[fi].kind;
        let special = match (part, kind) {
            (Part::Bucket, _) => Some("le"),
            (Part::Value, MetricType::Summary) => Some("quantile"),
            _ => None,
        };
        let mut bound = None;
        let mut key: Vec<Label<'a>> = Vec::new();
        for (k, v) in s.labels() {
            if Some(k) == special {
                bound = parse_f64(&v);
            } else {
                key.push((k, v));
            }
        }
        key.sort_by(|a, b| a.0.cmp(b.0));
        let family = &mut self.families[fi];
        let mi = *self.series[fi].entry(key).or_insert_with_key(|key| {
            family.metrics.push(Metric {
                labels: key.clone(),
                ..Metric::default()
            });
            family.metrics.len() - 1
        });
        let m = &mut family.metrics[mi];
        m.timestamp = s.timestamp.or(m.timestamp);
        match (part, bound) {
            (Part::Bucket, Some(le)) => m.buckets.push((le, s.value)),
            (Part::Bucket, None) => {}
            (Part::Value, Some(q)) => m.quantiles.push((q, s.value)),
            (Part::Value, None) => m.value = Some(s.value),
            (Part::Count, _) => m.count = Some(s.value),
            (Part::Sum, _) => m.sum = Some(s.value),
            (Part::Created, _) => m.created = Some(s.value),
        }
    }

    fn line(&mut self, line: Line<'a>) {
        match line {
            Line::Sample(s) => self.sample(&s),
            Line::Help { name, text } => self.family(name).help = Some(text),
            Line::Type { name, kind } => self.family(name).kind = kind,
            Line::Unit { name, unit } => self.family(name).unit = Some(unit),
            Line::Comment(_) | Line::Eof => {}
        }
    }

    fn finish(mut self) -> Vec<Family<'a>> {
        for f in &mut self.families {
            for m in &mut f.metrics {
                m.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
        self.families
    }
}

fn build<'a>(lines: Lines<'a>, mut on_error: impl FnMut(ParseError) -> bool) -> Vec<Family<'a>> {
    let mut b = Builder::default();
    for item in lines {
        match item {
            Ok(line) => b.line(line),
            Err(e) => {
                if !on_error(e) {
                    break;
                }
            }
        }
    }
    b.finish()
}

/// Groups a page into families, stopping at the first error.
///
/// ```
/// use epp_promtext::{MetricType, families};
///
/// let page = "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n\
///             lat_seconds_count{m=\"a\"} 3\nlat_seconds_sum{m=\"a\"} 1.5\n\
///             lat_seconds_bucket{m=\"a\",le=\"+Inf\"} 3\nlat_seconds_bucket{le=\"0.5\",m=\"a\"} 2\n\
///             ## TYPE reqs counter\nreqs_total 7\nreqs_created 1.7e9\n";
/// let fams = families(page)?;
/// assert_eq!((fams[0].name, fams[0].kind), ("lat_seconds", MetricType::Histogram));
/// let m = &fams[0].metrics[0];
/// assert_eq!((m.label("m"), m.count, m.sum), (Some("a"), Some(3.0), Some(1.5)));
/// assert_eq!(m.buckets, [(0.5, 2.0), (f64::INFINITY, 3.0)]);
/// assert_eq!((fams[1].metrics[0].value, fams[1].metrics[0].created), (Some(7.0), Some(1.7e9)));
/// # Ok::<(), epp_promtext::ParseError>(())
/// ```
///
/// # Errors
/// The first malformed line.
pub fn families(text: &str) -> Result<Vec<Family<'_>>, ParseError> {
    let mut first = None;
    let fams = build(lines(text).mode(Mode::Strict), |e| {
        first = Some(e);
        false
    });
    first.map_or(Ok(fams), Err)
}

/// Groups a page into families, skipping malformed lines and returning
/// their errors.
///
/// ```
/// use epp_promtext::{ErrorKind, families_lenient};
///
/// let page = "# TYPE q gauge\nq{m=\"a\"} 1\nq{m=\"b\",m=\"c\"} 2\nq{m=\"d\"} oops\nq{m=\"e\"} 3\n";
/// let (fams, errors) = families_lenient(page);
/// assert_eq!(fams[0].metrics.len(), 2, "the good lines are kept");
/// let kinds: Vec<_> = errors.iter().map(|e| (e.line, e.kind)).collect();
/// assert_eq!(kinds, [(3, ErrorKind::DuplicateLabel), (4, ErrorKind::BadValue)]);
/// ```
#[must_use]
pub fn families_lenient(text: &str) -> (Vec<Family<'_>>, Vec<ParseError>) {
    let mut errors = Vec::new();
    let fams = build(lines(text), |e| {
        errors.push(e);
        true
    });
    (fams, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_0_0_4_counters_and_created_gauges() {
        let page = "# TYPE x_total counter\nx_total{a=\"1\"} 5\n\
                    # TYPE x_created gauge\nx_created{a=\"1\"} 1.7e9\n";
        let f = families(page).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].metrics[0].value, Some(5.0));
        assert_eq!(f[1].kind, MetricType::Gauge);
    }

    #[test]
    fn summaries_untyped_and_lenient_errors() {
        let page = "# TYPE s summary\ns{quantile=\"0.9\",x=\"1\"} 2\ns_sum{x=\"1\"} 9\n\
                    s_count{x=\"1\"} 4\ns{quantile=\"0.5\",x=\"1\"} 1\nbad{\nu 1\nu{b=\"2\"} 3\n";
        let (f, errors) = families_lenient(page);
        let m = &f[0].metrics[0];
        assert_eq!(m.quantiles, [(0.9, 2.0), (0.5, 1.0)]);
        assert_eq!((m.sum, m.count), (Some(9.0), Some(4.0)));
        assert_eq!(
            (f[1].name, f[1].kind, f[1].metrics.len()),
            ("u", MetricType::Unknown, 2)
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(families(page).unwrap_err().line, 6);
    }
}
