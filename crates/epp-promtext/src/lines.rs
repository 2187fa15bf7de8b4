//! Streaming iteration over the lines and samples of a page.

use std::{borrow::Cow, fmt};

use crate::{
    error::{ErrorKind, ParseError},
    grammar::{Comment, comment_line},
    sample::{Sample, parse_sample_line, unescape},
};

/// How to treat a malformed line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Report the error and stop.
    Strict,
    /// Report the error, skip the line and go on.
    #[default]
    Lenient,
}

/// A metric family's type, from `# TYPE`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetricType {
    /// `counter`
    Counter,
    /// `gauge`
    Gauge,
    /// `histogram`
    Histogram,
    /// `gaugehistogram` (OpenMetrics)
    GaugeHistogram,
    /// `summary`
    Summary,
    /// `stateset` (OpenMetrics)
    StateSet,
    /// `info` (OpenMetrics)
    Info,
    /// `untyped` (0.0.4) or `unknown` (OpenMetrics), or no `# TYPE` line.
    #[default]
    Unknown,
}

impl MetricType {
    /// Parses a `# TYPE` keyword (case-insensitive, as Go's `expfmt` does).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        const ALL: [(&str, MetricType); 9] = [
            ("counter", MetricType::Counter),
            ("gauge", MetricType::Gauge),
            ("histogram", MetricType::Histogram),
            ("gaugehistogram", MetricType::GaugeHistogram),
            ("summary", MetricType::Summary),
            ("stateset", MetricType::StateSet),
            ("info", MetricType::Info),
            ("untyped", MetricType::Unknown),
            ("unknown", MetricType::Unknown),
        ];
        ALL.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(s))
            .map(|&(_, t)| t)
    }

    /// The OpenMetrics keyword.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::GaugeHistogram => "gaugehistogram",
            Self::Summary => "summary",
            Self::StateSet => "stateset",
            Self::Info => "info",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for MetricType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One non-blank line of a page.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Line<'a> {
    /// A sample.
    Sample(Sample<'a>),
    /// `# HELP name text`; the text is unescaped (`\\`, `\n`, `\"`) only if
    /// it has escapes.
    Help {
        /// Family name.
        name: &'a str,
        /// Help text.
        text: Cow<'a, str>,
    },
    /// `# TYPE name type`.
    Type {
        /// Family name.
        name: &'a str,
        /// Its type.
        kind: MetricType,
    },
    /// `# UNIT name unit` (OpenMetrics).
    Unit {
        /// Family name.
        name: &'a str,
        /// The unit, possibly empty.
        unit: &'a str,
    },
    /// Any other `#` line; the text after `#` and blanks.
    Comment(&'a str),
    /// OpenMetrics `# EOF`. Iteration ends after it; anything but blank
    /// space after it is an error.
    Eof,
}

/// Streaming iterator over the lines of a page: each item is a [`Line`] or
/// the [`ParseError`] of one line. Blank lines are skipped; `\r\n` and a
/// missing final newline are accepted. In [`Mode::Strict`] iteration ends
/// after the first error.
///
/// ```
/// use epp_promtext::{Line, MetricType, lines};
///
/// let page = "# TYPE up gauge\nup{job=\"a\"} 1\nup{job=b} 1\nup 0\n";
/// let got: Vec<_> = lines(page).collect();
/// assert_eq!(got[0], Ok(Line::Type { name: "up", kind: MetricType::Gauge }));
/// assert!(matches!(&got[1], Ok(Line::Sample(s)) if s.value == 1.0));
/// assert_eq!(got[2].as_ref().unwrap_err().line, 3);
/// assert_eq!(got.len(), 4, "lenient by default: the bad line is reported and skipped");
/// assert_eq!(lines(page).strict().count(), 3);
/// ```
#[derive(Debug, Clone)]
pub struct Lines<'a> {
    text: &'a str,
    pos: usize,
    line: u32,
    mode: Mode,
    after_eof: bool,
    done: bool,
    /// Indentation of the current line, added to error columns.
    indent: usize,
}

