//! The line grammar as nom parsers over `&str`, one line at a time (complete
//! input, `\n` and `\r` already removed).
//!
//! Structure is nom combinators; the hot leaves (names, label sets, numbers)
//! are hand-written nom-compatible functions over bytes, because they decide
//! throughput. Errors are [`Fail`]: the unconsumed input and an
//! [`ErrorKind`], `Copy`, never allocated, so backtracking costs nothing.
//! A failure after a committed prefix (inside `{...}`, a bad value) is
//! `nom::Err::Failure`, so `opt`/`alt` around it do not hide it.

use nom::{
    Err, IResult, Parser,
    branch::alt,
    bytes::complete::tag,
    character::complete::char,
    combinator::{eof, opt, peek, rest},
    sequence::{preceded, terminated},
};

use crate::{error::ErrorKind, value::parse_f64};

/// A parse failure: where (the unconsumed input) and what was expected.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fail<'a> {
    pub(crate) at: &'a str,
    pub(crate) kind: ErrorKind,
}

impl<'a> nom::error::ParseError<&'a str> for Fail<'a> {
    fn from_error_kind(at: &'a str, _: nom::error::ErrorKind) -> Self {
        Self {
            at,
            kind: ErrorKind::TrailingText,
        }
    }

    fn append(_: &'a str, _: nom::error::ErrorKind, other: Self) -> Self {
        other
    }
}

pub(crate) type PResult<'a, O> = IResult<&'a str, O, Fail<'a>>;

fn error<O>(at: &str, kind: ErrorKind) -> PResult<'_, O> {
    Err(Err::Error(Fail { at, kind }))
}

fn failure<O>(at: &str, kind: ErrorKind) -> PResult<'_, O> {
    Err(Err::Failure(Fail { at, kind }))
}

// === character classes ===

const NAME_START: u8 = 1;
const NAME: u8 = 2;
const LABEL_START: u8 = 4;
const LABEL: u8 = 8;

/// Byte classes for names: one table load per byte in the hot loops.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        let alpha = b.is_ascii_alphabetic() || b == b'_';
        let mut v = 0;
        if alpha || b == b':' {
            v |= NAME_START | NAME;
        }
        if b.is_ascii_digit() {
            v |= NAME | LABEL;
        }
        if alpha {
            v |= LABEL_START | LABEL;
        }
        t[c] = v;
        c += 1;
    }
    t
};

fn span_len(b: &[u8], start: u8, cont: u8) -> usize {
    match b.first() {
        Some(&c) if CLASS[usize::from(c)] & start != 0 => {
            1 + b[1..]
                .iter()
                .take_while(|&&c| CLASS[usize::from(c)] & cont != 0)
                .count()
        }
        _ => 0,
    }
}

