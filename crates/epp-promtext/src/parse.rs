//! Line-level parsing.

use std::{borrow::Cow, fmt};

/// What was wrong with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A metric name was expected.
    ExpectedName,
    /// A label name was expected.
    ExpectedLabelName,
    /// `=` was expected after a label name.
    ExpectedEquals,
    /// A quoted label value was expected.
    ExpectedQuote,
    /// A label value was not closed.
    UnterminatedValue,
    /// An unknown escape sequence in a label value.
    BadEscape,
    /// `,` or `}` was expected after a label.
    ExpectedCommaOrBrace,
    /// A sample value was expected.
    ExpectedValue,
    /// The value is not a number.
    BadValue,
    /// The timestamp is not a number.
    BadTimestamp,
    /// Unexpected text after the sample.
    TrailingText,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ExpectedName => "expected a metric name",
            Self::ExpectedLabelName => "expected a label name",
            Self::ExpectedEquals => "expected '=' after the label name",
            Self::ExpectedQuote => "expected a quoted label value",
            Self::UnterminatedValue => "unterminated label value",
            Self::BadEscape => "unknown escape in label value",
            Self::ExpectedCommaOrBrace => "expected ',' or '}' after a label",
            Self::ExpectedValue => "expected a sample value",
            Self::BadValue => "the sample value is not a number",
            Self::BadTimestamp => "the timestamp is not a number",
            Self::TrailingText => "unexpected text after the sample",
        })
    }
}

/// A parse error: where (1-based line and column) and what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in bytes).
    pub col: usize,
    /// What was expected.
    pub kind: ErrorKind,
}

impl ParseError {
    /// The offending line's text from the error column, truncated to `max`
    /// bytes (on a character boundary), for messages.
    #[must_use]
    pub fn snippet<'a>(&self, page: &'a str, max: usize) -> &'a str {
        let Some(line) = page.lines().nth(self.line.saturating_sub(1)) else {
            return "";
        };
        let start = floor_char_boundary(line, self.col.saturating_sub(1));
        let rest = &line[start..];
        &rest[..floor_char_boundary(rest, max)]
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}: {}", self.line, self.col, self.kind)
    }
}

impl std::error::Error for ParseError {}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Metric name, e.g. `vllm:num_requests_waiting` or `x_bucket`.
    pub name: &'a str,
    /// The label set as written, without braces (already validated).
    pub labels_raw: &'a str,
    /// The value (`NaN`, `±Inf` included).
    pub value: f64,
    /// Optional timestamp as written (milliseconds in 0.0.4, seconds in OpenMetrics).
    pub timestamp: Option<f64>,
    /// 1-based line number.
    pub line: usize,
}

impl<'a> Sample<'a> {
    /// The labels, in order.
    #[must_use]
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            rest: self.labels_raw,
        }
    }

    /// One label's value.
    #[must_use]
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Iterator over a validated label set.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.rest.trim_start_matches([' ', '\t', ',']);
        if s.is_empty() {
            return None;
        }
        let eq = s.find('=')?;
        let name = s[..eq].trim_end();
        let after = s[eq + 1..].trim_start();
        let body = after.strip_prefix('"')?;
        let (raw, len) = scan_quoted(body.as_bytes()).ok()?;
        let value = &body[..raw];
        self.rest = &body[len..];
        Some((name, unescape(value)))
    }
}

/// Finds the closing quote of a label value: (value length, bytes consumed
/// including the quote). Escapes are validated.
fn scan_quoted(b: &[u8]) -> Result<(usize, usize), (usize, ErrorKind)> {
    let mut i = 0;
    loop {
        match memchr::memchr2(b'"', b'\\', &b[i..]) {
            None => return Err((0, ErrorKind::UnterminatedValue)),
            Some(j) => {
                let k = i + j;
                if b[k] == b'"' {
                    return Ok((k, k + 1));
                }
                match b.get(k + 1) {
                    Some(b'\\' | b'"' | b'n') => i = k + 2,
                    _ => return Err((k, ErrorKind::BadEscape)),
                }
            }
        }
    }
}

