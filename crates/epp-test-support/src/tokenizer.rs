//! A small byte-level BPE tokenizer the project builds itself, for tests that
//! need real token ids without fetching a model from a hub.
//!
//! [`write_test_tokenizer`] writes a Hugging Face `tokenizer.json` in the
//! GPT-2 / Llama 3 shape: a `ByteLevel` pre-tokenizer and decoder, a BPE
//! model whose vocabulary is the 256 byte symbols plus [`MERGES`] merges
//! learned from [`CORPUS`] (a fixed English text in this file), and one
//! special token, [`BOS`], that a `TemplateProcessing` post-processor puts in
//! front of every encoding made with `add_special_tokens = true` (so a
//! router that forgets special tokens computes other ids than the server).
//!
//! [`write_llama3_test_tokenizer`] writes the Llama 3 shape of the same
//! vocabulary: a `Split` pre-tokenizer with Llama 3's pattern then a
//! `ByteLevel` one without its regex, `ignore_merges` with a few whole words
//! ([`LLAMA3_WORDS`]) that the merges alone do not build, Llama 3's special
//! tokens ([`LLAMA3_SPECIAL`], the first put before every encoding with
//! special tokens) and a `Sequence[ByteLevel, TemplateProcessing]`
//! post-processor.
//!
//! The training is plain Rust over ordered maps (ties broken by the pair's
//! text), so the file is the same bytes on every call, every machine, every
//! version of the `tokenizers` crate that loads it.
//!
//! ```
//! let dir = std::env::temp_dir().join(format!("tok-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = epp_test_support::tokenizer::write_test_tokenizer(&dir)?;
//! assert_eq!(path, dir.join("tokenizer.json"));
//! let again = std::fs::read(&path)?;
//! epp_test_support::tokenizer::write_test_tokenizer(&dir)?;
//! assert_eq!(std::fs::read(&path)?, again, "deterministic");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<_, std::io::Error>(())
//! ```

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

/// The special token put before every encoding with special tokens.
pub const BOS: &str = "<|bos|>";

/// Merges learned (the vocabulary is 256 bytes + these + [`BOS`]).
pub const MERGES: usize = 300;

/// The training text.
pub const CORPUS: &str = "\
You are a helpful assistant. Answer the question of the user as well as you can, \
and say so when you do not know the answer. The user is asking about the weather, \
the news, the history of the city and the way to the station. The station is near \
the river, and the river runs through the middle of the city. In the morning the \
streets are quiet; in the evening the people come out to walk along the water. \
A router sends each request to the server that holds the longest prefix of its \
prompt in the cache, so that the server does not have to compute it again. The \
cache is made of blocks of tokens, and each block is identified by a hash of its \
tokens and of the blocks before it. When the cache is full, the blocks that were \
used least recently are evicted first. The model server publishes an event when \
it stores a block and another when it removes one, and the router listens to \
these events to know which server holds which blocks. Time to first token is the \
time between the arrival of the request and the first token of the answer; it \
grows with the number of tokens the server must compute before it can answer. \
Please summarize the following document in three sentences. Translate the \
following text into French. Write a short story about a cat and a dog who become \
friends. What is the capital of France? The capital of France is Paris. What is \
the capital of Italy? The capital of Italy is Rome. Explain the theory of \
relativity to a child. Count from one to ten: one, two, three, four, five, six, \
seven, eight, nine, ten. The quick brown fox jumps over the lazy dog. \
The system prompt is the same for every user of the application, and the \
conversation that follows it is different for each one of them.";

/// Llama 3's pre-tokenizer pattern.
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's special tokens in the Llama 3 shape, in id order.
pub const LLAMA3_SPECIAL: [&str; 4] = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// Whole words in the Llama 3 shape's vocabulary with no merges to them.
pub const LLAMA3_WORDS: [&str; 3] = ["Ġrelativity", "Ġassistant", "ĠParis."];

