//! Differential tests: [`ByteBpe`] against the `tokenizers` crate's
//! `encode_fast`, on the project's test tokenizers and variants of them, over
//! generated and real-looking texts.

use std::sync::LazyLock;

use proptest::{prelude::*, test_runner::RngSeed};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use super::*;

fn read(name: &str, write: fn(&std::path::Path) -> std::io::Result<std::path::PathBuf>) -> Value {
    let dir = epp_test_support::process::scratch_dir(name);
    let file = write(&dir).expect("written");
    serde_json::from_str(&std::fs::read_to_string(file).expect("read")).expect("json")
}

fn gpt2() -> Value {
    read(
        "bpe-gpt2",
        epp_test_support::tokenizer::write_test_tokenizer,
    )
}

fn llama3() -> Value {
    read(
        "bpe-llama3",
        epp_test_support::tokenizer::write_llama3_test_tokenizer,
    )
}

/// Added tokens with every flag, for the variants that test them.
fn with_flagged_tokens(mut json: Value) -> Value {
    let next = json["model"]["vocab"].as_object().expect("vocab").len()
        + json["added_tokens"].as_array().expect("added").len();
    let tok = |i: usize, content: &str, flags: [bool; 5]| {
        let [single_word, lstrip, rstrip, normalized, special] = flags;
        json!({"id": next + i, "content": content, "single_word": single_word,
               "lstrip": lstrip, "rstrip": rstrip, "normalized": normalized, "special": special})
    };
    let added = json["added_tokens"].as_array_mut().expect("added");
    added.extend([
        tok(0, "<mask>", [false, true, true, false, true]),
        tok(1, "foo", [true, false, false, true, false]),
        tok(2, "bar", [false, false, false, true, false]),
        tok(3, "<sep>", [true, true, false, false, false]),
        // Overlapping tokens in one pass: the longest at the leftmost start.
        tok(4, "<mask>x", [false, false, true, false, false]),
        tok(5, "ba", [false, false, false, true, false]),
    ]);
    json
}

/// The encoders compared: a name, the crate, epp's.
static SHAPES: LazyLock<Vec<(&'static str, Tokenizer, ByteBpe)>> = LazyLock::new(|| {
    let mut shapes = vec![("gpt2", gpt2()), ("llama3", llama3())];
    let mut v = gpt2();
    v["pre_tokenizer"]["add_prefix_space"] = json!(true);
    shapes.push(("gpt2 add_prefix_space", v));
    let mut v = gpt2();
    v["pre_tokenizer"]["use_regex"] = json!(false);
    v["post_processor"] = json!({"type": "ByteLevel", "add_prefix_space": false,
                                 "trim_offsets": true, "use_regex": true});
    shapes.push(("gpt2 no regex, ByteLevel post-processor", v));
    // GPT-2's own file: empty prefix and suffix, `<|endoftext|>` normalized.
    let mut v = with_flagged_tokens(gpt2());
    v["model"]["continuing_subword_prefix"] = json!("");
    v["model"]["end_of_word_suffix"] = json!("");
    v["added_tokens"][0]["normalized"] = json!(true);
    shapes.push(("gpt2 flagged added tokens, empty affixes", v));
    let mut v = with_flagged_tokens(llama3());
    v["model"]["ignore_merges"] = json!(false);
    v["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = json!(true);
    shapes.push(("llama3 merges only, add_prefix_space, flagged tokens", v));
    let mut v = gpt2();
    let pre = v["pre_tokenizer"].clone();
    v["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split::GPT2}, "behavior": "Isolated",
         "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
    ]});
    assert_ne!(v["pre_tokenizer"], pre);
    v["post_processor"] = Value::Null;
    shapes.push(("gpt2 pattern in Split, no post-processor", v));
    shapes
        .into_iter()
        .map(|(name, json)| {
            let crate_ = json.to_string().parse::<Tokenizer>().expect(name);
            let fast = ByteBpe::from_json(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, crate_, fast)
        })
        .collect()
});

