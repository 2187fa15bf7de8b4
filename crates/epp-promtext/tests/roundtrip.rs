//! Properties (seeded proptest): rendered expositions parse back to what was
//! rendered, in every view; and a bounded fuzz run on every test run —
//! arbitrary bytes, near-valid lines and mutated real pages go through the
//! cargo-fuzz target's own checks (`fuzz/fuzz_targets/check.rs`: never panic,
//! errors point inside the page, borrows stay in the page, the scan agrees
//! with the full parse). The long campaign is that target under cargo-fuzz.

use std::fmt::Write as _;

use epp_promtext::{
    Line, MetricType, Mode, Selector, SelectorSet, families, lines, parse_sample, samples,
};
use proptest::{prelude::*, test_runner::RngSeed};

#[path = "../fuzz/fuzz_targets/check.rs"]
mod fuzz_check;

mod common;

use common::fixture;

#[derive(Debug, Clone)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    timestamp: Option<i64>,
    exemplar: Option<(String, f64)>,
}

fn render_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v:e}")
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders with the freedoms the formats allow: blanks around tokens,
/// trailing commas, `{}`, CRLF, no final newline.
fn render(series: &[Series], style: &Style) -> String {
    let nl = if style.crlf { "\r\n" } else { "\n" };
    let sp = if style.wide { " \t " } else { " " };
    let mut out = String::new();
    for s in series {
        let _ = write!(
            out,
            "# HELP {} help with \\\\ and \\n{nl}# TYPE {} gauge{nl}",
            s.name, s.name
        );
        out.push_str(&s.name);
        if !s.labels.is_empty() || style.empty_braces {
            out.push('{');
            for (i, (k, v)) in s.labels.iter().enumerate() {
                let sep = if i + 1 < s.labels.len() || style.trailing_comma {
                    ","
                } else {
                    ""
                };
                if style.wide {
                    let _ = write!(out, " {k} = \"{}\" {sep}", escape(v));
                } else {
                    let _ = write!(out, "{k}=\"{}\"{sep}", escape(v));
                }
            }
            out.push('}');
        }
        out.push_str(sp);
        out.push_str(&render_value(s.value));
        if let Some(t) = s.timestamp {
            let _ = write!(out, "{sp}{t}");
        }
        if let Some((trace, v)) = &s.exemplar {
            let _ = write!(
                out,
                " # {{trace_id=\"{}\"}} {}",
                escape(trace),
                render_value(*v)
            );
        }
        out.push_str(nl);
    }
    if style.eof {
        out.push_str("# EOF");
        out.push_str(nl);
    }
    if !style.final_newline {
        while out.ends_with(['\n', '\r']) {
            out.pop();
        }
    }
    out
}

#[derive(Debug, Clone)]
struct Style {
    crlf: bool,
    wide: bool,
    trailing_comma: bool,
    empty_braces: bool,
    eof: bool,
    final_newline: bool,
}

fn style() -> impl Strategy<Value = Style> {
    any::<[bool; 6]>().prop_map(|b| Style {
        crlf: b[0],
        wide: b[1],
        trailing_comma: b[2],
        empty_braces: b[3],
        eof: b[4],
        final_newline: b[5],
    })
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        -1e6..1e6f64,
        (0u32..100_000).prop_map(f64::from),
    ]
}