/// Writes the test tokenizer to `dir/tokenizer.json` and returns that path.
///
/// # Errors
/// When the file cannot be written.
pub fn write_test_tokenizer(dir: &Path) -> std::io::Result<PathBuf> {
    write(dir, &tokenizer_json())
}

/// Writes the Llama 3 shape of the test tokenizer to `dir/tokenizer.json`
/// and returns that path.
///
/// # Errors
/// When the file cannot be written.
pub fn write_llama3_test_tokenizer(dir: &Path) -> std::io::Result<PathBuf> {
    write(dir, &llama3_tokenizer_json())
}

fn write(dir: &Path, json: &Value) -> std::io::Result<PathBuf> {
    let path = dir.join("tokenizer.json");
    let text = serde_json::to_string_pretty(json).map_err(std::io::Error::other)?;
    std::fs::write(&path, text)?;
    Ok(path)
}

/// GPT-2's map from bytes to printable characters (byte-level BPE symbols).
fn byte_symbols() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        let code = if printable {
            u32::from(b)
        } else {
            extra += 1;
            255 + extra
        };
        out[usize::from(b)] = char::from_u32(code).unwrap_or('?');
    }
    out
}

/// The merges learned from [`CORPUS`], in rank order.
fn learn_merges(symbols: &[char; 256]) -> Vec<(String, String)> {
    // Words as the byte-level pre-tokenizer roughly cuts them: a word takes
    // the space before it. Merges never cross words.
    let mut words: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for (i, w) in CORPUS.split(' ').filter(|w| !w.is_empty()).enumerate() {
        let word = if i == 0 {
            w.to_owned()
        } else {
            format!(" {w}")
        };
        let syms = word
            .bytes()
            .map(|b| symbols[usize::from(b)].to_string())
            .collect();
        *words.entry(syms).or_default() += 1;
    }
    let mut merges = Vec::with_capacity(MERGES);
    while merges.len() < MERGES {
        let mut pairs: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((&p[0], &p[1])).or_default() += n;
            }
        }
        // The most frequent pair; among equals the first in text order.
        let Some(((a, b), n)) = pairs.into_iter().fold(
            None,
            |best: Option<((&str, &str), u64)>, (p, n)| match best {
                Some((_, m)) if m >= n => best,
                _ => Some((p, n)),
            },
        ) else {
            break;
        };
        if n == 0 {
            break;
        }
        let (a, b) = (a.to_owned(), b.to_owned());
        let joined = format!("{a}{b}");
        words = words.into_iter().fold(BTreeMap::new(), |mut acc, (w, n)| {
            let mut out = Vec::with_capacity(w.len());
            let mut i = 0;
            while i < w.len() {
                if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
                    out.push(joined.clone());
                    i += 2;
                } else {
                    out.push(w[i].clone());
                    i += 1;
                }
            }
            *acc.entry(out).or_default() += n;
            acc
        });
        merges.push((a, b));
    }
    merges
}

/// The byte symbols and the merges' results, with their ids; the merges.
fn vocab_and_merges() -> (serde_json::Map<String, Value>, Vec<(String, String)>) {
    let symbols = byte_symbols();
    let merges = learn_merges(&symbols);
    let mut vocab = serde_json::Map::new();
    for s in symbols {
        let id = vocab.len();
        vocab.insert(s.to_string(), json!(id));
    }
    for (a, b) in &merges {
        let joined = format!("{a}{b}");
        if !vocab.contains_key(&joined) {
            let id = vocab.len();
            vocab.insert(joined, json!(id));
        }
    }
    (vocab, merges)
}

fn llama3_tokenizer_json() -> Value {
    let (mut vocab, merges) = vocab_and_merges();
    for w in LLAMA3_WORDS {
        if !vocab.contains_key(w) {
            let id = vocab.len();
            vocab.insert(w.to_owned(), json!(id));
        }
    }
    let first = vocab.len();
    let added: Vec<Value> = LLAMA3_SPECIAL
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({
                "id": first + i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true
            })
        })
        .collect();
    let bos = LLAMA3_SPECIAL[0];
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN},
                 "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                 "use_regex": false}
            ]
        },
        "post_processor": {
            "type": "Sequence",
            "processors": [
                {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
                 "use_regex": true},
                bos_template(bos, first)
            ]
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": bpe_model(
            Value::Object(vocab),
            json!(merges.iter().map(|(a, b)| vec![a, b]).collect::<Vec<_>>()),
            true
        )
    })
}

