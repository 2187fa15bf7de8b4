//! Samples and their labels, borrowed from the page.

use std::borrow::Cow;

use crate::{
    error::ParseError,
    grammar::{Spans, next_label, sample_line},
};

/// One sample line, borrowing from the page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// Metric name as written, e.g. `vllm:num_requests_waiting` or `x_bucket`.
    pub name: &'a str,
    /// The label set as written, without braces (already validated). Read it
    /// with [`Sample::labels`] or [`Sample::label`]; if you replace it, they
    /// may return nonsense for it (but never panic).
    pub labels_raw: &'a str,
    /// The value (`NaN` and `±Inf` included).
    pub value: f64,
    /// Timestamp as written: milliseconds in text 0.0.4, seconds in OpenMetrics.
    pub timestamp: Option<f64>,
    /// An OpenMetrics exemplar, if the line has one.
    pub exemplar: Option<Exemplar<'a>>,
    /// 1-based line number.
    pub line: u32,
    /// Where the first labels are in `labels_raw`.
    spans: Spans,
}

/// An OpenMetrics exemplar: `# {trace_id="..."} value [timestamp]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exemplar<'a> {
    /// The exemplar's label set, without braces (validated).
    pub labels_raw: &'a str,
    /// The exemplar's value.
    pub value: f64,
    /// The exemplar's timestamp (seconds), if given.
    pub timestamp: Option<f64>,
}

impl<'a> Sample<'a> {
    /// The labels, in page order. Values are unescaped (allocated) only if
    /// they contain a backslash.
    #[must_use]
    pub fn labels(&self) -> Labels<'a> {
        Labels::new(self.labels_raw, self.spans)
    }

    /// The value of label `name`, if present.
    ///
    /// ```
    /// let s = epp_promtext::parse_sample(r#"m{a="x",b="q\"y"} 1"#, 1).unwrap();
    /// assert_eq!(s.label("a").as_deref(), Some("x"));
    /// assert_eq!(s.label("b").as_deref(), Some("q\"y"));
    /// assert_eq!(s.label("c"), None);
    /// ```
    #[must_use]
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Whether label `name` is present with exactly `value` (compared without
    /// allocating, even if the page escapes it).
    #[must_use]
    pub fn has_label(&self, name: &str, value: &str) -> bool {
        let mut labels = self.labels();
        while let Some((n, v, escaped)) = labels.next_raw() {
            if n == name {
                return if escaped {
                    unescaped_bytes(v).eq(value.bytes())
                } else {
                    v == value
                };
            }
        }
        false
    }
}

/// The bytes of `v` unescaped (escapes are ASCII, so bytewise is exact).
fn unescaped_bytes(v: &str) -> impl Iterator<Item = u8> + '_ {
    let mut b = v.bytes();
    let mut pending = None;
    std::iter::from_fn(move || {
        if let Some(c) = pending.take() {
            return Some(c);
        }
        match b.next()? {
            b'\\' => match b.next() {
                Some(b'n') => Some(b'\n'),
                Some(c @ (b'\\' | b'"')) => Some(c),
                other => {
                    pending = other;
                    Some(b'\\')
                }
            },
            c => Some(c),
        }
    })
}

impl<'a> Exemplar<'a> {
    /// The exemplar's labels.
    #[must_use]
    pub fn labels(&self) -> Labels<'a> {
        Labels::new(self.labels_raw, Spans::default())
    }
}

/// Parses one sample line (without its newline; a trailing `\r` is
/// tolerated). `line_no` is reported in the sample and in errors.
///
/// # Errors
/// A [`ParseError`] pointing at the first offending byte.
///
/// ```
/// let s = epp_promtext::parse_sample("up{job=\"a\"} 1 1700000000000", 4).unwrap();
/// assert_eq!((s.name, s.value, s.timestamp, s.line), ("up", 1.0, Some(1.7e12), 4));
/// let e = epp_promtext::parse_sample("up{job=a} 1", 5).unwrap_err();
/// assert_eq!((e.line, e.col, e.snippet()), (5, 8, "up{job=a} 1"));
/// ```
pub fn parse_sample(line: &str, line_no: u32) -> Result<Sample<'_>, ParseError> {
    parse_sample_line(line.strip_suffix('\r').unwrap_or(line), line_no)
}

/// [`parse_sample`] for a line whose `\r` (if any) is already removed: only
/// the one `\r` before `\n` belongs to the line end, so it must be stripped
/// exactly once.
pub(crate) fn parse_sample_line(line: &str, line_no: u32) -> Result<Sample<'_>, ParseError> {
    match sample_line(line) {
        Ok((_, p)) => Ok(Sample {
            name: p.name,
            labels_raw: p.labels,
            spans: p.spans,
            value: p.value,
            timestamp: p.timestamp,
            exemplar: p.exemplar.map(|(labels_raw, value, timestamp)| Exemplar {
                labels_raw,
                value,
                timestamp,
            }),
            line: line_no,
        }),
        Err(nom::Err::Error(f) | nom::Err::Failure(f)) => Err(ParseError::new(
            line_no,
            line,
            line.len() - f.at.len(),
            f.kind,
        )),
        Err(nom::Err::Incomplete(_)) => Err(ParseError::new(
            line_no,
            line,
            line.len(),
            crate::ErrorKind::ExpectedValue,
        )),
    }
}

