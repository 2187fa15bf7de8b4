//! A small, strict checker for Prometheus text format 0.0.4, so the
//! simulator's pages are validated independently of the project's parser.
//! Checks: every line is a comment, blank, or `name{labels} value [ts]` with
//! valid names, quoted and escaped label values and a float value; each
//! family is TYPEd at most once, before its samples, and its samples are
//! contiguous; histogram buckets are cumulative and end with `+Inf` = `_count`.

use std::collections::{HashMap, HashSet};

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

impl Sample {
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn valid_name(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':');
    chars.next().is_some_and(ok_first) && chars.all(|c| ok_first(c) || c.is_ascii_digit())
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// `a="x",b="y\"z"` (inside the braces) → pairs; trailing comma allowed.
fn parse_labels(mut s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (name, rest) = s.split_once("=\"").ok_or("label without =\"")?;
        if !valid_name(name, false) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("bad escape".into()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if out.iter().any(|(k, _)| k == name) {
            return Err(format!("duplicate label {name}"));
        }
        out.push((name.to_owned(), value));
        s = &rest[end + 1..];
        s = match s.strip_prefix(',') {
            Some(r) => r,
            None if s.is_empty() => s,
            None => return Err(format!("expected , after label value, got {s:?}")),
        };
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let (series, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}').ok_or("no closing brace")?;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_at(line.find(' ').ok_or("no value")?),
    };
    let (name, labels) = match series.split_once('{') {
        Some((n, l)) => (n, parse_labels(&l[..l.len() - 1])?),
        None => (series, Vec::new()),
    };
    if !valid_name(name, true) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut parts = rest.trim_start_matches(' ').split(' ');
    let value = parts
        .next()
        .and_then(parse_value)
        .ok_or_else(|| format!("bad value in {rest:?}"))?;
    if let Some(ts) = parts.next()
        && ts.parse::<i64>().is_err()
    {
        return Err(format!("bad timestamp {ts:?}"));
    }
    if parts.next().is_some() {
        return Err("trailing text".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The family a sample belongs to, given the TYPEs seen.
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_count", "_sum"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
        {
            return base;
        }
    }
    name
}

/// Parses and checks a whole page.
pub(crate) fn parse(page: &str) -> Result<Vec<Sample>, String> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut samples = Vec::new();
    for (no, line) in page.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", no + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match words.next() {
                Some("TYPE") => {
                    let name = words.next().ok_or_else(|| at("TYPE without name".into()))?;
                    let kind = words.next().unwrap_or("");
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(at(format!("unknown type {kind:?}")));
                    }
                    if types.insert(name.to_owned(), kind.to_owned()).is_some() {
                        return Err(at("family TYPEd twice".into()));
                    }
                }
                Some("HELP") => {
                    let name = words.next().ok_or_else(|| at("HELP without name".into()))?;
                    if !valid_name(name, true) {
                        return Err(at("bad HELP name".into()));
                    }
                }
                _ => {}
            }
            continue;
        }
        let s = parse_sample(line).map_err(at)?;
        let family = family_of(&s.name, &types).to_owned();
        if current.as_ref() != Some(&family) {
            if finished.contains(&family) {
                return Err(at(format!("samples of {family} are not contiguous")));
            }
            if let Some(prev) = current.replace(family.clone()) {
                finished.insert(prev);
            }
        }
        samples.push(s);
    }
    check_histograms(&samples, &types)?;
    Ok(samples)
}

fn check_histograms(samples: &[Sample], types: &HashMap<String, String>) -> Result<(), String> {
    for (name, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        // Series key: labels without `le`.
        let mut last: HashMap<Vec<(String, String)>, (f64, f64)> = HashMap::new();
        let bucket = format!("{name}_bucket");
        for s in samples.iter().filter(|s| s.name == bucket) {
            let le = s
                .label("le")
                .and_then(parse_value)
                .ok_or_else(|| format!("{name}: bucket without le"))?;
            let key: Vec<_> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "le")
                .cloned()
                .collect();
            let (prev_le, prev_count) = last.get(&key).copied().unwrap_or((f64::NEG_INFINITY, 0.0));
            if le <= prev_le || s.value < prev_count {
                return Err(format!("{name}: buckets not ascending and cumulative"));
            }
            last.insert(key, (le, s.value));
        }
        for (key, (le, count)) in last {
            if le != f64::INFINITY {
                return Err(format!("{name}: no +Inf bucket"));
            }
            let total = samples
                .iter()
                .find(|s| s.name == format!("{name}_count") && s.labels == key)
                .ok_or_else(|| format!("{name}: no _count"))?;
            if total.value != count {
                return Err(format!(
                    "{name}: +Inf bucket {count} != _count {}",
                    total.value
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn the_checker_rejects_what_it_should() {
    assert!(parse("a{b=\"1\"} 1\n").is_ok());
    assert!(parse("a{b=\"1\",} 1 1700000000000\n").is_ok());
    assert!(parse("a{b=\"x\\\"y\"} 1\n").unwrap()[0].label("b") == Some("x\"y"));
    assert!(parse("a{b=1} 1\n").is_err(), "unquoted");
    assert!(parse("a b\n").is_err(), "value");
    assert!(parse("1a 1\n").is_err(), "name");
    assert!(parse("a 1\nb 1\na 2\n").is_err(), "not contiguous");
    assert!(parse("# TYPE a gauge\n# TYPE a gauge\n").is_err(), "twice");
    let h = "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n";
    assert!(parse(h).is_err(), "not cumulative");
}