/// Length of the metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) starting `b`; 0 if none.
///
/// Names are long (`vllm:request_time_per_output_token_seconds_bucket`) and
/// this runs on every line, so the body is checked eight bytes at a time.
#[inline]
pub(crate) fn name_len(b: &[u8]) -> usize {
    match b.first() {
        Some(&c) if CLASS[usize::from(c)] & NAME_START != 0 => {}
        _ => return 0,
    }
    let mut i = 1;
    while let Some(chunk) = b.get(i..i + 8) {
        let Ok(word) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let other = !name_bytes(u64::from_le_bytes(word)) & HI;
        if other != 0 {
            return i + (other.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + b[i..]
        .iter()
        .take_while(|&&c| CLASS[usize::from(c)] & NAME != 0)
        .count()
}

/// High bit set in each byte `b` of `x` with `m < b < n` (exact per byte;
/// bytes >= 128 never qualify; needs `m, n <= 128`).
#[inline]
const fn between(x: u64, m: u64, n: u64) -> u64 {
    let low7 = x & (LO * 127);
    (LO * (127 + n)).wrapping_sub(low7) & !x & low7.wrapping_add(LO * (127 - m)) & HI
}

/// High bit set in each byte of `x` that may continue a metric name:
/// `0-9 :` (0x30-0x3A), `A-Z`, `_`, `a-z`.
#[inline]
const fn name_bytes(x: u64) -> u64 {
    between(x, 0x2F, 0x3B)
        | between(x, 0x40, 0x5B)
        | between(x, 0x5E, 0x60)
        | between(x, 0x60, 0x7B)
}

/// Length of the label name (`[a-zA-Z_][a-zA-Z0-9_]*`) starting `b`; 0 if none.
pub(crate) fn label_name_len(b: &[u8]) -> usize {
    span_len(b, LABEL_START, LABEL)
}

pub(crate) fn skip_blanks(b: &[u8], mut k: usize) -> usize {
    while matches!(b.get(k), Some(b' ' | b'\t')) {
        k += 1;
    }
    k
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `v` equal to `c`; the lowest set bit marks
/// the first such byte exactly (later bytes may have false positives).
#[inline]
fn bytes_eq(v: u64, c: u8) -> u64 {
    let x = v ^ (LO * u64::from(c));
    x.wrapping_sub(LO) & !x & HI
}

/// Index of the first `"` or `\` in `b`. Label values are mostly short
/// (`"0"`, `"0.005"`, a model name), where eight bytes at a time in a
/// register beat a SIMD call's setup; long values go to `memchr2`.
#[inline]
fn find_quote_or_backslash(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(chunk) = b.get(i..i + 8) {
        let Ok(word) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let v = u64::from_le_bytes(word);
        let m = bytes_eq(v, b'"') | bytes_eq(v, b'\\');
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
        if i >= 64 {
            return memchr::memchr2(b'"', b'\\', &b[i..]).map(|k| i + k);
        }
    }
    b.get(i..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| i + k)
}

/// Finds the `"` closing a label value in `b` (which starts after the
/// opening quote): its index and whether the value holds escapes. Any
/// character may be escaped; only `\\`, `\"` and `\n` are translated.
pub(crate) fn close_quote(b: &[u8]) -> Option<(usize, bool)> {
    let mut i = 0;
    let mut escaped = false;
    loop {
        let k = i + find_quote_or_backslash(b.get(i..)?)?;
        if b[k] == b'"' {
            return Some((k, escaped));
        }
        escaped = true;
        i = k + 2;
    }
}

// === leaves ===

/// `[ \t]*`
pub(crate) fn blanks0(i: &str) -> PResult<'_, &str> {
    let k = skip_blanks(i.as_bytes(), 0);
    Ok((&i[k..], &i[..k]))
}

/// `[ \t]+`
fn blanks1(i: &str) -> PResult<'_, &str> {
    match blanks0(i)? {
        (_, "") => error(i, ErrorKind::ExpectedValue),
        ok => Ok(ok),
    }
}

/// A metric name.
pub(crate) fn metric_name(i: &str) -> PResult<'_, &str> {
    match name_len(i.as_bytes()) {
        0 => error(i, ErrorKind::ExpectedName),
        n => Ok((&i[n..], &i[..n])),
    }
}

/// Labels whose place [`label_set_spans`] records, so iterating them later
/// is slicing rather than scanning again.
pub(crate) const SPANS: usize = 4;

/// Where the first [`SPANS`] labels of a validated set are: offsets in the
/// set's text of name start, name end, value start, value end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Spans {
    pub(crate) len: u8,
    /// Bit `i`: label `i`'s value has escapes.
    pub(crate) escaped: u8,
    pub(crate) at: [[u16; 4]; SPANS],
}

/// `{` labels `}` with optional trailing comma and blanks anywhere between
/// tokens; yields the text between the braces. Fails softly (`Error`) if
/// the input does not start with `{`, hard (`Failure`) after it.
pub(crate) fn label_set(i: &str) -> PResult<'_, &str> {
    label_set_spans(i).map(|(r, (raw, _))| (r, raw))
}