/// Iterates the lines of `text`, leniently.
#[must_use]
pub fn lines(text: &str) -> Lines<'_> {
    Lines {
        text,
        pos: 0,
        line: 0,
        mode: Mode::Lenient,
        after_eof: false,
        done: false,
        indent: 0,
    }
}

/// Iterates the samples of `text`, leniently (comment lines are checked but
/// not returned).
///
/// ```
/// let page = "# HELP a x\na 1\r\nb{l=\"v\"} 2 # {trace_id=\"t\"} 1";
/// let values: Vec<f64> = epp_promtext::samples(page).map(|s| s.unwrap().value).collect();
/// assert_eq!(values, [1.0, 2.0]);
/// ```
#[must_use]
pub fn samples(text: &str) -> Samples<'_> {
    Samples { lines: lines(text) }
}

impl<'a> Lines<'a> {
    /// Sets the error mode.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Stops after the first error.
    #[must_use]
    pub fn strict(self) -> Self {
        self.mode(Mode::Strict)
    }

    /// Only the samples.
    #[must_use]
    pub fn samples(self) -> Samples<'a> {
        Samples { lines: self }
    }

    /// The next non-blank line (no `\n`, `\r` or leading blanks), its number
    /// and its indentation.
    pub(crate) fn next_raw(&mut self) -> Option<(&'a str, u32, usize)> {
        let bytes = self.text.as_bytes();
        while self.pos < bytes.len() {
            let start = self.pos;
            let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |j| start + j);
            self.pos = end + 1;
            self.line = self.line.saturating_add(1);
            let line = &self.text[start..end];
            let line = line.strip_suffix('\r').unwrap_or(line);
            let trimmed = line.trim_start_matches([' ', '\t']);
            if !trimmed.is_empty() {
                return Some((trimmed, self.line, line.len() - trimmed.len()));
            }
        }
        None
    }

    fn fail(&mut self, e: ParseError) -> Option<Result<Line<'a>, ParseError>> {
        if self.mode == Mode::Strict {
            self.done = true;
        }
        Some(Err(e.indented(self.indent)))
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = Result<Line<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let Some((line, no, indent)) = self.next_raw() else {
            self.done = true;
            return None;
        };
        self.indent = indent;
        if self.after_eof {
            self.done = true;
            return Some(Err(ParseError::new(
                no,
                line,
                0,
                ErrorKind::ContentAfterEof,
            )));
        }
        if !line.starts_with('#') {
            return match parse_sample_line(line, no) {
                Ok(s) => Some(Ok(Line::Sample(s))),
                Err(e) => self.fail(e),
            };
        }
        match comment_line(line) {
            Ok((_, c)) => Some(Ok(match c {
                Comment::Help(name, text) => Line::Help {
                    name,
                    text: unescape(text),
                },
                Comment::Type(name, kind) => match MetricType::parse(kind) {
                    Some(kind) => Line::Type { name, kind },
                    None => {
                        let at = offset_in(line, kind);
                        return self.fail(ParseError::new(no, line, at, ErrorKind::BadType));
                    }
                },
                Comment::Unit(name, unit) => Line::Unit { name, unit },
                Comment::Plain(text) => Line::Comment(text),
                Comment::Eof => {
                    self.after_eof = true;
                    Line::Eof
                }
            })),
            Err(nom::Err::Error(f) | nom::Err::Failure(f)) => {
                self.fail(ParseError::new(no, line, offset_in(line, f.at), f.kind))
            }
            Err(nom::Err::Incomplete(_)) => {
                self.fail(ParseError::new(no, line, 0, ErrorKind::TrailingText))
            }
        }
    }
}

/// Byte offset of `inner`, a subslice of `outer`, within it.
pub(crate) fn offset_in(outer: &str, inner: &str) -> usize {
    (inner.as_ptr() as usize)
        .saturating_sub(outer.as_ptr() as usize)
        .min(outer.len())
}

/// Streaming iterator over the samples of a page (see [`samples`]).
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    lines: Lines<'a>,
}