fn unescape(v: &str) -> Cow<'_, str> {
    if !v.contains('\\') {
        return Cow::Borrowed(v);
    }
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// Length of the metric name at the start of `line` (0 if none).
#[must_use]
pub(crate) fn name_len(line: &[u8]) -> usize {
    match line.first() {
        Some(&b) if is_name_start(b) => line.iter().take_while(|&&b| is_name_byte(b)).count(),
        _ => 0,
    }
}

fn parse_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => {
            let b = s.as_bytes();
            // Reject Rust-only spellings ("infinity") and empty text.
            if b.is_empty() || !(b[0].is_ascii_digit() || matches!(b[0], b'+' | b'-' | b'.')) {
                return None;
            }
            s.parse().ok()
        }
    }
}

/// Parses one sample line (no trailing newline; `\r` tolerated). `line_no` is
/// used in errors and the sample.
///
/// # Errors
/// A [`ParseError`] pointing at the first offending byte.
pub fn parse_sample(line: &str, line_no: usize) -> Result<Sample<'_>, ParseError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let b = line.as_bytes();
    let err = |at: usize, kind| ParseError {
        line: line_no,
        col: at + 1,
        kind,
    };
    let n = name_len(b);
    if n == 0 {
        return Err(err(0, ErrorKind::ExpectedName));
    }
    let name = &line[..n];
    let mut i = n;
    let mut labels_raw = "";
    if b.get(i) == Some(&b'{') {
        let start = i + 1;
        i = start;
        loop {
            while matches!(b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
            if b.get(i) == Some(&b'}') {
                break;
            }
            let ln = match b.get(i) {
                Some(&c) if c.is_ascii_alphabetic() || c == b'_' => b[i..]
                    .iter()
                    .take_while(|&&c| c.is_ascii_alphanumeric() || c == b'_')
                    .count(),
                _ => return Err(err(i, ErrorKind::ExpectedLabelName)),
            };
            i += ln;
            while matches!(b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
            if b.get(i) != Some(&b'=') {
                return Err(err(i, ErrorKind::ExpectedEquals));
            }
            i += 1;
            while matches!(b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
            if b.get(i) != Some(&b'"') {
                return Err(err(i, ErrorKind::ExpectedQuote));
            }
            i += 1;
            match scan_quoted(&b[i..]) {
                Ok((_, used)) => i += used,
                Err((at, kind)) => return Err(err(i + at, kind)),
            }
            while matches!(b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => break,
                _ => return Err(err(i, ErrorKind::ExpectedCommaOrBrace)),
            }
        }
        labels_raw = &line[start..i];
        i += 1; // '}'
    }
    let rest = &line[i..];
    if !rest.starts_with([' ', '\t']) {
        return Err(err(i, ErrorKind::ExpectedValue));
    }
    // OpenMetrics exemplar: everything after " # " is the exemplar; skip it.
    let (body, _exemplar) = match rest.find(" # ") {
        Some(k) => (&rest[..k], Some(&rest[k + 3..])),
        None => (rest, None),
    };
    let mut fields = body.split_ascii_whitespace();
    let value_text = fields
        .next()
        .ok_or_else(|| err(i, ErrorKind::ExpectedValue))?;
    let value_at = i + rest.find(value_text).unwrap_or(0);
    let value = parse_float(value_text).ok_or_else(|| err(value_at, ErrorKind::BadValue))?;
    let timestamp = match fields.next() {
        None => None,
        Some(ts) => Some(
            parse_float(ts)
                .filter(|t| t.is_finite())
                .ok_or_else(|| err(i + rest.find(ts).unwrap_or(0), ErrorKind::BadTimestamp))?,
        ),
    };
    if let Some(extra) = fields.next() {
        return Err(err(
            i + rest.find(extra).unwrap_or(0),
            ErrorKind::TrailingText,
        ));
    }
    Ok(Sample {
        name,
        labels_raw,
        value,
        timestamp,
        line: line_no,
    })
}

/// Iterator over the samples of a page, skipping comments and blank lines.
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
}

/// Iterates the samples of `text`. Each item is a sample or the error of one
/// line (the iterator continues after it: lenient; stop at the first `Err`
/// for strict parsing).
#[must_use]
pub fn samples(text: &str) -> Samples<'_> {
    Samples {
        text,
        pos: 0,
        line: 0,
    }
}