/// [`label_set`], also recording where the first labels are.
pub(crate) fn label_set_spans(i: &str) -> PResult<'_, (&str, Spans)> {
    let Some(body) = i.strip_prefix('{') else {
        return error(i, ErrorKind::ExpectedValue);
    };
    let b = body.as_bytes();
    let at = |k: usize| body.get(k..).unwrap_or_default();
    let mut spans = Spans::default();
    // Labels validated so far (all recorded in `spans` while equal to its
    // len), and a one-word filter of their names (a bit per length and first
    // byte): only a name whose bit is set is compared with the earlier ones.
    let mut seen = 0usize;
    let mut filter = 0u64;
    let mut k = 0;
    loop {
        k = skip_blanks(b, k);
        if b.get(k) == Some(&b'}') {
            return Ok((&body[k + 1..], (&body[..k], spans)));
        }
        let name_start = k;
        let n = label_name_len(&b[k..]);
        if n == 0 {
            return failure(at(k), ErrorKind::ExpectedLabelName);
        }
        let name_end = k + n;
        let bit = 1u64 << ((n * 7 + usize::from(b[name_start])) & 63);
        if filter & bit != 0
            && seen_before(body, &spans, seen, &b[name_start..name_end], name_start)
        {
            return failure(at(name_start), ErrorKind::DuplicateLabel);
        }
        filter |= bit;
        seen += 1;
        k = skip_blanks(b, name_end);
        if b.get(k) != Some(&b'=') {
            return failure(at(k), ErrorKind::ExpectedEquals);
        }
        k = skip_blanks(b, k + 1);
        if b.get(k) != Some(&b'"') {
            return failure(at(k), ErrorKind::ExpectedQuote);
        }
        let value_start = k + 1;
        let Some((len, escaped)) = close_quote(&b[value_start..]) else {
            return failure(at(k), ErrorKind::UnterminatedValue);
        };
        let value_end = value_start + len;
        let slot = usize::from(spans.len);
        if slot < SPANS && value_end <= usize::from(u16::MAX) {
            // All four offsets are <= value_end, so `as` is lossless.
            spans.at[slot] = [
                name_start as u16,
                name_end as u16,
                value_start as u16,
                value_end as u16,
            ];
            spans.escaped |= u8::from(escaped) << slot;
            spans.len += 1;
        }
        k = skip_blanks(b, value_end + 1);
        match b.get(k) {
            Some(b',') => k += 1,
            Some(b'}') => {}
            _ => return failure(at(k), ErrorKind::ExpectedCommaOrBrace),
        }
    }
}

/// Whether label `name` already occurs in `body[..before]`, the validated
/// part of a label set: the recorded spans first, then the labels after them
/// (only sets of more than [`SPANS`] labels get that far). Lines have a
/// handful of labels, so comparing against each earlier name is cheaper
/// than any set structure.
#[inline]
fn seen_before(body: &str, spans: &Spans, seen: usize, name: &[u8], before: usize) -> bool {
    let b = body.as_bytes();
    let recorded = &spans.at[..usize::from(spans.len)];
    for &[s, e, ..] in recorded {
        let (s, e) = (usize::from(s), usize::from(e));
        // Lengths differ for most pairs; compare bytes only when they match.
        if e.checked_sub(s) == Some(name.len()) && b.get(s..e) == Some(name) {
            return true;
        }
    }
    if seen == recorded.len() {
        return false;
    }
    let mut rest = match recorded.last() {
        Some(&[.., value_end]) => body.get(usize::from(value_end) + 1..before),
        None => body.get(..before),
    }
    .unwrap_or_default();
    while let Some(((n, _, _), tail)) = next_label(rest) {
        if n.as_bytes() == name {
            return true;
        }
        rest = tail;
    }
    false
}

/// The first label of `s` (skipping separators) and the text after it:
/// `(name, value as written, whether the value has escapes)`.
///
/// `s` comes from a label set the grammar validated, so the name runs to
/// the first `=` or blank and the value to the first unescaped `"`; only
/// bounds are checked here (a hand-built [`crate::Sample`] may yield
/// nonsense but never panics).
#[inline]
pub(crate) fn next_label(s: &str) -> Option<((&str, &str, bool), &str)> {
    let b = s.as_bytes();
    let mut k = 0;
    while matches!(b.get(k), Some(b' ' | b'\t' | b',')) {
        k += 1;
    }
    let start = k;
    while !matches!(b.get(k)?, b'=' | b' ' | b'\t') {
        k += 1;
    }
    let name = s.get(start..k)?;
    while b.get(k)? != &b'"' {
        k += 1;
    }
    let (end, escaped) = close_quote(b.get(k + 1..)?)?;
    let value = s.get(k + 1..k + 1 + end)?;
    Some(((name, value, escaped), s.get(k + end + 2..)?))
}