fn series() -> impl Strategy<Value = Series> {
    (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,40}",
        prop::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,12}", "[ -~\n\\\\\"é]{0,40}", 0..6),
        value(),
        prop::option::of(-4_000_000_000_000i64..4_000_000_000_000),
        prop::option::of(("[ -~]{0,8}", value())),
    )
        .prop_map(|(name, labels, value, timestamp, exemplar)| Series {
            name,
            labels: labels.into_iter().collect(),
            value,
            timestamp,
            exemplar,
        })
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x05ee_de99),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn render_then_parse_is_identity(all in prop::collection::vec(series(), 1..16), style in style()) {
        let page = render(&all, &style);
        let parsed: Vec<_> = samples(&page)
            .strict()
            .collect::<Result<_, _>>()
            .map_err(|e| TestCaseError::fail(format!("{e}\n{page}")))?;
        prop_assert_eq!(parsed.len(), all.len());
        for (p, s) in parsed.iter().zip(&all) {
            prop_assert_eq!(p.name, s.name.as_str());
            let labels: Vec<(String, String)> =
                p.labels().map(|(k, v)| (k.to_owned(), v.into_owned())).collect();
            prop_assert_eq!(&labels, &s.labels);
            for (k, v) in &s.labels {
                prop_assert!(p.has_label(k, v));
                let got = p.label(k);
                prop_assert_eq!(got.as_deref(), Some(v.as_str()));
            }
            prop_assert!(same(p.value, s.value));
            prop_assert_eq!(p.timestamp, s.timestamp.map(|t| t as f64));
            let ex = p.exemplar.map(|e| (e.labels().next().map(|(_, v)| v.into_owned()), e.value));
            prop_assert_eq!(ex.is_some(), s.exemplar.is_some());
            if let (Some((trace, v)), Some((Some(got), gv))) = (&s.exemplar, ex) {
                prop_assert_eq!(&got, trace);
                prop_assert!(same(gv, *v));
            }
        }
        // Each series is found by its name and its labels, in one pass.
        let set: SelectorSet = all
            .iter()
            .map(|s| s.labels.iter().fold(Selector::name(&s.name), |sel, (k, v)| sel.with_label(k, v)))
            .collect();
        let mut found = vec![false; all.len()];
        let report = set.scan(&page, |i, _| found[i] = true);
        prop_assert!(found.iter().all(|&f| f), "{:?}", found);
        prop_assert_eq!(report.errors, 0);
        // A selector renders to a spec that parses back to it.
        for sel in set.selectors() {
            prop_assert_eq!(&Selector::parse(&sel.to_string()).map_err(|e| TestCaseError::fail(e.to_string()))?, sel);
        }
    }

    #[test]
    fn histograms_in_any_line_order_assemble(
        bounds in prop::collection::btree_set(0u32..10_000, 1..12),
        engines in 1usize..4,
        order in 0usize..3,
    ) {
        // Python (buckets, count, sum), multiprocess (sum, count, buckets),
        // Triton (count, sum, buckets, integers without ".0").
        let mut page = String::from("# TYPE lat histogram\n");
        for e in 0..engines {
            let labels = format!("engine=\"{e}\"");
            let mut buckets: Vec<String> = bounds
                .iter()
                .enumerate()
                .map(|(i, b)| format!("lat_bucket{{{labels},le=\"{b}\"}} {}\n", i + e))
                .collect();
            buckets.push(format!("lat_bucket{{le=\"+Inf\",{labels}}} {}\n", bounds.len() + e));
            let count = format!("lat_count{{{labels}}} {}\n", bounds.len() + e);
            let sum = format!("lat_sum{{{labels}}} {}.5\n", e);
            match order {
                0 => { buckets.push(count); buckets.push(sum); }
                1 => { buckets.insert(0, count); buckets.insert(0, sum); }
                _ => { buckets.reverse(); buckets.insert(0, sum); buckets.insert(0, count); }
            }
            page.extend(buckets);
        }
        let fams = families(&page).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(fams.len(), 1);
        prop_assert_eq!(fams[0].kind, MetricType::Histogram);
        prop_assert_eq!(fams[0].metrics.len(), engines);
        for (e, m) in fams[0].metrics.iter().enumerate() {
            prop_assert_eq!(m.buckets.len(), bounds.len() + 1);
            prop_assert!(m.buckets.windows(2).all(|w| w[0].0 < w[1].0));
            prop_assert_eq!(m.count, Some((bounds.len() + e) as f64));
            prop_assert_eq!(m.sum, Some(e as f64 + 0.5));
            let engine = e.to_string();
            prop_assert_eq!(m.label("engine"), Some(engine.as_str()));
        }
    }
}

// === bounded fuzzing: never panic, errors point inside the page ===

fn check_everything(page: &str) {
    fuzz_check::check(page.as_bytes());
    let n_lines = u32::try_from(page.split('\n').count()).unwrap_or(u32::MAX);
    for item in lines(page) {
        match item {
            Ok(Line::Sample(s)) => {
                for (k, v) in s.labels() {
                    assert!(!k.is_empty());
                    let _ = v.len();
                }
            }
            Ok(_) => {}
            Err(e) => {
                assert!(e.line >= 1 && e.line <= n_lines && e.col >= 1, "{e:?}");
                assert!(e.snippet().len() <= epp_promtext::SNIPPET_LEN);
                let _ = e.to_string();
            }
        }
    }
    let _ = lines(page).mode(Mode::Strict).count();
    let _ = families(page);
    let set = SelectorSet::new(vec![
        Selector::name("vllm:num_requests_waiting"),
        Selector::name("a").with_label("b", "c\"d"),
    ]);
    let _ = set.scan(page, |_, s| {
        let _ = s.labels().count();
    });
    let _ = Selector::parse(page);
}

#[test]
fn fuzz_checks_hold_on_every_fixture() {
    let dir = format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("fixtures dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "txt") {
            fuzz_check::check(&std::fs::read(&path).expect("fixture"));
            n += 1;
        }
    }
    assert!(n >= 9, "only {n} fixtures found");
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop::sample::select(b"{}\",=\\ \t\r\n#:_ae+-.0123456789".to_vec());
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), 1usize..40).prop_map(|(i, n)| Edit::Delete(i, n)),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        check_everything(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn near_valid_lines_never_panic(
        line in "[a-z:_]{1,8} ?(\\{( ?[a-z_]{1,4} ?= ?\"([^\"\\\\]|\\\\.){0,6}\"?,?){0,3}\\}?)? ?[-+0-9.eEInfNa]{0,8}( [0-9.]{0,5})?( # \\{[a-z]=\"x\"\\} ?[0-9]{0,3})?\r?",
    ) {
        check_everything(&line);
        if let Ok(s) = parse_sample(&line, 1) {
            prop_assert!(!s.name.is_empty());
        }
    }

    #[test]
    fn mutated_real_pages_never_panic(
        which in 0usize..4,
        edits in prop::collection::vec(edit(), 1..8),
    ) {
        let name = ["vllm.txt", "triton-trtllm.txt", "sglang.txt", "openmetrics.txt"][which];
        let mut bytes = fixture(name).into_bytes();
        for e in edits {
            let len = bytes.len().max(1);
            match e {
                Edit::Flip(i, b) => if let Some(x) = bytes.get_mut(i % len) { *x = b },
                Edit::Insert(i, b) => bytes.insert(i % len, b),
                Edit::Delete(i, n) => { let i = i % len; bytes.drain(i..(i + n).min(bytes.len())); }
            }
        }
        check_everything(&String::from_utf8_lossy(&bytes));
    }
}
