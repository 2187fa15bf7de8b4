//! The fuzz target's checks, shared with the bounded run in `cargo test`
//! (`tests/fuzz.rs` includes this file). On any bytes:
//! - `parse_body` returns without panicking; what it accepts (a passthrough
//!   body is not read; a gRPC one has no splicable model) is a JSON object
//!   whose `model_span` holds exactly the model string (the engines' native
//!   APIs may have none), and splicing
//!   another model there (or rewriting the field) yields a body that parses
//!   to the new model and the same prompt, stream flag, salt and limits; what
//!   it refuses is a 400;
//! - `UsageReader` finds the same usage whatever the body's chunking;
//! - `ModelRestorer` releases the same bytes whatever the chunking, and a
//!   body without a `"model"` key, or a plain body that is not an object,
//!   passes byte for byte.

use epp_core::ApiKind;
use epp_extproc::{ModelRestorer, UsageReader, parse_body, rewrite_model_field, splice_model};

/// A model name that needs escaping, to exercise the splice's encoding.
const NEW_MODEL: &str = "fz/\"m\"\u{e9}\\1";

/// Most bytes the readers buffer in these checks (well above any input).
const LIMIT: usize = 1 << 20;

/// Runs every check on `data`: the first byte picks the API, the second
/// where the body is split into two chunks, the rest is the body. Panics on
/// a violation.
pub(crate) fn check(data: &[u8]) {
    let [api, split, body @ ..] = data else {
        return;
    };
    let api = ApiKind::ALL[usize::from(*api) % ApiKind::ALL.len()];
    let split = if body.is_empty() {
        0
    } else {
        usize::from(*split) * body.len() / 256
    };
    check_request(api, body);
    check_usage(body, split);
    check_restorer(body, split);
}

fn check_request(api: ApiKind, body: &[u8]) {
    let parsed = match parse_body(api, body) {
        Ok(p) => p,
        Err(e) => {
            assert_eq!(e.http_status(), 400, "{e}");
            return;
        }
    };
    if api == ApiKind::Passthrough {
        assert_eq!(parsed, Default::default(), "a passthrough body is not read");
        return;
    }
    if api.is_grpc() {
        // Inside protobuf lengths: never spliced.
        assert!(parsed.model_span.is_empty());
        return;
    }
    let text = std::str::from_utf8(body).expect("an accepted body is UTF-8");
    assert!(text.trim_start().starts_with('{'), "accepted a non-object");
    if matches!(api, ApiKind::VllmGenerate | ApiKind::SglangGenerate) && parsed.model.is_empty() {
        // The engines' native APIs need no model.
        assert!(parsed.model_span.is_empty());
        return;
    }
    assert!(!parsed.model.is_empty());
    let span = parsed.model_span.clone();
    assert!(span.start < span.end && span.end <= body.len(), "{span:?}");
    let at_span: String = serde_json::from_slice(&body[span.clone()]).expect("span is a string");
    assert_eq!(at_span, parsed.model);

    let spliced = splice_model(body, &span, NEW_MODEL);
    let again = parse_body(api, &spliced).expect("a spliced body parses");
    assert_eq!(again.model, NEW_MODEL);
    assert_eq!(again.prompt, parsed.prompt);
    assert_eq!(again.stream, parsed.stream);
    assert_eq!(again.cache_salt, parsed.cache_salt);
    assert_eq!(again.max_tokens, parsed.max_tokens);
    assert_eq!(&spliced[..span.start], &body[..span.start]);
    assert_eq!(
        &spliced[again.model_span.end..],
        &body[span.end..],
        "every byte after the model is kept"
    );

    let rewritten = rewrite_model_field(body, NEW_MODEL).expect("a request has a model field");
    assert_eq!(
        parse_body(api, &rewritten).expect("rewritten").model,
        NEW_MODEL
    );
}

fn check_usage(body: &[u8], split: usize) {
    for sse in [false, true] {
        let mut whole = UsageReader::new(sse, LIMIT);
        whole.feed(body);
        let mut parts = UsageReader::new(sse, LIMIT);
        parts.feed(&body[..split]);
        parts.feed(&body[split..]);
        assert_eq!(whole.finish(), parts.finish(), "sse={sse} split={split}");
    }
}

fn check_restorer(body: &[u8], split: usize) {
    for sse in [false, true] {
        let mut whole = ModelRestorer::new(NEW_MODEL, sse, LIMIT);
        let once = whole.feed(body, true);
        let mut parts = ModelRestorer::new(NEW_MODEL, sse, LIMIT);
        let mut twice = parts.feed(&body[..split], false);
        twice.extend(parts.feed(&body[split..], true));
        assert_eq!(once, twice, "sse={sse} split={split}");
        let object = body.trim_ascii_start().first() == Some(&b'{');
        if memchr::memmem::find(body, b"\"model\"").is_none() || (!sse && !object) {
            assert_eq!(once, body, "nothing to restore, nothing changed");
        }
    }
}
