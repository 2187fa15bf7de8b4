//! Series selection: `family{label="value",...}` specs, many matched at once
//! in one pass over a page that looks at each line's name before anything
//! else.

use std::fmt;

use nom::{
    Err, IResult, Parser,
    character::complete::char,
    combinator::{eof, opt},
    sequence::{delimited, preceded, terminated},
};

use crate::{
    error::{ParseError, SelectorError},
    grammar::{close_quote, label_name_len, name_len},
    lines::Mode,
    sample::{Sample, parse_sample, unescape},
};

/// A series selector: a sample name and `label = value` equality matchers,
/// all of which must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    /// The sample name, e.g. `vllm:num_requests_waiting` or `x_bucket`.
    pub name: String,
    /// `(label, value)` matchers, all of which must hold.
    pub matchers: Vec<(String, String)>,
}

/// Spec parse failure: the unconsumed spec and what was expected there.
#[derive(Debug, Clone, Copy)]
struct SpecFail<'a> {
    at: &'a str,
    expected: &'static str,
}

impl<'a> nom::error::ParseError<&'a str> for SpecFail<'a> {
    fn from_error_kind(at: &'a str, _: nom::error::ErrorKind) -> Self {
        Self { at, expected: "" }
    }

    fn append(_: &'a str, _: nom::error::ErrorKind, other: Self) -> Self {
        other
    }
}

type SResult<'a, O> = IResult<&'a str, O, SpecFail<'a>>;

fn bad<'a, O>(at: &'a str, expected: &'static str) -> SResult<'a, O> {
    Err(Err::Failure(SpecFail { at, expected }))
}

fn spec_name(i: &str) -> SResult<'_, &str> {
    match name_len(i.as_bytes()) {
        0 => Err(Err::Error(SpecFail {
            at: i,
            expected: "a metric name",
        })),
        n => Ok((&i[n..], &i[..n])),
    }
}

fn spec_label(i: &str) -> SResult<'_, &str> {
    match label_name_len(i.as_bytes()) {
        0 => bad(i, "a label name"),
        n => Ok((&i[n..], &i[..n])),
    }
}

/// A quoted (escapes `\\ \" \n`) or bare (up to `,`, `}` or blank) value.
fn spec_value(i: &str) -> SResult<'_, String> {
    if let Some(body) = i.strip_prefix('"') {
        return match close_quote(body.as_bytes()) {
            Some((end, _)) => Ok((&body[end + 1..], unescape(&body[..end]).into_owned())),
            None => bad(i, "'\"' closing the value"),
        };
    }
    let n = i
        .find([',', '}', ' ', '\t', '"', '{', '='])
        .unwrap_or(i.len());
    match n {
        0 => bad(i, "a label value"),
        _ => Ok((&i[n..], i[..n].to_owned())),
    }
}

fn spec_matcher(i: &str) -> SResult<'_, (String, String)> {
    let (i, label) = spec_label(i)?;
    let (i, _) = ws(i)?;
    let Some(i) = i.strip_prefix('=') else {
        return bad(i, "'=' (only equality matchers are supported)");
    };
    let (i, _) = ws(i)?;
    let (i, value) = spec_value(i)?;
    Ok((i, (label.to_owned(), value)))
}

fn ws(i: &str) -> SResult<'_, &str> {
    let n = i.len() - i.trim_start().len();
    Ok((&i[n..], &i[..n]))
}

fn spec_matchers(mut i: &str) -> SResult<'_, Vec<(String, String)>> {
    let mut out = Vec::new();
    loop {
        (i, _) = ws(i)?;
        if let Some(r) = i.strip_prefix('}') {
            return Ok((r, out));
        }
        let (r, m) = spec_matcher(i)?;
        if out.iter().any(|(k, _)| *k == m.0) {
            return bad(i, "a label not already matched in this selector");
        }
        out.push(m);
        let (r, _) = ws(r)?;
        i = match (r.strip_prefix(','), r.starts_with('}')) {
            (Some(r), _) => r,
            (None, true) => r,
            _ => return bad(r, "',' or '}'"),
        };
    }
}