/// A token up to the next blank.
fn token(i: &str) -> PResult<'_, &str> {
    let n = i
        .as_bytes()
        .iter()
        .position(|&c| c == b' ' || c == b'\t')
        .unwrap_or(i.len());
    Ok((&i[n..], &i[..n]))
}

/// A number token; `kind` if it is missing or not a number.
fn number(kind: ErrorKind) -> impl FnMut(&str) -> PResult<'_, f64> {
    move |i| {
        let (rest, t) = token(i)?;
        match parse_f64(t) {
            Some(v) => Ok((rest, v)),
            None => failure(i, kind),
        }
    }
}

fn timestamp(i: &str) -> PResult<'_, f64> {
    match number(ErrorKind::BadTimestamp)(i)? {
        (r, t) if t.is_finite() => Ok((r, t)),
        _ => failure(i, ErrorKind::BadTimestamp),
    }
}

// === lines ===

/// The parts of a sample line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SampleParts<'a> {
    pub(crate) name: &'a str,
    pub(crate) labels: &'a str,
    pub(crate) spans: Spans,
    pub(crate) value: f64,
    pub(crate) timestamp: Option<f64>,
    pub(crate) exemplar: Option<(&'a str, f64, Option<f64>)>,
}

/// `name [{labels}] value [timestamp] [# {labels} value [timestamp]]`
pub(crate) fn sample_line(i: &str) -> PResult<'_, SampleParts<'_>> {
    let (i, name) = metric_name(i)?;
    let (i, braces) = opt(preceded(blanks0, label_set_spans)).parse(i)?;
    // No labels: an empty slice of the line, so everything borrows from it.
    let (labels, spans) = braces.unwrap_or((&i[..0], Spans::default()));
    let (i, sp) = blanks0(i)?;
    if sp.is_empty() && braces.is_none() || i.is_empty() {
        return failure(i, ErrorKind::ExpectedValue);
    }
    let (i, value) = number(ErrorKind::BadValue)(i)?;
    let (i, _) = blanks0(i)?;
    let (i, timestamp) = if i.is_empty() || i.starts_with('#') {
        (i, None)
    } else {
        let (i, t) = terminated(timestamp, blanks0).parse(i)?;
        (i, Some(t))
    };
    let (i, exemplar) = opt(exemplar).parse(i)?;
    if !i.is_empty() {
        return failure(i, ErrorKind::TrailingText);
    }
    Ok((
        i,
        SampleParts {
            name,
            labels,
            spans,
            value,
            timestamp,
            exemplar,
        },
    ))
}

/// `# {labels} value [timestamp]` (OpenMetrics).
fn exemplar(i: &str) -> PResult<'_, (&str, f64, Option<f64>)> {
    let (i, _) = char('#').parse(i)?;
    let (i, _) = blanks0(i)?;
    let (i, labels) = match label_set(i) {
        Err(Err::Error(_)) => return failure(i, ErrorKind::BadExemplar),
        r => r?,
    };
    let (i, _) = blanks0(i)?;
    if i.is_empty() {
        return failure(i, ErrorKind::BadExemplar);
    }
    let (i, value) = number(ErrorKind::BadExemplar)(i)?;
    let (i, _) = blanks0(i)?;
    if i.is_empty() {
        return Ok((i, (labels, value, None)));
    }
    let (i, ts) = terminated(timestamp, blanks0).parse(i)?;
    Ok((i, (labels, value, Some(ts))))
}

/// A `#` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Comment<'a> {
    Help(&'a str, &'a str),
    Type(&'a str, &'a str),
    Unit(&'a str, &'a str),
    Eof,
    Plain(&'a str),
}