/// Asserts both encoders give the same ids, with and without special tokens.
fn same_ids(text: &str) -> Result<(), TestCaseError> {
    for (name, crate_, fast) in SHAPES.iter() {
        for special in [true, false] {
            let want = crate_.encode_fast(text, special).expect("encodes");
            let mut got = vec![7];
            fast.encode(text, special, &mut got);
            prop_assert_eq!(
                &got[1..],
                want.get_ids(),
                "{} (special tokens {}) on {:?}",
                name,
                special,
                text
            );
        }
    }
    Ok(())
}

/// Fragments that exercise each branch of the patterns and of the added
/// tokens' matching.
const FRAGMENTS: &[&str] = &[
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n ",
    "\u{a0}",
    "\u{3000}",
    "\u{85}",
    "\u{2028}",
    "\u{b}",
    "'s",
    "'S",
    "'t",
    "'re",
    "'RE",
    "'Ve",
    "'m",
    "'ll",
    "'lL",
    "'d",
    "'D",
    "'ſ",
    "'x",
    "''",
    "'",
    "123456",
    "7",
    "٣٤٥",
    "²",
    "Ⅻ",
    "①",
    "😀",
    "👍🏽",
    "e\u{301}",
    "\u{301}",
    "日本語",
    "한국어",
    "Ünïcödé",
    "İ",
    "ǅ",
    "!!",
    "...",
    "(",
    ")",
    "\"",
    "-->",
    "Ġ",
    "<|bos|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<mask>",
    "<mask>x",
    "foo",
    "bar",
    "foobar",
    "<sep>",
    "<|bos",
    "the",
    " the",
    "The",
    " relativity",
    " assistant",
    " Paris.",
    "station",
    " server",
    "cache",
    "ing",
];

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(FRAGMENTS).prop_map(str::to_owned),
        2 => "[a-zA-Z]{1,8}",
        1 => any::<String>().prop_map(|s| s.chars().take(6).collect()),
        1 => "[ \t\n\r0-9'!.,;:<>|a-z]{1,6}",
        1 => (prop::sample::select(&["-", "a", " ", "1", "é", "\n", "ab"][..]), 1..120usize)
            .prop_map(|(s, n)| s.repeat(n)),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x00b9_e16e),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_fast_path_gives_the_crates_ids(text in text()) {
        same_ids(&text)?;
    }

    #[test]
    fn the_fast_path_gives_the_crates_ids_on_any_unicode(text in any::<String>()) {
        same_ids(&text)?;
    }
}

#[test]
fn the_fast_path_gives_the_crates_ids_on_chats() {
    let chats = [
        "",
        " ",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful \
         assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat's the capital of \
         France? I'd like to know; it's for my kid's homework!!<|eot_id|><|start_header_id|>\
         assistant<|end_header_id|>\n\n",
        "```rust\nfn main() {\n    let x: Vec<u32> = (0..10).collect();\n    println!(\"{x:?}\");\n}\n```\n",
        "{\"model\": \"llama\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\\n\"}], \
         \"max_tokens\": 1024, \"temperature\": 0.7}",
        "# Résumé\n\n- 東京 (Tokyo): 13,960,000 people\n- Zürich — 421 878\n\t* naïve café 😀👍🏽\r\n",
        "THE USER'S QUESTION: WHAT'LL HAPPEN IF WE'RE LATE? WE'VE 2 MINUTES.    \n\n\n   ",
        "<|bos|>The theory of relativity<|bos|> <|bos|>\n<|bos|>",
    ];
    for chat in chats {
        same_ids(chat).expect("same ids");
    }
    let long = chats[2].repeat(200);
    same_ids(&long).expect("same ids");
}

