//! Kubernetes label selectors in their string form (`--endpoint-selector`):
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists) and
//! `!k` (does not exist), joined by commas — the syntax `kubectl -l` and the
//! API server's `labelSelector` parameter accept.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

use crate::{Error, Result};

/// A parsed label selector: what it matches, and its canonical string for
/// the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    selector: Selector,
    text: String,
}

impl LabelSelector {
    /// Parses the string form. An empty string selects everything.
    ///
    /// # Errors
    /// A malformed requirement, key or value, naming it and why.
    pub fn parse(text: &str) -> Result<Self> {
        let mut exprs = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(bad(text, "empty requirement (stray comma)"));
            }
            exprs.push(parse_requirement(part).map_err(|why| bad(text, &why))?);
        }
        Ok(Self::from_expressions(exprs))
    }

    /// The selector of a pool's `matchLabels` (every pair must be equal).
    ///
    /// # Errors
    /// An invalid key or value.
    pub fn from_match_labels(labels: &BTreeMap<String, String>) -> Result<Self> {
        let mut exprs = Vec::with_capacity(labels.len());
        for (k, v) in labels {
            let shown = format!("{k}={v}");
            check_key(k).map_err(|why| bad(&shown, &why))?;
            check_value(v).map_err(|why| bad(&shown, &why))?;
            exprs.push(Expression::Equal(k.clone(), v.clone()));
        }
        Ok(Self::from_expressions(exprs))
    }

    fn from_expressions(exprs: Vec<Expression>) -> Self {
        let selector: Selector = exprs.into_iter().collect();
        let text = selector.to_string();
        Self { selector, text }
    }

    /// Whether `labels` satisfy every requirement.
    #[must_use]
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// The canonical string form (the API server's `labelSelector`).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this selects every object.
    #[must_use]
    pub fn selects_all(&self) -> bool {
        self.selector.selects_all()
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn bad(selector: &str, why: &str) -> Error {
    Error::Kubernetes(format!("invalid label selector {selector:?}: {why}"))
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth > 0 => return Err(bad(text, "nested parenthesis")),
            '(' => depth += 1,
            ')' if depth == 0 => return Err(bad(text, "unbalanced ')'")),
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad(text, "unclosed '('"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Expression, String> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Expression::DoesNotExist(key.to_owned()));
    }
    for (op, ne) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = part.split_once(op) {
            let (key, value) = (key.trim(), value.trim());
            check_key(key)?;
            check_value(value)?;
            return Ok(if ne {
                Expression::NotEqual(key.to_owned(), value.to_owned())
            } else {
                Expression::Equal(key.to_owned(), value.to_owned())
            });
        }
    }
    if part.contains(['<', '>']) {
        return Err(format!(
            "{part:?}: the numeric operators < and > are not supported"
        ));
    }
    if let Some(open) = part.find('(') {
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let [key, op] = head[..] else {
            return Err(format!(
                "{part:?}: expected `key in (...)` or `key notin (...)`"
            ));
        };
        let rest = part[open + 1..].trim_end();
        let Some(list) = rest.strip_suffix(')') else {
            return Err(format!("{part:?}: text after ')'"));
        };
        check_key(key)?;
        let mut values = BTreeSet::new();
        for v in list.split(',') {
            let v = v.trim();
            check_value(v)?;
            values.insert(v.to_owned());
        }
        return match op {
            "in" => Ok(Expression::In(key.to_owned(), values)),
            "notin" => Ok(Expression::NotIn(key.to_owned(), values)),
            other => Err(format!(
                "{part:?}: unknown operator {other:?} (expected in or notin)"
            )),
        };
    }
    let key = part.trim();
    if key.contains(char::is_whitespace) {
        return Err(format!("{part:?}: expected an operator"));
    }
    check_key(key)?;
    Ok(Expression::Exists(key.to_owned()))
}

/// A label name or value segment: at most 63 characters, alphanumerics at
/// both ends, `-`, `_`, `.` between.
fn check_segment(s: &str) -> bool {
    s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
}

fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let dns_ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !dns_ok {
            return Err(format!(
                "key {key:?}: prefix {prefix:?} is not a DNS subdomain"
            ));
        }
    }
    if !check_segment(name) {
        return Err(format!(
            "key {key:?}: the name must be 1-63 characters, alphanumeric at both ends, with -_. between"
        ));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || check_segment(value) {
        Ok(())
    } else {
        Err(format!(
            "value {value:?}: at most 63 characters, alphanumeric at both ends, with -_. between"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_operator_parses_and_matches() {
        let s = LabelSelector::parse(
            "app=vllm, tier==gpu,zone!=a,llm-d.ai/role in (decode, both),env notin (dev),canary,!debug",
        )
        .unwrap();
        assert_eq!(
            s.as_str(),
            "app=vllm,tier=gpu,zone!=a,llm-d.ai/role in (both,decode),env notin (dev),canary,!debug"
        );
        let good = labels(&[
            ("app", "vllm"),
            ("tier", "gpu"),
            ("zone", "b"),
            ("llm-d.ai/role", "decode"),
            ("canary", ""),
        ]);
        assert!(s.matches(&good));
        for (key, value) in [
            ("app", "sglang"),
            ("zone", "a"),
            ("llm-d.ai/role", "prefill"),
            ("env", "dev"),
            ("debug", "1"),
        ] {
            let mut l = good.clone();
            l.insert(key.into(), value.into());
            assert!(!s.matches(&l), "{key}={value} must not match");
        }
        let mut l = good.clone();
        l.remove("canary");
        assert!(!s.matches(&l), "existence is required");
    }

    #[test]
    fn empty_selects_all_and_match_labels() {
        let all = LabelSelector::parse("  ").unwrap();
        assert!(all.selects_all());
        assert!(all.matches(&labels(&[("x", "y")])));
        let pool = LabelSelector::from_match_labels(&labels(&[("app", "m"), ("b", "c")])).unwrap();
        assert_eq!(pool.as_str(), "app=m,b=c");
        assert!(LabelSelector::from_match_labels(&labels(&[("bad key", "v")])).is_err());
    }

    #[test]
    fn bad_selectors_say_why() {
        for (text, needle) in [
            ("app=", ""),
            ("a,,b", "stray comma"),
            ("app in (a,b", "unclosed"),
            ("app) ", "unbalanced"),
            ("app in ((a))", "nested"),
            ("app within (a)", "unknown operator"),
            ("app x", "expected an operator"),
            ("-app", "alphanumeric"),
            ("Bad_Prefix/app", "DNS subdomain"),
            ("app=-v", "value"),
            ("gen>3", "not supported"),
            ("app in (a) x", "text after"),
        ] {
            let r = LabelSelector::parse(text);
            if needle.is_empty() {
                assert!(r.is_ok(), "{text}: empty values are valid");
                continue;
            }
            let e = r.unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(e.contains("invalid label selector"), "{e}");
        }
    }
}
