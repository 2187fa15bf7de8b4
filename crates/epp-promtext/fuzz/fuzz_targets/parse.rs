//! Any bytes: the sample iterator, label iteration, selector parsing and the
//! selective scan must never panic, and every sample they return must carry
//! a name that is a prefix-free slice of its line.
#![no_main]

use epp_promtext::{Selector, SelectorSet, samples};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for item in samples(&text) {
        match item {
            Ok(s) => {
                assert!(!s.name.is_empty());
                for (k, v) in s.labels() {
                    assert!(!k.is_empty());
                    let _ = v.len();
                }
            }
            Err(e) => {
                assert!(e.line >= 1 && e.col >= 1);
                let _ = e.snippet();
            }
        }
    }
    if let Some(first) = text.lines().next() {
        if let Ok(sel) = Selector::parse(first) {
            let again = Selector::parse(&sel.to_string()).expect("a rendered selector parses");
            assert_eq!(again, sel);
        }
    }
    let set = SelectorSet::new(vec![Selector::name("vllm:num_requests_waiting"), Selector::name("a").with_label("b", "c")]);
    set.scan(&text, |_, s| {
        let _ = s.labels().count();
    });
});