/// `# HELP name text`, `# TYPE name type`, `# UNIT name unit`, `# EOF`, or
/// any other comment.
pub(crate) fn comment_line(i: &str) -> PResult<'_, Comment<'_>> {
    let (i, _) = char('#').parse(i)?;
    let keyword = preceded(
        blanks1,
        terminated(
            alt((tag("HELP"), tag("TYPE"), tag("UNIT"), tag("EOF"))),
            peek(alt((blanks1, eof))),
        ),
    );
    let (after, kw) = match opt(keyword).parse(i)? {
        (_, None) => return Ok(("", Comment::Plain(i.trim_start_matches([' ', '\t'])))),
        (after, Some(kw)) => (after, kw),
    };
    if kw == "EOF" {
        return Ok(match blanks0(after)? {
            ("", _) => ("", Comment::Eof),
            _ => ("", Comment::Plain(i.trim_start_matches([' ', '\t']))),
        });
    }
    let (r, _) = blanks0(after)?;
    let (r, name) = match metric_name(r) {
        Err(Err::Error(e)) => return Err(Err::Failure(e)),
        res => res?,
    };
    let (r, text) = match r {
        "" => (r, ""),
        _ => preceded(
            |r| match blanks1(r) {
                Err(Err::Error(_)) => failure(r, ErrorKind::TrailingText),
                res => res,
            },
            rest,
        )
        .parse(r)?,
    };
    Ok(match kw {
        "HELP" => (r, Comment::Help(name, text)),
        "UNIT" => (r, Comment::Unit(name, text.trim_end_matches([' ', '\t']))),
        _ => {
            let t = text.trim_end_matches([' ', '\t']);
            if t.is_empty() || t.contains([' ', '\t']) {
                return failure(text, ErrorKind::BadType);
            }
            (r, Comment::Type(name, t))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind<O: std::fmt::Debug>(r: PResult<'_, O>) -> (ErrorKind, &str) {
        match r {
            Err(Err::Error(f) | Err::Failure(f)) => (f.kind, f.at),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn word_at_a_time_name_scan_matches_the_table() {
        for c in 0..=255u8 {
            for at in 1..12 {
                let mut line = b"abcdefghijklmnop".to_vec();
                line[at] = c;
                let want = span_len(&line, NAME_START, NAME);
                assert_eq!(name_len(&line), want, "byte {c:#x} at {at}");
            }
        }
    }

    #[test]
    fn leaves_leave_the_tail() {
        assert_eq!(metric_name("vllm:x_total{a"), Ok(("{a", "vllm:x_total")));
        assert_eq!(kind(metric_name("9x")), (ErrorKind::ExpectedName, "9x"));
        assert_eq!(label_set("{} 1"), Ok((" 1", "")));
        assert_eq!(
            label_set("{ a = \"x\\\"}\" , b=\"\",} 1"),
            Ok((" 1", " a = \"x\\\"}\" , b=\"\","))
        );
        assert_eq!(
            kind(label_set("{a=\"1\" b=\"2\"}")),
            (ErrorKind::ExpectedCommaOrBrace, "b=\"2\"}")
        );
        assert_eq!(kind(label_set("{a=1}")), (ErrorKind::ExpectedQuote, "1}"));
        assert_eq!(kind(label_set("{a}")), (ErrorKind::ExpectedEquals, "}"));
        assert_eq!(kind(label_set("{:a=\"\"}")).0, ErrorKind::ExpectedLabelName);
        assert_eq!(
            kind(label_set("{a=\"1\\\"}")).0,
            ErrorKind::UnterminatedValue
        );
        assert_eq!(kind(label_set("{a=\"1\\")).0, ErrorKind::UnterminatedValue);
        assert!(matches!(label_set("x"), Err(Err::Error(_))));
        // A repeated label name, among the recorded first labels or after them.
        assert_eq!(
            kind(label_set("{a=\"1\", b=\"2\",a=\"3\"}")),
            (ErrorKind::DuplicateLabel, "a=\"3\"}")
        );
        let many = |last: &str| {
            format!("{{a=\"1\",b=\"\\\"\",c=\"3\",d=\"4\",e=\"5\", f=\"6\",{last}=\"7\"}}")
        };
        for dup in ["a", "d", "e", "f"] {
            let set = many(dup);
            assert_eq!(kind(label_set(&set)).0, ErrorKind::DuplicateLabel, "{set}");
        }
        assert_eq!(label_set(&many("g")).map(|(r, _)| r), Ok(""));
        // "Zx" shares "a"'s filter bit: compared, and found distinct.
        assert_eq!(label_set("{a=\"1\",Zx=\"2\"}").map(|(r, _)| r), Ok(""));
        assert_eq!(
            kind(label_set("{a=\"1\",Zx=\"2\",a=\"3\"}")).0,
            ErrorKind::DuplicateLabel
        );
        assert_eq!(
            label_set("{ab=\"1\",a=\"2\",b=\"3\"}").map(|(r, _)| r),
            Ok("")
        );
        assert_eq!(blanks0(" \t x"), Ok(("x", " \t ")));
        for n in 0..100 {
            let v = format!("{}\"", "é".repeat(n / 2) + &"x".repeat(n % 2));
            assert_eq!(close_quote(v.as_bytes()), Some((v.len() - 1, false)));
            let v = format!("{}\\\"x\\\\\"", "a".repeat(n));
            assert_eq!(close_quote(v.as_bytes()), Some((v.len() - 1, true)), "{v}");
        }
        assert_eq!(close_quote(b"abc"), None);
        assert_eq!(close_quote(b"abcdefghijklm\\"), None);
    }

    #[test]
    fn sample_lines() {
        let (_, s) = sample_line("m{a=\"b\"} 1.5 1700000000000").unwrap();
        assert_eq!(
            (s.name, s.labels, s.value, s.timestamp),
            ("m", "a=\"b\"", 1.5, Some(1.7e12))
        );
        let (_, s) = sample_line("m {} -Inf").unwrap();
        assert_eq!((s.labels, s.value), ("", f64::NEG_INFINITY));
        let (_, s) = sample_line("m_bucket{le=\"1\"} 3 # {trace_id=\"abc\"} 0.5 1.5 ").unwrap();
        assert_eq!(s.exemplar, Some(("trace_id=\"abc\"", 0.5, Some(1.5))));
        let (_, s) = sample_line("m 2 10 # {} 1").unwrap();
        assert_eq!(
            (s.timestamp, s.exemplar),
            (Some(10.0), Some(("", 1.0, None)))
        );
        assert_eq!(kind(sample_line("m")), (ErrorKind::ExpectedValue, ""));
        assert_eq!(kind(sample_line("m-1")), (ErrorKind::ExpectedValue, "-1"));
        assert_eq!(kind(sample_line("m x")), (ErrorKind::BadValue, "x"));
        assert_eq!(
            kind(sample_line("m 1 NaN")),
            (ErrorKind::BadTimestamp, "NaN")
        );
        assert_eq!(kind(sample_line("m 1 2 3")), (ErrorKind::TrailingText, "3"));
        assert_eq!(kind(sample_line("m 1 # x")).0, ErrorKind::BadExemplar);
        assert_eq!(
            kind(sample_line("m 1 # {a=\"\"}")).0,
            ErrorKind::BadExemplar
        );
        assert_eq!(
            kind(sample_line("m 1 # {a=\"\"} 1 2 3")).0,
            ErrorKind::TrailingText
        );
    }

    #[test]
    fn comment_lines() {
        let c = |s| comment_line(s).map(|(_, c)| c);
        assert_eq!(c("# HELP m a b\\n c "), Ok(Comment::Help("m", "a b\\n c ")));
        assert_eq!(c("# HELP m"), Ok(Comment::Help("m", "")));
        assert_eq!(
            c("#\tTYPE m_total counter "),
            Ok(Comment::Type("m_total", "counter"))
        );
        assert_eq!(c("# UNIT m seconds"), Ok(Comment::Unit("m", "seconds")));
        assert_eq!(c("# EOF"), Ok(Comment::Eof));
        assert_eq!(c("# EOF more"), Ok(Comment::Plain("EOF more")));
        assert_eq!(c("# HELPING hand"), Ok(Comment::Plain("HELPING hand")));
        assert_eq!(c("#HELP m x"), Ok(Comment::Plain("HELP m x")));
        assert_eq!(kind(comment_line("# TYPE m")).0, ErrorKind::BadType);
        assert_eq!(kind(comment_line("# TYPE m a b")).0, ErrorKind::BadType);
        assert_eq!(kind(comment_line("# HELP 1m x")).0, ErrorKind::ExpectedName);
        assert_eq!(
            kind(comment_line("# HELP m{} x")).0,
            ErrorKind::TrailingText
        );
    }
}
