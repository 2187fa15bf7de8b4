//! Errors: small `Copy` values that say where (line, column), what was
//! expected, and carry a short excerpt of the offending text for display.

use std::fmt;

/// What the parser expected and did not find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) was expected.
    ExpectedName,
    /// A label name (`[a-zA-Z_][a-zA-Z0-9_]*`) was expected.
    ExpectedLabelName,
    /// `=` was expected after a label name.
    ExpectedEquals,
    /// A `"` opening a label value was expected.
    ExpectedQuote,
    /// A label value was not closed by `"` before the end of the line.
    UnterminatedValue,
    /// `,` or `}` was expected after a label.
    ExpectedCommaOrBrace,
    /// Blank space and a sample value were expected.
    ExpectedValue,
    /// The sample value is not a number (`1`, `-2.5e3`, `NaN`, `+Inf`, ...).
    BadValue,
    /// The timestamp is not a finite number.
    BadTimestamp,
    /// An exemplar (`# {labels} value [timestamp]`) is malformed.
    BadExemplar,
    /// Unexpected text after the sample (or after a `# TYPE` line's type).
    TrailingText,
    /// `# TYPE` names an unknown metric type.
    BadType,
    /// Content follows the OpenMetrics `# EOF` marker.
    ContentAfterEof,
    /// A label name occurs twice in one label set (`{a="1",a="2"}`).
    DuplicateLabel,
}

impl ErrorKind {
    /// What was expected, as a short phrase.
    #[must_use]
    pub const fn expected(self) -> &'static str {
        match self {
            Self::ExpectedName => "a metric name",
            Self::ExpectedLabelName => "a label name",
            Self::ExpectedEquals => "'=' after the label name",
            Self::ExpectedQuote => "'\"' opening the label value",
            Self::UnterminatedValue => "'\"' closing the label value",
            Self::ExpectedCommaOrBrace => "',' or '}' after a label",
            Self::ExpectedValue => "a space and the sample value",
            Self::BadValue => "a number (e.g. 1, -2.5e3, NaN, +Inf) as the sample value",
            Self::BadTimestamp => "a finite number as the timestamp",
            Self::BadExemplar => "an exemplar '# {labels} value [timestamp]'",
            Self::TrailingText => "the end of the line",
            Self::BadType => {
                "a metric type (counter, gauge, histogram, summary, untyped, unknown, \
                 gaugehistogram, stateset, info)"
            }
            Self::ContentAfterEof => "nothing after '# EOF'",
            Self::DuplicateLabel => "a label name not already in this label set",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected {}", self.expected())
    }
}

/// Bytes of context kept in a [`ParseError`].
pub const SNIPPET_LEN: usize = 40;

/// A parse error: 1-based line and byte column, what was expected, and an
/// excerpt of the line around the error (at most [`SNIPPET_LEN`] bytes, cut on
/// character boundaries). `Copy`, no allocation, no borrow of the input.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParseError {
    /// 1-based line number.
    pub line: u32,
    /// 1-based column, in bytes, of the first offending byte.
    pub col: u32,
    /// What was expected.
    pub kind: ErrorKind,
    snippet: [u8; SNIPPET_LEN],
    snippet_len: u8,
}

impl ParseError {
    /// Builds an error for `line` (without its newline) with the offending
    /// byte at `offset` within it.
    pub(crate) fn new(line_no: u32, line: &str, offset: usize, kind: ErrorKind) -> Self {
        let offset = offset.min(line.len());
        // Some context before the error, the rest after it.
        let mut start = offset.saturating_sub(SNIPPET_LEN / 4);
        while !line.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start + SNIPPET_LEN).min(line.len());
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let text = line.get(start..end).unwrap_or_default().as_bytes();
        let mut snippet = [0; SNIPPET_LEN];
        snippet[..text.len()].copy_from_slice(text);
        Self {
            line: line_no,
            col: u32::try_from(offset + 1).unwrap_or(u32::MAX),
            kind,
            snippet,
            snippet_len: u8::try_from(text.len()).unwrap_or(0),
        }
    }

    /// The same error for a line that had `by` bytes of indentation removed.
    #[must_use]
    pub(crate) fn indented(mut self, by: usize) -> Self {
        let by = u32::try_from(by).unwrap_or(u32::MAX);
        self.col = self.col.saturating_add(by);
        self
    }

    /// An excerpt of the offending line around the error (truncated).
    #[must_use]
    pub fn snippet(&self) -> &str {
        // Always built from whole characters of a `str`; never fails.
        std::str::from_utf8(&self.snippet[..usize::from(self.snippet_len)]).unwrap_or_default()
    }
}

impl fmt::Debug for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParseError")
            .field("line", &self.line)
            .field("col", &self.col)
            .field("kind", &self.kind)
            .field("snippet", &self.snippet())
            .finish()
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {} near {:?}",
            self.line,
            self.col,
            self.kind,
            self.snippet()
        )
    }
}

impl std::error::Error for ParseError {}

/// Why a selector spec such as `family{label="value"}` is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    /// The spec as given.
    pub spec: String,
    /// Byte offset of the problem in `spec`.
    pub at: usize,
    /// What was expected there.
    pub expected: &'static str,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid metric selector {:?}: expected {} at offset {}",
            self.spec, self.expected, self.at
        )
    }
}

impl std::error::Error for SelectorError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_is_truncated_on_char_boundaries() {
        let line = format!("m{{a=\"{}\"}} x", "é".repeat(40));
        let e = ParseError::new(3, &line, line.len() - 1, ErrorKind::BadValue);
        assert_eq!((e.line, e.col), (3, u32::try_from(line.len()).unwrap()));
        assert!(e.snippet().ends_with("\"} x"), "{:?}", e.snippet());
        assert!(e.snippet().len() <= SNIPPET_LEN);
        let e = ParseError::new(1, "m", 1, ErrorKind::ExpectedValue);
        assert_eq!(e.snippet(), "m");
        assert_eq!(
            e.to_string(),
            "line 1, column 2: expected a space and the sample value near \"m\""
        );
        assert!(std::mem::size_of::<ParseError>() <= 56);
    }
}