impl<'a> Samples<'a> {
    /// Sets the error mode.
    #[must_use]
    pub fn mode(self, mode: Mode) -> Self {
        Self {
            lines: self.lines.mode(mode),
        }
    }

    /// Stops after the first error.
    #[must_use]
    pub fn strict(self) -> Self {
        self.mode(Mode::Strict)
    }
}

impl<'a> Iterator for Samples<'a> {
    type Item = Result<Sample<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.lines.next()? {
                Ok(Line::Sample(s)) => return Some(Ok(s)),
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_line() {
        let page = "# HELP m_seconds Help with \\\\ and \\n.\n# TYPE m_seconds summary\n\
                    # UNIT m_seconds seconds\n\n  # just a comment\n\
                    m_seconds{quantile=\"0.5\"} 1\r\n# EOF\n\n";
        let got: Vec<_> = lines(page).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            got[0],
            Line::Help {
                name: "m_seconds",
                text: Cow::Owned("Help with \\ and \n.".into())
            }
        );
        assert_eq!(
            got[1],
            Line::Type {
                name: "m_seconds",
                kind: MetricType::Summary
            }
        );
        assert_eq!(
            got[2],
            Line::Unit {
                name: "m_seconds",
                unit: "seconds"
            }
        );
        assert_eq!(got[3], Line::Comment("just a comment"));
        assert!(matches!(&got[4], Line::Sample(s) if s.line == 6));
        assert_eq!(got[5], Line::Eof);
        assert_eq!(got.len(), 6);
    }

    #[test]
    fn strict_stops_lenient_goes_on() {
        let page = "a 1\nb{ 2\n# TYPE c bogus\nc 3\n# EOF\nd 4\ne 5";
        let lenient: Vec<_> = lines(page).collect();
        let kinds: Vec<_> = lenient
            .iter()
            .map(|r| r.as_ref().map_err(|e| (e.line, e.kind)).map(|_| ()))
            .collect();
        assert_eq!(
            kinds,
            [
                Ok(()),
                Err((2, ErrorKind::ExpectedLabelName)),
                Err((3, ErrorKind::BadType)),
                Ok(()),
                Ok(()),
                Err((6, ErrorKind::ContentAfterEof)),
            ]
        );
        let strict: Vec<_> = samples(page).strict().collect();
        assert_eq!(strict.len(), 2);
        assert_eq!(strict[1].unwrap_err().col, 4);
        let indented = lines(" \t b{ 2").next().unwrap().unwrap_err();
        assert_eq!((indented.col, indented.snippet()), (7, "b{ 2"));
    }

    #[test]
    fn duplicate_label_names_are_errors() {
        let page = "m{a=\"1\"} 1\nm{a=\"1\",b=\"2\",a=\"3\"} 2\nm{b=\"2\"} 3\n";
        let lenient: Vec<_> = samples(page).collect();
        assert_eq!(
            lenient.len(),
            3,
            "lenient: the bad line is reported, the rest kept"
        );
        let e = lenient[1].unwrap_err();
        assert_eq!((e.line, e.col, e.kind), (2, 15, ErrorKind::DuplicateLabel));
        assert_eq!(
            e.to_string(),
            "line 2, column 15: expected a label name not already in this label set \
             near \"\\\"1\\\",b=\\\"2\\\",a=\\\"3\\\"} 2\""
        );
        assert_eq!(lenient[2].map(|s| s.value), Ok(3.0));
        let strict: Vec<_> = samples(page).strict().collect();
        assert_eq!(strict.len(), 2);
        assert_eq!(strict[1].unwrap_err().kind, ErrorKind::DuplicateLabel);
        let set = crate::SelectorSet::from_specs(&["m"]).unwrap();
        let mut values = Vec::new();
        let report = set.scan(page, |_, s| values.push(s.value));
        assert_eq!((values, report.errors), (vec![1.0, 3.0], 1));
        assert_eq!(
            report.first_error.map(|e| e.kind),
            Some(ErrorKind::DuplicateLabel)
        );
    }
}
