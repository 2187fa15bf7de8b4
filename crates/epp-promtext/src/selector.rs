//! Series selection: `family{label="value",...}` specs, matched many at once
//! in one pass over a page.

use std::fmt;

use crate::parse::{Sample, Samples, name_len, parse_sample, samples};

/// Why a selector spec is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    /// The spec as given.
    pub spec: String,
    /// Byte offset of the problem.
    pub at: usize,
    /// What is wrong.
    pub reason: &'static str,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid metric selector {:?} at offset {}: {}",
            self.spec, self.at, self.reason
        )
    }
}

impl std::error::Error for SelectorError {}

/// A series selector: a metric name and equality matchers on labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The metric name (sample name, e.g. `vllm:num_requests_waiting`).
    pub name: String,
    /// `label = value` matchers, all of which must hold.
    pub matchers: Vec<(String, String)>,
}

impl Selector {
    /// A selector on a name with no label matchers.
    #[must_use]
    pub fn name(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            matchers: Vec::new(),
        }
    }

    /// Adds a matcher.
    #[must_use]
    pub fn with_label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.matchers.push((name.into(), value.into()));
        self
    }

    /// Parses `name`, `name{}`, `name{a="x",b=y}` (quoted or bare values).
    ///
    /// # Errors
    /// A [`SelectorError`] saying where and why.
    pub fn parse(spec: &str) -> Result<Self, SelectorError> {
        let fail = |at: usize, reason| SelectorError {
            spec: spec.to_owned(),
            at,
            reason,
        };
        let s = spec.trim();
        let offset = spec.len() - spec.trim_start().len();
        let n = name_len(s.as_bytes());
        if n == 0 {
            return Err(fail(offset, "expected a metric name"));
        }
        let mut sel = Self::name(&s[..n]);
        let rest = &s[n..];
        if rest.is_empty() {
            return Ok(sel);
        }
        let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) else {
            return Err(fail(
                offset + n,
                "expected `{label=\"value\",...}` after the name",
            ));
        };
        let base = offset + n + 1;
        let mut pos = 0;
        for part in split_top_level(inner) {
            let at = base + pos;
            pos += part.len() + 1;
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let Some((k, v)) = part.split_once('=') else {
                return Err(fail(at, "expected label=value"));
            };
            let k = k.trim();
            if k.is_empty() || !k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                return Err(fail(at, "invalid label name"));
            }
            let v = v.trim();
            let v = match v.strip_prefix('"') {
                Some(q) => q
                    .strip_suffix('"')
                    .ok_or_else(|| fail(at, "unterminated quoted value"))?,
                None => v,
            };
            sel.matchers
                .push((k.to_owned(), v.replace("\\\"", "\"").replace("\\\\", "\\")));
        }
        Ok(sel)
    }

    /// Whether `sample` is selected.
    #[must_use]
    pub fn matches(&self, sample: &Sample<'_>) -> bool {
        sample.name == self.name && self.labels_match(sample)
    }

    fn labels_match(&self, sample: &Sample<'_>) -> bool {
        self.matchers
            .iter()
            .all(|(k, v)| sample.label(k).is_some_and(|x| x == v.as_str()))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.matchers.is_empty() {
            f.write_str("{")?;
            for (i, (k, v)) in self.matchers.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(
                    f,
                    "{k}=\"{}\"",
                    v.replace('\\', "\\\\").replace('"', "\\\"")
                )?;
            }
            f.write_str("}")?;
        }
        Ok(())
    }
}

/// Splits on commas outside quotes.
fn split_top_level(s: &str) -> impl Iterator<Item = &str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

/// What a scan saw besides the matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Sample lines examined in full (their name matched a selector).
    pub parsed: usize,
    /// Lines skipped by name alone.
    pub skipped: usize,
    /// Malformed lines among those examined (lenient: skipped).
    pub errors: usize,
    /// The first error, if any.
    pub first_error: Option<crate::ParseError>,
}

/// Several selectors matched in one pass.
#[derive(Debug, Clone, Default)]
pub struct SelectorSet {
    selectors: Vec<Selector>,
}

impl SelectorSet {
    /// A set over `selectors` (indices in callbacks refer to this order).
    #[must_use]
    pub fn new(selectors: Vec<Selector>) -> Self {
        Self { selectors }
    }

    /// The selectors.
    #[must_use]
    pub fn selectors(&self) -> &[Selector] {
        &self.selectors
    }

    /// Scans `page` once, calling `on_match(selector_index, sample)` for every
    /// selected sample (a sample matching several selectors is reported once
    /// per selector). Lines whose name no selector wants are skipped without
    /// parsing their labels; malformed lines are counted and skipped.
    pub fn scan<'a>(
        &self,
        page: &'a str,
        mut on_match: impl FnMut(usize, &Sample<'a>),
    ) -> ScanReport {
        let mut report = ScanReport::default();
        let mut lines: Samples<'a> = samples(page);
        while let Some((line, no)) = lines.next_line() {
            let n = name_len(line.as_bytes());
            let name = &line[..n];
            if !self.selectors.iter().any(|s| s.name == name) {
                report.skipped += 1;
                continue;
            }
            report.parsed += 1;
            match parse_sample(line, no) {
                Ok(sample) => {
                    for (i, sel) in self.selectors.iter().enumerate() {
                        if sel.name == sample.name && sel.labels_match(&sample) {
                            on_match(i, &sample);
                        }
                    }
                }
                Err(e) => {
                    report.errors += 1;
                    report.first_error.get_or_insert(e);
                }
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let s = Selector::parse(
            r#" nv_trt_llm_request_metrics{request_type="waiting", model=tensorrt_llm} "#,
        )
        .unwrap();
        assert_eq!(s.name, "nv_trt_llm_request_metrics");
        assert_eq!(
            s.matchers,
            vec![
                ("request_type".into(), "waiting".into()),
                ("model".into(), "tensorrt_llm".into())
            ]
        );
        assert_eq!(Selector::parse("a:b{}").unwrap(), Selector::name("a:b"));
        assert_eq!(
            Selector::parse(r#"m{x="a,b"}"#).unwrap().matchers[0].1,
            "a,b"
        );
        assert!(Selector::parse("").is_err());
        assert!(Selector::parse("9m").is_err());
        assert!(Selector::parse("m{x}").is_err());
        assert!(Selector::parse("m{x=\"1}").is_err());
        assert!(Selector::parse("m[x]").is_err());
        let round = Selector::parse(r#"m{x="q\"v"}"#).unwrap();
        assert_eq!(Selector::parse(&round.to_string()).unwrap(), round);
    }

    #[test]
    fn scan_selects_by_name_and_labels_and_counts_errors() {
        let page = "a{k=\"1\"} 1\na{k=\"2\"} 2\nb 3\nb{ 4\nc 5\n";
        let set = SelectorSet::new(vec![
            Selector::parse("a{k=\"2\"}").unwrap(),
            Selector::name("a"),
            Selector::name("b"),
        ]);
        let mut seen = Vec::new();
        let r = set.scan(page, |i, s| seen.push((i, s.value)));
        assert_eq!(seen, vec![(1, 1.0), (0, 2.0), (1, 2.0), (2, 3.0)]);
        assert_eq!((r.parsed, r.skipped, r.errors), (4, 1, 1));
        assert_eq!(r.first_error.unwrap().line, 4);
    }
}
