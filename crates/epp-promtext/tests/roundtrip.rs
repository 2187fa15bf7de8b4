//! Properties: rendered expositions parse back to what was rendered, and no
//! input makes the parser panic (a bounded fuzz run for every test run; the
//! long campaign is the cargo-fuzz target in fuzz/).

use epp_promtext::{Selector, SelectorSet, samples};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    timestamp: Option<i64>,
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

fn render(series: &[Series], crlf: bool, final_newline: bool) -> String {
    let nl = if crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for s in series {
        out.push_str(&format!(
            "# HELP {} some help with \\\\ escapes{nl}# TYPE {} gauge{nl}",
            s.name, s.name
        ));
        out.push_str(&s.name);
        if !s.labels.is_empty() {
            out.push('{');
            for (k, v) in &s.labels {
                out.push_str(&format!("{k}=\"{}\",", escape(v)));
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(&render_value(s.value));
        if let Some(t) = s.timestamp {
            out.push_str(&format!(" {t}"));
        }
        out.push_str(nl);
    }
    if !final_newline {
        while out.ends_with(['\n', '\r']) {
            out.pop();
        }
    }
    out
}

fn series() -> impl Strategy<Value = Series> {
    (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,30}",
        prop::collection::vec(
            ("[a-zA-Z_][a-zA-Z0-9_]{0,12}", "[ -~\n\\\\\"é]{0,16}"),
            0..5,
        ),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            -1e6..1e6f64
        ],
        prop::option::of(0i64..4_000_000_000_000),
    )
        .prop_map(|(name, labels, value, timestamp)| Series {
            name,
            labels,
            value,
            timestamp,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn render_then_parse_is_identity(all in prop::collection::vec(series(), 1..20), crlf: bool, final_newline: bool) {
        let page = render(&all, crlf, final_newline);
        let parsed: Vec<_> = samples(&page).collect::<Result<_, _>>().map_err(|e| TestCaseError::fail(format!("{e}\n{page}")))?;
        prop_assert_eq!(parsed.len(), all.len());
        for (p, s) in parsed.iter().zip(&all) {
            prop_assert_eq!(p.name, s.name.as_str());
            let labels: Vec<(String, String)> = p.labels().map(|(k, v)| (k.to_owned(), v.into_owned())).collect();
            prop_assert_eq!(&labels, &s.labels);
            prop_assert!(p.value == s.value || (p.value.is_nan() && s.value.is_nan()));
            prop_assert_eq!(p.timestamp, s.timestamp.map(|t| t as f64));
        }
        // Selecting each series by its name and first label finds it.
        for s in &all {
            let mut sel = Selector::name(&s.name);
            if let Some((k, v)) = s.labels.first() {
                sel = sel.with_label(k, v);
            }
            let mut found = false;
            SelectorSet::new(vec![sel]).scan(&page, |_, _| found = true);
            prop_assert!(found, "{} not found", s.name);
        }
    }

    #[test]
    fn arbitrary_input_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        for _ in samples(&text) {}
        let set = SelectorSet::new(vec![Selector::name("a"), Selector::name("a").with_label("b", "c")]);
        set.scan(&text, |_, s| { let _ = s.labels().count(); });
    }

    #[test]
    fn near_valid_lines_never_panic(line in "[a-z:_]{1,8}(\\{([a-z_]{1,4}=\"([^\"\\\\]|\\\\.){0,6}\"?,?){0,3}\\}?)? ?[-+0-9.eEInfNa]{0,8}( [0-9]{0,5})?") {
        for s in samples(&line).flatten() {
            let _ = s.labels().count();
        }
        let _ = Selector::parse(&line);
    }
}