fn spec(i: &str) -> SResult<'_, Selector> {
    let (i, name) = delimited(ws, spec_name, ws).parse(i)?;
    let (i, matchers) = opt(preceded(char('{'), spec_matchers)).parse(i)?;
    let (i, _) = match terminated(ws, eof).parse(i) {
        Err(Err::Error(e)) => {
            return bad(e.at, "'{label=\"value\",...}' or the end after the name");
        }
        r => r?,
    };
    Ok((
        i,
        Selector {
            name: name.to_owned(),
            matchers: matchers.unwrap_or_default(),
        },
    ))
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

    /// Adds a `label = value` matcher.
    #[must_use]
    pub fn with_label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.matchers.push((name.into(), value.into()));
        self
    }

    /// Parses the spec syntax users write: `name`, `name{}`,
    /// `name{a="x", b=y,}` (quoted values with `\\ \" \n` escapes, or bare
    /// values up to `,`/`}`/blank; `=` matchers only).
    ///
    /// ```
    /// use epp_promtext::Selector;
    ///
    /// let s = Selector::parse(r#"nv_trt_llm_request_metrics{request_type="waiting", model=tensorrt_llm}"#)?;
    /// assert_eq!(s.name, "nv_trt_llm_request_metrics");
    /// assert_eq!(s.matchers[1], ("model".to_owned(), "tensorrt_llm".to_owned()));
    /// let e = Selector::parse("vllm:x{a!=\"1\"}").unwrap_err();
    /// assert_eq!(e.at, 8);
    /// assert_eq!(
    ///     e.to_string(),
    ///     "invalid metric selector \"vllm:x{a!=\\\"1\\\"}\": expected '=' (only equality matchers are supported) at offset 8"
    /// );
    /// # Ok::<(), epp_promtext::SelectorError>(())
    /// ```
    ///
    /// # Errors
    /// A [`SelectorError`] with the offset and what was expected there.
    pub fn parse(spec_text: &str) -> Result<Self, SelectorError> {
        spec(spec_text)
            .map(|(_, s)| s)
            .map_err(|e| match e {
                Err::Error(f) | Err::Failure(f) => (f.at, f.expected),
                Err::Incomplete(_) => ("", "more input"),
            })
            .map_err(|(at, expected)| SelectorError {
                spec: spec_text.to_owned(),
                at: spec_text.len() - at.len(),
                expected: if expected.is_empty() {
                    "a matcher"
                } else {
                    expected
                },
            })
    }

    /// Whether `sample` is selected.
    #[must_use]
    pub fn matches(&self, sample: &Sample<'_>) -> bool {
        sample.name == self.name && self.labels_match(sample)
    }

    fn labels_match(&self, sample: &Sample<'_>) -> bool {
        self.matchers.iter().all(|(k, v)| sample.has_label(k, v))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.matchers.is_empty() {
            return Ok(());
        }
        f.write_str("{")?;
        for (i, (k, v)) in self.matchers.iter().enumerate() {
            let sep = if i > 0 { "," } else { "" };
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            write!(f, "{sep}{k}=\"{v}\"")?;
        }
        f.write_str("}")
    }
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// What a scan saw besides the matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Sample lines parsed in full (a selector wants their name).
    pub parsed: usize,
    /// Lines skipped without parsing (comments, names no selector wants).
    pub skipped: usize,
    /// Malformed lines among those parsed (skipped in lenient mode).
    pub errors: usize,
    /// The first error, if any (in strict mode, the one that stopped the scan).
    pub first_error: Option<ParseError>,
}

/// The selectors that share one sample name.
#[derive(Debug, Clone)]
struct NameGroup {
    name: Box<str>,
    members: Vec<usize>,
}

/// Several selectors matched in one pass over a page.
///
/// Each line's name is read first (one table lookup per byte) and checked
/// against a bitmap of the wanted names' lengths, then against the wanted
/// names; only lines with a wanted name are parsed, and their labels only
/// compared when a selector has matchers (escaped values are compared
/// without unescaping them). Nothing is allocated per line.
///
/// `Send + Sync` and immutable once built: share one set across scrapers.
#[derive(Debug, Clone, Default)]
pub struct SelectorSet {
    selectors: Vec<Selector>,
    groups: Vec<NameGroup>,
    len_mask: [u64; 2],
}

impl SelectorSet {
    /// A set over `selectors`; indices passed to callbacks refer to this order.
    #[must_use]
    pub fn new(selectors: Vec<Selector>) -> Self {
        let mut groups: Vec<NameGroup> = Vec::new();
        let mut len_mask = [0u64; 2];
        for (i, s) in selectors.iter().enumerate() {
            match groups.iter_mut().find(|g| *g.name == *s.name) {
                Some(g) => g.members.push(i),
                None => groups.push(NameGroup {
                    name: s.name.as_str().into(),
                    members: vec![i],
                }),
            }
            if let Some(word) = len_mask.get_mut(s.name.len() >> 6) {
                *word |= 1 << (s.name.len() & 63);
            }
        }
        Self {
            selectors,
            groups,
            len_mask,
        }
    }