impl<'a> Samples<'a> {
    /// The next non-comment, non-blank line and its number.
    pub(crate) fn next_line(&mut self) -> Option<(&'a str, usize)> {
        let bytes = self.text.as_bytes();
        while self.pos < bytes.len() {
            let end =
                memchr::memchr(b'\n', &bytes[self.pos..]).map_or(bytes.len(), |j| self.pos + j);
            let line = &self.text[self.pos..end];
            self.pos = end + 1;
            self.line += 1;
            let first = line
                .as_bytes()
                .iter()
                .position(|&c| c != b' ' && c != b'\t');
            match first {
                None => continue,
                Some(f) if line.as_bytes()[f] == b'#' || line.as_bytes()[f] == b'\r' => continue,
                Some(f) => return Some((&line[f..], self.line)),
            }
        }
        None
    }
}

impl<'a> Iterator for Samples<'a> {
    type Item = Result<Sample<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (line, no) = self.next_line()?;
        Some(parse_sample(line, no))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_values_and_timestamps() {
        let s = parse_sample(r#"a:b_c{x="1",y="q\"u\\o\nte",} -Inf 1700000000000"#, 3).unwrap();
        assert_eq!(s.name, "a:b_c");
        assert_eq!(s.value, f64::NEG_INFINITY);
        assert_eq!(s.timestamp, Some(1_700_000_000_000.0));
        let labels: Vec<_> = s.labels().collect();
        assert_eq!(labels[0], ("x", Cow::Borrowed("1")));
        assert_eq!(labels[1].1, "q\"u\\o\nte");
        assert!(matches!(labels[1].1, Cow::Owned(_)));
        assert_eq!(s.label("y").as_deref(), Some("q\"u\\o\nte"));

        let s = parse_sample("up{} NaN\r", 1).unwrap();
        assert!(s.value.is_nan());
        assert_eq!(s.labels().count(), 0);
        let s = parse_sample("x 1.5e3 # {trace_id=\"a\"} 1 2", 1).unwrap();
        assert_eq!(s.value, 1500.0);
    }

    #[test]
    fn errors_point_at_the_problem() {
        let cases = [
            ("{a=\"1\"} 1", 1, ErrorKind::ExpectedName),
            ("m{a=1} 1", 5, ErrorKind::ExpectedQuote),
            ("m{a=\"1} 1", 6, ErrorKind::UnterminatedValue),
            ("m{a=\"\\x\"} 1", 6, ErrorKind::BadEscape),
            ("m{a=\"1\" b=\"2\"} 1", 9, ErrorKind::ExpectedCommaOrBrace),
            ("m", 2, ErrorKind::ExpectedValue),
            ("m one", 3, ErrorKind::BadValue),
            ("m infinity", 3, ErrorKind::BadValue),
            ("m 1 x", 5, ErrorKind::BadTimestamp),
            ("m 1 2 3", 7, ErrorKind::TrailingText),
        ];
        for (line, col, kind) in cases {
            let e = parse_sample(line, 7).unwrap_err();
            assert_eq!((e.line, e.col, e.kind), (7, col, kind), "{line:?}");
        }
    }

    #[test]
    fn iterator_skips_comments_and_keeps_going_after_errors() {
        let page = "# HELP m help\n# TYPE m gauge\n\nm 1\nbad line here\r\n  m{a=\"b\"} 2\n# EOF";
        let items: Vec<_> = samples(page).collect();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].as_ref().unwrap().value, 1.0);
        assert_eq!(items[1].as_ref().unwrap_err().line, 5);
        assert_eq!(items[2].as_ref().unwrap().line, 6);
        let e = items[1].as_ref().unwrap_err();
        assert_eq!(e.snippet(page, 6), "line h");
    }
}