/// Iterator over a validated label set: `(name, value)` pairs in page order.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    raw: &'a str,
    spans: Spans,
    next: u8,
    /// The text after the cached labels, scanned once those are used up.
    rest: &'a str,
}

impl<'a> Labels<'a> {
    fn new(raw: &'a str, spans: Spans) -> Self {
        let rest = match spans.len.checked_sub(1) {
            None => raw,
            Some(last) => {
                let end = spans.at[usize::from(last)][3];
                raw.get(usize::from(end) + 1..).unwrap_or_default()
            }
        };
        Self {
            raw,
            spans,
            next: 0,
            rest,
        }
    }

    /// The next pair with its value as written (escapes intact) and whether
    /// it has escapes.
    #[inline]
    fn next_raw(&mut self) -> Option<(&'a str, &'a str, bool)> {
        if self.next < self.spans.len {
            let i = usize::from(self.next);
            self.next += 1;
            let [a, b, c, d] = self.spans.at[i].map(usize::from);
            let escaped = self.spans.escaped & (1 << i) != 0;
            return Some((self.raw.get(a..b)?, self.raw.get(c..d)?, escaped));
        }
        let (item, tail) = next_label(self.rest)?;
        self.rest = tail;
        Some(item)
    }
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        let (name, value, escaped) = self.next_raw()?;
        Some((
            name,
            if escaped {
                unescape(value)
            } else {
                Cow::Borrowed(value)
            },
        ))
    }
}

/// Translates `\\`, `\"` and `\n`; any other escaped character is kept with
/// its backslash (as Prometheus' own parser does). Borrows if nothing changes.
pub(crate) fn unescape(v: &str) -> Cow<'_, str> {
    let Some(first) = memchr::memchr(b'\\', v.as_bytes()) else {
        return Cow::Borrowed(v);
    };
    let mut out = String::with_capacity(v.len());
    out.push_str(&v[..first]);
    let mut chars = v[first..].chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(c @ ('\\' | '"')) => out.push(c),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_borrow_unless_escaped() {
        let s = parse_sample(r#"a:b_c{x="1", y = "q\"u\\o\nte\d",} -Inf"#, 3).unwrap();
        let labels: Vec<_> = s.labels().collect();
        assert_eq!(labels[0], ("x", Cow::Borrowed("1")));
        assert!(matches!(labels[0].1, Cow::Borrowed(_)));
        assert_eq!(labels[1], ("y", Cow::Borrowed("q\"u\\o\nte\\d")));
        assert!(matches!(labels[1].1, Cow::Owned(_)));
        assert!(s.has_label("y", "q\"u\\o\nte\\d"));
        assert!(!s.has_label("y", "q\"u\\o\nte\\"));
        for v in ["", "a", "\\", "\\\\", "\\\"x\\n", "é\\q"] {
            assert_eq!(
                unescaped_bytes(v).collect::<Vec<_>>(),
                unescape(v).as_bytes(),
                "{v}"
            );
        }
        assert!(s.has_label("x", "1") && !s.has_label("x", "2"));
        assert_eq!(labels.len(), 2);
    }

    #[test]
    fn only_one_carriage_return_is_a_line_end() {
        // Found by the fuzzer: the iterator and parse_sample both stripped a
        // `\r`, so "1\r\r" parsed through one and not the other.
        let page = "a 1\r\r\nb 2\r\n";
        let got: Vec<_> = crate::samples(page).map(|r| r.map(|s| s.value)).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].unwrap_err().kind, crate::ErrorKind::BadValue);
        assert_eq!(got[1], Ok(2.0));
        assert!(parse_sample("a 1\r\r", 1).is_err());
        let set = crate::SelectorSet::new(vec![crate::Selector::name("a")]);
        assert_eq!(set.scan(page, |_, _| {}).errors, 1);
    }

    #[test]
    fn exemplar_and_crlf() {
        let s = parse_sample("x_bucket{le=\"0.5\"} 7 # {trace_id=\"t\"} 0.4 12.5\r", 1).unwrap();
        let ex = s.exemplar.unwrap();
        assert_eq!((ex.value, ex.timestamp), (0.4, Some(12.5)));
        assert_eq!(ex.labels().next(), Some(("trace_id", Cow::Borrowed("t"))));
    }

    #[test]
    fn errors_point_at_the_offending_byte() {
        let e = parse_sample("m{a=\"1\" b=\"2\"} 1", 7).unwrap_err();
        assert_eq!((e.line, e.col), (7, 9));
        assert_eq!(e.snippet(), "m{a=\"1\" b=\"2\"} 1");
    }
}
