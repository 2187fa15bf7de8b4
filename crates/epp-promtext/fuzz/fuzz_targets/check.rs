//! The fuzz target's checks, shared with the bounded run in `cargo test`
//! (`tests/roundtrip.rs` includes this file): on any bytes, every entry point
//! returns without panicking, errors point inside the page, everything a
//! sample borrows is part of the page, a sample line re-parses alone to the
//! same sample, and the selective scan agrees with the full parse.

use epp_promtext::{
    Line, Selector, SelectorSet, families, families_lenient, lines, parse_sample, samples,
};

fn within(page: &str, part: &str) -> bool {
    let (p, q) = (page.as_ptr() as usize, part.as_ptr() as usize);
    q >= p && q + part.len() <= p + page.len()
}

/// Runs every check on `data` (read as lossy UTF-8); panics on a violation.
pub(crate) fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let page: &str = &text;
    let page_lines: Vec<&str> = page.split('\n').collect();
    let n_lines = u32::try_from(page_lines.len()).unwrap_or(u32::MAX);
    let mut names = Vec::new();
    for item in lines(page) {
        match item {
            Ok(Line::Sample(s)) => {
                assert!(!s.name.is_empty() && within(page, s.name));
                assert!(within(page, s.labels_raw));
                for (k, v) in s.labels() {
                    assert!(!k.is_empty() && within(page, k));
                    let first = s.label(k).expect("a listed label is found");
                    assert!(s.has_label(k, &first));
                    let _ = v;
                }
                if let Some(ex) = s.exemplar {
                    let _ = ex.labels().count();
                }
                // A sample line re-parses to the same sample on its own.
                let line = page_lines[s.line as usize - 1];
                let again =
                    parse_sample(line.trim_start_matches([' ', '\t']), s.line).expect("re-parse");
                assert_eq!((again.name, again.labels_raw), (s.name, s.labels_raw));
                assert!(again.value.to_bits() == s.value.to_bits());
                names.push((s.name, s.line));
            }
            Ok(_) => {}
            Err(e) => {
                assert!(e.line >= 1 && e.line <= n_lines && e.col >= 1);
                let _ = e.to_string();
            }
        }
    }
    assert!(samples(page).strict().count() <= samples(page).count());
    let _ = families(page);
    let _ = families_lenient(page);
    if let Some(first) = page.lines().next()
        && let Ok(sel) = Selector::parse(first)
    {
        let again = Selector::parse(&sel.to_string()).expect("a rendered selector parses");
        assert_eq!(again, sel);
    }
    // The selective scan sees exactly the full parse's samples with that name.
    if let Some(&(name, _)) = names.first() {
        let set = SelectorSet::new(vec![Selector::name(name)]);
        let mut seen = Vec::new();
        set.scan(page, |_, s| seen.push(s.line));
        let want: Vec<u32> = names
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|&(_, l)| l)
            .collect();
        // The full parse stops at `# EOF`; the scan does not look at comments.
        assert!(seen.starts_with(&want), "{seen:?} vs {want:?}");
    }
}