    /// Parses each spec (see [`Selector::parse`]) into a set.
    ///
    /// # Errors
    /// The first invalid spec's [`SelectorError`].
    pub fn from_specs<S: AsRef<str>>(specs: &[S]) -> Result<Self, SelectorError> {
        let selectors = specs
            .iter()
            .map(|s| Selector::parse(s.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self::new(selectors))
    }

    /// The selectors, in index order.
    #[must_use]
    pub fn selectors(&self) -> &[Selector] {
        &self.selectors
    }

    fn group(&self, name: &[u8]) -> Option<&NameGroup> {
        let n = name.len();
        if n < 128 && self.len_mask[n >> 6] & (1 << (n & 63)) == 0 {
            return None;
        }
        self.groups.iter().find(|g| g.name.as_bytes() == name)
    }

    /// Scans `page` once, leniently, calling `on_match(selector_index,
    /// sample)` for every selected sample (a sample matching several
    /// selectors is reported once per selector, in index order). Malformed
    /// lines with a wanted name are counted and skipped; lines no selector
    /// wants are not checked.
    ///
    /// ```
    /// use epp_promtext::SelectorSet;
    ///
    /// let page = "# TYPE vllm:num_requests_waiting gauge\n\
    ///             vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
    ///             vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 4.0\n\
    ///             vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"27912\"} 1.0\n";
    /// let set = SelectorSet::from_specs(&[
    ///     "vllm:num_requests_waiting",
    ///     "vllm:num_requests_waiting{engine=\"1\"}",
    ///     "vllm:cache_config_info",
    /// ])?;
    /// let (mut waiting, mut engine1, mut block_size) = (0.0, 0.0, None);
    /// let report = set.scan(page, |i, s| match i {
    ///     0 => waiting += s.value,
    ///     1 => engine1 = s.value,
    ///     _ => block_size = s.label("block_size").and_then(|v| v.parse::<u32>().ok()),
    /// });
    /// assert_eq!((waiting, engine1, block_size), (7.0, 4.0, Some(16)));
    /// assert_eq!((report.parsed, report.skipped, report.errors), (3, 1, 0));
    /// # Ok::<(), epp_promtext::SelectorError>(())
    /// ```
    pub fn scan<'a>(&self, page: &'a str, on_match: impl FnMut(usize, &Sample<'a>)) -> ScanReport {
        self.scan_with(page, Mode::Lenient, on_match, |_| {})
    }

    /// Like [`SelectorSet::scan`] but stops at the first malformed line with
    /// a wanted name.
    ///
    /// ```
    /// let set = epp_promtext::SelectorSet::from_specs(&["a"])?;
    /// let mut seen = Vec::new();
    /// let e = set.scan_strict("a 1\nb oops\na{x 2\na 3\n", |_, s| seen.push(s.value)).unwrap_err();
    /// assert_eq!((seen, e.line, e.col), (vec![1.0], 3, 5));
    /// # Ok::<(), epp_promtext::SelectorError>(())
    /// ```
    ///
    /// # Errors
    /// The first [`ParseError`] among the lines examined.
    pub fn scan_strict<'a>(
        &self,
        page: &'a str,
        on_match: impl FnMut(usize, &Sample<'a>),
    ) -> Result<ScanReport, ParseError> {
        let report = self.scan_with(page, Mode::Strict, on_match, |_| {});
        report.first_error.map_or(Ok(report), Err)
    }

    /// The general scan: `mode` decides whether a malformed examined line
    /// stops the scan; `on_error` hears about each one.
    pub fn scan_with<'a>(
        &self,
        page: &'a str,
        mode: Mode,
        mut on_match: impl FnMut(usize, &Sample<'a>),
        mut on_error: impl FnMut(&ParseError),
    ) -> ScanReport {
        let mut report = ScanReport::default();
        let b = page.as_bytes();
        let (mut pos, mut line_no) = (0, 0u32);
        while pos < b.len() {
            let start = pos;
            let end = memchr::memchr(b'\n', &b[start..]).map_or(b.len(), |j| start + j);
            pos = end + 1;
            line_no = line_no.saturating_add(1);
            let mut s = start;
            while s < end && matches!(b[s], b' ' | b'\t') {
                s += 1;
            }
            let n = name_len(&b[s..end]);
            let Some(group) = self.group(&b[s..s + n]).filter(|_| n > 0) else {
                report.skipped += usize::from(s < end);
                continue;
            };
            report.parsed += 1;
            match parse_sample(&page[s..end], line_no) {
                Ok(sample) => {
                    for &i in &group.members {
                        if self.selectors[i].labels_match(&sample) {
                            on_match(i, &sample);
                        }
                    }
                }
                Err(e) => {
                    let e = e.indented(s - start);
                    report.errors += 1;
                    report.first_error.get_or_insert(e);
                    on_error(&e);
                    if mode == Mode::Strict {
                        break;
                    }
                }
            }
        }
        report
    }
}

impl FromIterator<Selector> for SelectorSet {
    fn from_iter<T: IntoIterator<Item = Selector>>(iter: T) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let s = Selector::parse(" m{ a = \"x,}\\\"y\" , b=bare ,} ").unwrap();
        assert_eq!(s.name, "m");
        assert_eq!(
            s.matchers,
            vec![("a".into(), "x,}\"y".into()), ("b".into(), "bare".into())]
        );
        assert_eq!(Selector::parse("a:b{}").unwrap(), Selector::name("a:b"));
        let err = |spec: &str| Selector::parse(spec).map(|_| ()).unwrap_err();
        assert_eq!(err("").expected, "a metric name");
        assert_eq!(err("9m").at, 0);
        assert_eq!(
            (err("m{x}").at, err("m{x}").expected),
            (3, "'=' (only equality matchers are supported)")
        );
        assert_eq!(err("m{x=\"1}").expected, "'\"' closing the value");
        assert_eq!(err("m{x=}").expected, "a label value");
        assert_eq!(err("m{x=1 y=2}").expected, "',' or '}'");
        assert_eq!(err("m[x]").at, 1);
        assert_eq!(err("m{x=1} z").at, 7);
        assert_eq!(err("m{x=1").at, 5);
        let dup = err("vllm:x{a=\"1\", b=2, a=\"1\"}");
        assert_eq!(
            (dup.at, dup.expected),
            (19, "a label not already matched in this selector")
        );
        assert_eq!(
            dup.to_string(),
            "invalid metric selector \"vllm:x{a=\\\"1\\\", b=2, a=\\\"1\\\"}\": expected a label \
             not already matched in this selector at offset 19"
        );
        let round = Selector::parse(r#"m{x="q\"v\\w\nz",y="1"}"#).unwrap();
        assert_eq!(round.matchers[0].1, "q\"v\\w\nz");
        assert_eq!(Selector::parse(&round.to_string()).unwrap(), round);
    }