#[test]
fn both_merge_loops_agree_on_long_and_short_words() {
    let (_, _, fast) = &SHAPES[0];
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        rng_seed: RngSeed::Fixed(7),
        ..ProptestConfig::default()
    });
    let words = prop::collection::vec(
        prop::sample::select(b" theasionrcd\xc3\xa9".to_vec()),
        0..200,
    );
    runner
        .run(&words, |word| {
            let syms: Vec<u32> = word
                .iter()
                .map(|&b| fast.byte_ids[usize::from(b)])
                .collect();
            let mut linear = syms.clone();
            fast.merge_linear(&mut linear, &mut Vec::new());
            let mut work = Work {
                syms,
                ..Work::default()
            };
            let mut heap = Vec::new();
            fast.merge_heap(&mut work, &mut heap);
            prop_assert_eq!(linear, heap);
            Ok(())
        })
        .expect("agree");
}

#[test]
fn the_word_cache_is_bounded() {
    let mut cache = WordCache::default();
    for i in 0..3 * CACHE_WORDS {
        cache.put(i.to_string().as_bytes(), &[1, 2, 3]);
        assert!(cache.index.len() <= CACHE_WORDS);
        assert_eq!(cache.get(i.to_string().as_bytes()), Some(&[1, 2, 3][..]));
    }
    cache.put(&[b'a'; CACHE_WORD_MAX + 1], &[1]);
    assert_eq!(cache.get(&[b'a'; CACHE_WORD_MAX + 1]), None);
    let mut scratch = Scratch::default();
    for key in 0..10 {
        scratch.slot(key);
    }
    assert_eq!(scratch.slots.len(), CACHE_SLOTS);
    assert_eq!(scratch.slot(9), CACHE_SLOTS - 1);
}

#[test]
fn files_it_does_not_implement_are_refused_with_the_part() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 10] = [
        ("normalizer", |v| v["normalizer"] = json!({"type": "NFC"})),
        ("truncation", |v| v["truncation"] = json!({"max_length": 8})),
        ("pre_tokenizer", |v| {
            v["pre_tokenizer"] = json!({"type": "Whitespace"})
        }),
        ("pre_tokenizer", |v| {
            v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\p{N}{1}")
        }),
        ("model.dropout", |v| v["model"]["dropout"] = json!(0.1)),
        ("model.byte_fallback", |v| {
            v["model"]["byte_fallback"] = json!(true)
        }),
        ("model.continuing_subword_prefix", |v| {
            v["model"]["continuing_subword_prefix"] = json!("##")
        }),
        ("post_processor", |v| {
            v["post_processor"] = json!({"type": "RobertaProcessing"})
        }),
        ("added_tokens", |v| v["added_tokens"][0]["id"] = json!(3)),
        ("added_tokens", |v| {
            v["added_tokens"][0]["content"] = json!(" <s>")
        }),
    ];
    for (part, edit) in cases {
        let mut v = llama3();
        edit(&mut v);
        let e = ByteBpe::from_json(&v).expect_err(part).to_string();
        assert!(e.contains(part), "{part}: {e}");
    }
    assert!(ByteBpe::from_json(&json!("not a tokenizer")).is_err());
}

#[test]
fn a_warm_encoder_allocates_nothing() {
    let text = "<|begin_of_text|>The user's question: what'll the weather be in Paris on \
                the 14th?\n\n  Answer in three sentences. 日本語 😀";
    let counted = allocation_counter::measure(|| {
        std::hint::black_box(Vec::<u8>::with_capacity(8));
    });
    assert!(counted.count_total > 0, "the counter counts");
    for (name, _, fast) in SHAPES.iter() {
        let mut out = Vec::new();
        // The first call fills the word cache and grows the buffers.
        fast.encode(text, true, &mut out);
        let want = out.clone();
        out.clear();
        let allocations =
            allocation_counter::measure(|| fast.encode(text, true, &mut out)).count_total;
        assert_eq!(out, want, "{name}");
        assert_eq!(allocations, 0, "{name}");
    }
}