/// A plain BPE model (no dropout, no unknown token, no affixes, no byte
/// fallback) over `vocab` and `merges` (in either of the file's spellings).
fn bpe_model(vocab: Value, merges: Value, ignore_merges: bool) -> Value {
    json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": null,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": false,
        "byte_fallback": false,
        "ignore_merges": ignore_merges,
        "vocab": vocab,
        "merges": merges
    })
}

/// A `TemplateProcessing` post-processor that puts `bos` (token `id`)
/// before each sequence.
fn bos_template(bos: &str, id: usize) -> Value {
    json!({
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}}
        ],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}}
        ],
        "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}}
    })
}

fn tokenizer_json() -> Value {
    let (vocab, merges) = vocab_and_merges();
    let bos = vocab.len();
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
    });
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": bos, "content": BOS, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": bos_template(BOS, bos),
        "decoder": byte_level,
        "model": bpe_model(
            Value::Object(vocab),
            json!(merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()),
            false
        )
    })
}

#[cfg(test)]
mod tests {
    use tokenizers::Tokenizer;

    use super::*;

    fn load(name: &str) -> Tokenizer {
        let dir = std::env::temp_dir().join(format!("tok-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = write_test_tokenizer(&dir).unwrap();
        let t = Tokenizer::from_file(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        t
    }

    #[test]
    fn it_loads_and_round_trips_any_text() {
        let t = load("round-trip");
        assert_eq!(t.get_vocab_size(true), 256 + MERGES + 1);
        for text in [
            "The capital of France is Paris.",
            "ünïcödé ✓ 日本語\n\ttabs",
            "",
        ] {
            let e = t.encode(text, false).unwrap();
            assert_eq!(t.decode(e.get_ids(), false).unwrap(), text);
        }
    }

    #[test]
    fn merges_shorten_english_and_special_tokens_add_bos() {
        let t = load("merges");
        let text = "The router sends the request to the server.";
        let plain = t.encode(text, false).unwrap();
        assert!(
            plain.get_ids().len() * 2 < text.len(),
            "{} tokens for {} bytes",
            plain.get_ids().len(),
            text.len()
        );
        let with = t.encode(text, true).unwrap();
        let bos = t.token_to_id(BOS).unwrap();
        assert_eq!(with.get_ids()[0], bos);
        assert_eq!(&with.get_ids()[1..], plain.get_ids());
    }

    #[test]
    fn the_llama3_shape_loads_cuts_digit_triples_and_keeps_whole_words() {
        let dir = std::env::temp_dir().join(format!("tok-llama3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Tokenizer::from_file(write_llama3_test_tokenizer(&dir).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let ids = |s: &str| t.encode(s, false).unwrap().get_ids().to_vec();
        let word = t.token_to_id(LLAMA3_WORDS[0]).unwrap();
        assert_eq!(
            ids("12345 relativity"),
            [ids("123"), ids("45"), vec![word]].concat()
        );
        let bos = t.token_to_id(LLAMA3_SPECIAL[0]).unwrap();
        assert_eq!(t.encode("x", true).unwrap().get_ids(), [bos, ids("x")[0]]);
        let e = t.encode("<|eot_id|>x", false).unwrap();
        assert_eq!(e.get_ids()[0], t.token_to_id("<|eot_id|>").unwrap());
    }

    #[test]
    fn the_file_is_the_same_bytes_every_time() {
        let a = serde_json::to_string_pretty(&tokenizer_json()).unwrap();
        let b = serde_json::to_string_pretty(&tokenizer_json()).unwrap();
        assert_eq!(a, b);
    }
}