    #[test]
    fn scan_selects_by_name_and_labels() {
        let page = "a{k=\"1\"} 1\na{k=\"2\"} 2\n  b 3\nb{ 4\nc 5\n# a 6\n\nab 7\na{k=\"\\\"\"} 8";
        let set = SelectorSet::new(vec![
            Selector::parse("a{k=\"2\"}").unwrap(),
            Selector::name("a"),
            Selector::name("b"),
            Selector::name("a").with_label("k", "\""),
        ]);
        let mut seen = Vec::new();
        let r = set.scan(page, |i, s| seen.push((i, s.value)));
        assert_eq!(
            seen,
            vec![(1, 1.0), (0, 2.0), (1, 2.0), (2, 3.0), (1, 8.0), (3, 8.0)]
        );
        assert_eq!((r.parsed, r.skipped, r.errors), (5, 3, 1));
        assert_eq!(r.first_error.unwrap().line, 4);
        let mut errors = 0;
        let r = set.scan_with(page, Mode::Strict, |_, _| {}, |_| errors += 1);
        assert_eq!((r.parsed, errors), (4, 1));
    }

    #[test]
    fn sets_are_shareable_across_threads() {
        fn check<T: Send + Sync + 'static>() {}
        check::<SelectorSet>();
        check::<crate::ParseError>();
    }

    #[test]
    fn long_names_bypass_the_length_bitmap() {
        let name = "x".repeat(200);
        let page = format!("{name} 1\n{name}y 2\n");
        let set = SelectorSet::new(vec![Selector::name(&name)]);
        let mut n = 0;
        set.scan(&page, |_, _| n += 1);
        assert_eq!(n, 1);
    }
}
