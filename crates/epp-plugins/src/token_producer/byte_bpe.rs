//! [`ByteBpe`]: epp's own encoder for byte-level BPE tokenizers (GPT-2,
//! Llama 3 and their kin), giving the ids the `tokenizers` crate gives,
//! several times faster: pre-tokenizers written out instead of run through a
//! backtracking regex, ids only (no per-token strings), and a per-thread
//! cache of the words already merged.
//!
//! It is built from a `tokenizer.json` only when every part of the file is
//! one it implements exactly; anything else is refused, with the reason, and
//! the caller keeps the crate. See [`ByteBpe::from_json`].

mod split;
#[cfg(test)]
mod tests;

use std::{
    cell::RefCell,
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    sync::atomic::{AtomicU64, Ordering},
};

use foldhash::fast::RandomState;
use serde_json::Value;
use split::{Classes, Pattern};

/// Why a `tokenizer.json` does not take the fast path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedTokenizer(String);

impl std::fmt::Display for UnsupportedTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UnsupportedTokenizer {}

fn refuse<T>(why: impl Into<String>) -> Result<T, UnsupportedTokenizer> {
    Err(UnsupportedTokenizer(why.into()))
}

/// An added token, as the crate's `AddedVocabulary` matches it.
#[derive(Debug)]
struct Added {
    content: String,
    id: u32,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
}

/// Added tokens matched in one pass (leftmost-longest, as the crate's
/// Aho-Corasick automaton).
#[derive(Debug)]
struct AddedSet {
    tokens: Vec<Added>,
    /// Whether some token starts with this byte.
    first: [bool; 256],
}

impl Default for AddedSet {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            first: [false; 256],
        }
    }
}

/// How the text between added tokens is cut into words.
#[derive(Debug, Clone, Copy)]
struct PreTokenizer {
    /// `None`: the whole piece is one word.
    pattern: Option<Pattern>,
    /// `ByteLevel`'s `add_prefix_space`.
    prefix_space: bool,
    /// The space is put before each piece the pattern cuts (`Split` then
    /// `ByteLevel`), rather than before the text the pattern cuts.
    prefix_per_word: bool,
}

/// A byte-level BPE encoder equal, id for id, to the `tokenizers` crate's
/// `encode_fast` on the files [`ByteBpe::from_json`] accepts.
///
/// Thread-safe; each thread keeps a bounded cache of merged words (a few
/// thousand words per encoder, for the last few encoders it used).
///
/// ```
/// # type Error = Box<dyn std::error::Error + Send + Sync>;
/// let dir = std::env::temp_dir().join(format!("bpe-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let file = epp_test_support::tokenizer::write_test_tokenizer(&dir)?;
/// let text = std::fs::read_to_string(&file)?;
/// let bpe = epp_plugins::ByteBpe::from_json(&serde_json::from_str(&text)?)?;
/// let crate_: tokenizers::Tokenizer = text.parse()?;
/// let mut ids = Vec::new();
/// bpe.encode("The capital of France is Paris.", true, &mut ids);
/// let want = crate_.encode_fast("The capital of France is Paris.", true)?;
/// assert_eq!(ids, want.get_ids());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<_, Error>(())
/// ```
#[derive(Debug)]
pub struct ByteBpe {
    /// Identifies this encoder's per-thread word caches.
    key: u64,
    classes: &'static Classes,
    /// The id of each byte's symbol; `u32::MAX` when the vocabulary lacks it
    /// (the crate then drops the byte, having no unknown token).
    byte_ids: [u32; 256],
    /// `(left << 32 | right)` → `(rank, merged id)`.
    merges: HashMap<u64, (u32, u32), RandomState>,
    /// With `ignore_merges`: whole words found in the vocabulary.
    words: Option<HashMap<Box<[u8]>, u32, RandomState>>,
    pre: PreTokenizer,
    raw_added: AddedSet,
    normalized_added: AddedSet,
    /// Ids before and after the text with special tokens.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

/// GPT-2's byte → symbol map (the crate's `bytes_char`).
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
        out[usize::from(b)] = char::from_u32(code).unwrap_or('\0');
    }
    out
}

fn flag(v: &Value, key: &str, default: bool) -> Result<bool, UnsupportedTokenizer> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => refuse(format!("{key}: {other} is not a boolean")),
    }
}

fn is_null(v: &Value, key: &str) -> bool {
    v.get(key).is_none_or(Value::is_null)
}

fn kind(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

fn byte_level(v: &Value) -> Result<(bool, bool), UnsupportedTokenizer> {
    Ok((
        flag(v, "add_prefix_space", true)?,
        flag(v, "use_regex", true)?,
    ))
}

fn pre_tokenizer(v: &Value) -> Result<PreTokenizer, UnsupportedTokenizer> {
    match kind(v) {
        "ByteLevel" => {
            let (prefix_space, use_regex) = byte_level(v)?;
            Ok(PreTokenizer {
                pattern: use_regex.then_some(Pattern::Gpt2),
                prefix_space,
                prefix_per_word: false,
            })
        }
        "Sequence" => {
            let steps = v.get("pretokenizers").and_then(Value::as_array);
            let [split, bl] = steps.map(Vec::as_slice).unwrap_or_default() else {
                return refuse("pre_tokenizer: a Sequence other than [Split, ByteLevel]");
            };
            if kind(split) != "Split" || kind(bl) != "ByteLevel" {
                return refuse("pre_tokenizer: a Sequence other than [Split, ByteLevel]");
            }
            let (prefix_space, use_regex) = byte_level(bl)?;
            if use_regex {
                return refuse("pre_tokenizer: Split then ByteLevel with use_regex");
            }
            if flag(split, "invert", false)?
                || split.get("behavior").and_then(Value::as_str) != Some("Isolated")
            {
                return refuse("pre_tokenizer: Split other than Isolated, not inverted");
            }
            let pattern = match split.pointer("/pattern/Regex").and_then(Value::as_str) {
                Some(split::LLAMA3) => Pattern::Llama3,
                Some(split::GPT2) => Pattern::Gpt2,
                _ => {
                    return refuse(
                        "pre_tokenizer: a Split pattern other than Llama 3's or GPT-2's",
                    );
                }
            };
            Ok(PreTokenizer {
                pattern: Some(pattern),
                prefix_space,
                prefix_per_word: true,
            })
        }
        other => refuse(format!("pre_tokenizer: {other:?}")),
    }
}

/// Ids the template puts around `$A` with special tokens.
fn post_processor(v: &Value) -> Result<(Vec<u32>, Vec<u32>), UnsupportedTokenizer> {
    let steps = match kind(v) {
        _ if v.is_null() => return Ok((Vec::new(), Vec::new())),
        "Sequence" => v
            .get("processors")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default(),
        _ => std::slice::from_ref(v),
    };
    let mut template = None;
    for step in steps {
        match kind(step) {
            "ByteLevel" => {}
            "TemplateProcessing" if template.is_none() => template = Some(step),
            other => return refuse(format!("post_processor: {other:?}")),
        }
    }
    let Some(t) = template else {
        return Ok((Vec::new(), Vec::new()));
    };
    let (mut prefix, mut suffix, mut seen_a) = (Vec::new(), Vec::new(), false);
    let pieces = t.get("single").and_then(Value::as_array);
    for piece in pieces.map(Vec::as_slice).unwrap_or_default() {
        if let Some(seq) = piece.get("Sequence") {
            if seq.get("id").and_then(Value::as_str) != Some("A") || seen_a {
                return refuse("post_processor: a single template other than one $A");
            }
            seen_a = true;
        } else if let Some(name) = piece.pointer("/SpecialToken/id").and_then(Value::as_str) {
            let ids = t
                .get("special_tokens")
                .and_then(|s| s.get(name))
                .and_then(|s| s.get("ids"))
                .and_then(Value::as_array);
            let Some(ids) = ids else {
                return refuse(format!("post_processor: no ids for {name:?}"));
            };
            let out = if seen_a { &mut suffix } else { &mut prefix };
            for id in ids {
                match id.as_u64().and_then(|i| u32::try_from(i).ok()) {
                    Some(id) => out.push(id),
                    None => return refuse("post_processor: an id that is not a u32"),
                }
            }
        } else {
            return refuse("post_processor: an unknown template piece");
        }
    }
    if !seen_a {
        return refuse("post_processor: a single template without $A");
    }
    Ok((prefix, suffix))
}

impl ByteBpe {
    /// Builds the encoder from a parsed `tokenizer.json`, or says why the
    /// file is not one it implements exactly (the caller then keeps the
    /// `tokenizers` crate). Accepted:
    ///
    /// - no normalizer, no truncation, no padding;
    /// - pre-tokenizer `ByteLevel` (GPT-2's pattern when `use_regex`,
    ///   `add_prefix_space` honoured), or `Sequence[Split(Llama 3's or
    ///   GPT-2's pattern, Isolated), ByteLevel(use_regex: false)]`;
    /// - model `BPE` without dropout, `continuing_subword_prefix`,
    ///   `end_of_word_suffix` (empty ones are none) or `byte_fallback`;
    ///   `ignore_merges` honoured;
    ///   an `unk_token` only when every byte has its symbol;
    /// - added tokens (special or not; `single_word`, `lstrip`, `rstrip`,
    ///   `normalized`) whose content neither starts nor ends with whitespace
    ///   and whose id is the one the crate gives them;
    /// - post-processor none, `ByteLevel`, a `TemplateProcessing` whose
    ///   single template is special tokens around one `$A`, or a `Sequence`
    ///   of those.
    ///
    /// # Errors
    /// [`UnsupportedTokenizer`], naming the part of the file that is not accepted.
    pub fn from_json(json: &Value) -> Result<Self, UnsupportedTokenizer> {
        let Some(classes) = split::classes() else {
            return refuse("the Unicode classes are unavailable");
        };
        for key in ["normalizer", "truncation", "padding"] {
            if !is_null(json, key) {
                return refuse(format!("{key} is set"));
            }
        }
        let pre = pre_tokenizer(json.get("pre_tokenizer").unwrap_or(&Value::Null))?;
        let model = json.get("model").unwrap_or(&Value::Null);
        if kind(model) != "BPE" {
            return refuse("model: not BPE");
        }
        for key in ["dropout", "continuing_subword_prefix", "end_of_word_suffix"] {
            // An empty prefix or suffix (GPT-2's file) changes nothing.
            let empty = key != "dropout" && model.get(key).and_then(Value::as_str) == Some("");
            if !is_null(model, key) && !empty {
                return refuse(format!("model.{key} is set"));
            }
        }
        if flag(model, "byte_fallback", false)? {
            return refuse("model.byte_fallback is set");
        }
        let ignore_merges = flag(model, "ignore_merges", false)?;
        let Some(vocab) = model.get("vocab").and_then(Value::as_object) else {
            return refuse("model.vocab is not a map");
        };
        let mut ids: HashMap<&str, u32> = HashMap::with_capacity(vocab.len());
        for (token, id) in vocab {
            let Some(id) = id
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .filter(|&i| i != u32::MAX)
            else {
                return refuse(format!("model.vocab: {token:?} has no u32 id"));
            };
            ids.insert(token, id);
        }
        let symbols = byte_symbols();
        let mut byte_ids = [u32::MAX; 256];
        let mut buf = [0u8; 4];
        for (b, sym) in symbols.iter().enumerate() {
            if let Some(&id) = ids.get(&*sym.encode_utf8(&mut buf)) {
                byte_ids[b] = id;
            }
        }
        if byte_ids.contains(&u32::MAX) && !is_null(model, "unk_token") {
            return refuse("model.unk_token with bytes missing from the vocabulary");
        }
        let merges = Self::merges(model, &ids)?;
        let words = ignore_merges.then(|| {
            let back: HashMap<char, u8> =
                (0..=255u8).map(|b| (symbols[usize::from(b)], b)).collect();
            let mut words = HashMap::with_hasher(RandomState::default());
            for (token, &id) in &ids {
                let bytes: Option<Box<[u8]>> =
                    token.chars().map(|c| back.get(&c).copied()).collect();
                if let Some(bytes) = bytes {
                    words.insert(bytes, id);
                }
            }
            words
        });
        let (raw_added, normalized_added) = Self::added(json, &ids, classes)?;
        let (prefix, suffix) = post_processor(json.get("post_processor").unwrap_or(&Value::Null))?;
        static KEYS: AtomicU64 = AtomicU64::new(0);
        Ok(Self {
            key: KEYS.fetch_add(1, Ordering::Relaxed),
            classes,
            byte_ids,
            merges,
            words,
            pre,
            raw_added,
            normalized_added,
            prefix,
            suffix,
        })
    }

    fn merges(
        model: &Value,
        ids: &HashMap<&str, u32>,
    ) -> Result<HashMap<u64, (u32, u32), RandomState>, UnsupportedTokenizer> {
        let Some(list) = model.get("merges").and_then(Value::as_array) else {
            return refuse("model.merges is not a list");
        };
        let mut merges = HashMap::with_capacity_and_hasher(list.len(), RandomState::default());
        for (rank, m) in list.iter().enumerate() {
            let pair = match m {
                Value::String(s) => s.split_once(' ').filter(|(_, b)| !b.contains(' ')),
                Value::Array(a) => match a.as_slice() {
                    [Value::String(a), Value::String(b)] => Some((a.as_str(), b.as_str())),
                    _ => None,
                },
                _ => None,
            };
            let Some((a, b)) = pair else {
                return refuse(format!("model.merges[{rank}] is not a pair"));
            };
            let joined = format!("{a}{b}");
            let (Some(&l), Some(&r), Some(&new)) = (ids.get(a), ids.get(b), ids.get(&*joined))
            else {
                return refuse(format!("model.merges[{rank}] is out of the vocabulary"));
            };
            let Ok(rank) = u32::try_from(rank) else {
                return refuse("model.merges: too many");
            };
            // A repeated pair keeps its last rank, as the crate's map does.
            merges.insert(u64::from(l) << 32 | u64::from(r), (rank, new));
        }
        Ok(merges)
    }

    /// The added tokens, matched on the raw text, then (`normalized`) on the
    /// pieces between (no normalizer: the same text), with the ids the crate
    /// gives them: the vocabulary's, else the next after it.
    fn added(
        json: &Value,
        ids: &HashMap<&str, u32>,
        classes: &Classes,
    ) -> Result<(AddedSet, AddedSet), UnsupportedTokenizer> {
        let (mut raw, mut normalized) = (AddedSet::default(), AddedSet::default());
        let list = json.get("added_tokens").and_then(Value::as_array);
        let mut next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        let mut seen = std::collections::HashSet::new();
        for t in list.map(Vec::as_slice).unwrap_or_default() {
            let Some(content) = t.get("content").and_then(Value::as_str) else {
                return refuse("added_tokens: a token without content");
            };
            if content.is_empty() {
                continue;
            }
            if !seen.insert(content) {
                return refuse(format!("added_tokens: {content:?} twice"));
            }
            let edge = |c: Option<char>| c.is_some_and(|c| classes.is_space(c));
            if edge(content.chars().next()) || edge(content.chars().next_back()) {
                return refuse(format!(
                    "added_tokens: {content:?} has whitespace at an end"
                ));
            }
            let id = match ids.get(content) {
                Some(&id) => id,
                None => {
                    let id = next;
                    next = next.saturating_add(1);
                    id
                }
            };
            if t.get("id").and_then(Value::as_u64) != Some(u64::from(id)) {
                return refuse(format!("added_tokens: {content:?} does not have id {id}"));
            }
            let added = Added {
                content: content.to_owned(),
                id,
                single_word: flag(t, "single_word", false)?,
                lstrip: flag(t, "lstrip", false)?,
                rstrip: flag(t, "rstrip", false)?,
            };
            let special = flag(t, "special", false)?;
            let set = if flag(t, "normalized", !special)? {
                &mut normalized
            } else {
                &mut raw
            };
            set.first[usize::from(content.as_bytes()[0])] = true;
            set.tokens.push(added);
        }
        for set in [&mut raw, &mut normalized] {
            // Longest first: the first that matches at a position is the
            // leftmost-longest match.
            set.tokens.sort_by_key(|t| Reverse(t.content.len()));
        }
        Ok((raw, normalized))
    }

    /// Appends the ids of `text` to `out`: the crate's
    /// `encode_fast(text, add_special_tokens)` ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool, out: &mut Vec<u32>) {
        if add_special_tokens {
            out.extend_from_slice(&self.prefix);
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.encode_text(text, &mut scratch, out),
            // Not reachable (no re-entry); a fresh scratch is still right.
            Err(_) => self.encode_text(text, &mut Scratch::default(), out),
        });
        if add_special_tokens {
            out.extend_from_slice(&self.suffix);
        }
    }

    fn encode_text(&self, text: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        let slot = scratch.slot(self.key);
        let Scratch { slots, work, .. } = scratch;
        let cache = &mut slots[slot].1;
        let mut gap = |piece: &str, out: &mut Vec<u32>| {
            self.find_added(&self.normalized_added, piece, out, &mut |piece, out| {
                self.pre_tokenize(piece, work, cache, out);
            });
        };
        self.find_added(&self.raw_added, text, out, &mut gap);
    }

    /// The crate's `AddedVocabulary::find_matches`: added tokens' ids, and
    /// `gap` for the text between them.
    fn find_added(
        &self,
        set: &AddedSet,
        s: &str,
        out: &mut Vec<u32>,
        gap: &mut dyn FnMut(&str, &mut Vec<u32>),
    ) {
        if set.tokens.is_empty() {
            if !s.is_empty() {
                gap(s, out);
            }
            return;
        }
        let bytes = s.as_bytes();
        let (mut done, mut i) = (0, 0);
        while i < bytes.len() {
            if !set.first[usize::from(bytes[i])] {
                i += 1;
                continue;
            }
            let Some(t) = set
                .tokens
                .iter()
                .find(|t| bytes[i..].starts_with(t.content.as_bytes()))
            else {
                i += 1;
                continue;
            };
            let (mut start, mut stop) = (i, i + t.content.len());
            i = stop;
            if t.single_word {
                let before = s[..start].chars().next_back();
                let after = s[stop..].chars().next();
                if before.is_some_and(|c| self.classes.is_word(c))
                    || after.is_some_and(|c| self.classes.is_word(c))
                {
                    continue;
                }
            }
            if t.lstrip {
                let kept = s[..start]
                    .trim_end_matches(|c| self.classes.is_space(c))
                    .len();
                start = kept.max(done);
            }
            if t.rstrip {
                let rest = &s[stop..];
                stop += rest.len() - rest.trim_start_matches(|c| self.classes.is_space(c)).len();
            }
            if done < start {
                gap(&s[done..start], out);
            }
            out.push(t.id);
            done = stop;
        }
        if done < s.len() {
            gap(&s[done..], out);
        }
    }

    /// Cuts a piece between added tokens into words and encodes each.
    fn pre_tokenize(
        &self,
        piece: &str,
        work: &mut Work,
        cache: &mut WordCache,
        out: &mut Vec<u32>,
    ) {
        let pre = self.pre;
        let mut text = std::mem::take(&mut work.text);
        let piece = if pre.prefix_space && !pre.prefix_per_word && !piece.starts_with(' ') {
            text.clear();
            text.push(' ');
            text.push_str(piece);
            text.as_str()
        } else {
            piece
        };
        let mut word = |w: &str| {
            if pre.prefix_space && pre.prefix_per_word && !w.starts_with(' ') {
                let mut buf = std::mem::take(&mut work.word);
                buf.clear();
                buf.push(b' ');
                buf.extend_from_slice(w.as_bytes());
                self.encode_word(&buf, work, cache, out);
                work.word = buf;
            } else {
                self.encode_word(w.as_bytes(), work, cache, out);
            }
        };
        match pre.pattern {
            Some(p) => split::split(self.classes, p, piece, &mut word),
            None => word(piece),
        }
        work.text = text;
    }

    /// Appends the ids of one word (its UTF-8 bytes).
    fn encode_word(&self, word: &[u8], work: &mut Work, cache: &mut WordCache, out: &mut Vec<u32>) {
        if let Some(ids) = cache.get(word) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        match self.words.as_ref().and_then(|w| w.get(word)) {
            Some(&id) => out.push(id),
            None => {
                work.syms.clear();
                work.syms.extend(
                    word.iter()
                        .map(|&b| self.byte_ids[usize::from(b)])
                        .filter(|&id| id != u32::MAX),
                );
                if work.syms.len() <= LINEAR_MAX {
                    self.merge_linear(&mut work.syms, &mut work.ranks);
                    out.extend_from_slice(&work.syms);
                } else {
                    self.merge_heap(work, out);
                }
            }
        }
        cache.put(word, &out[start..]);
    }

    fn merge(&self, l: u32, r: u32) -> Option<(u32, u32)> {
        self.merges
            .get(&(u64::from(l) << 32 | u64::from(r)))
            .copied()
    }

    /// Merges the lowest-ranked pair (the leftmost among equals) until none
    /// is left: the crate's order, by a scan over the pairs' ranks.
    fn merge_linear(&self, syms: &mut Vec<u32>, ranks: &mut Vec<(u32, u32)>) {
        const NONE: (u32, u32) = (u32::MAX, 0);
        ranks.clear();
        ranks.extend(
            syms.windows(2)
                .map(|w| self.merge(w[0], w[1]).unwrap_or(NONE)),
        );
        loop {
            let mut best = None;
            let mut best_rank = u32::MAX;
            for (p, &(rank, _)) in ranks.iter().enumerate() {
                if rank < best_rank {
                    best_rank = rank;
                    best = Some(p);
                }
            }
            let Some(p) = best else { return };
            syms[p] = ranks[p].1;
            syms.remove(p + 1);
            ranks.remove(p);
            if p + 1 < syms.len() {
                ranks[p] = self.merge(syms[p], syms[p + 1]).unwrap_or(NONE);
            }
            if p > 0 {
                ranks[p - 1] = self.merge(syms[p - 1], syms[p]).unwrap_or(NONE);
            }
        }
    }

    /// The crate's `Word::merge_all` (a heap of candidate merges over a
    /// linked list of symbols), for long words; appends the result.
    fn merge_heap(&self, work: &mut Work, out: &mut Vec<u32>) {
        let Work {
            syms, links, heap, ..
        } = work;
        let n = syms.len();
        links.clear();
        links.extend((0..n).map(|i| (i.checked_sub(1), (i + 1 < n).then_some(i + 1))));
        heap.clear();
        for p in 0..n.saturating_sub(1) {
            if let Some((rank, new)) = self.merge(syms[p], syms[p + 1]) {
                heap.push(Reverse((rank, p, new)));
            }
        }
        while let Some(Reverse((_, p, new))) = heap.pop() {
            // Merged away, last, or no longer this pair: a stale entry.
            let Some(q) = links[p].1.filter(|_| syms[p] != u32::MAX) else {
                continue;
            };
            if self.merge(syms[p], syms[q]).map(|m| m.1) != Some(new) {
                continue;
            }
            syms[p] = new;
            syms[q] = u32::MAX;
            let after = links[q].1;
            links[p].1 = after;
            if let Some(a) = after {
                links[a].0 = Some(p);
                if let Some((rank, id)) = self.merge(new, syms[a]) {
                    heap.push(Reverse((rank, p, id)));
                }
            }
            if let Some(b) = links[p].0
                && let Some((rank, id)) = self.merge(syms[b], new)
            {
                heap.push(Reverse((rank, b, id)));
            }
        }
        out.extend(syms.iter().filter(|&&s| s != u32::MAX));
    }
}

/// Words up to this many symbols merge by a scan, longer ones by a heap.
const LINEAR_MAX: usize = 48;
/// Words longer than this are not cached (the crate's limit too).
const CACHE_WORD_MAX: usize = 256;
/// Words cached per encoder and thread; the cache is emptied when full.
const CACHE_WORDS: usize = 8192;
/// Encoders whose caches a thread keeps.
const CACHE_SLOTS: usize = 4;

/// Buffers reused across words.
#[derive(Debug, Default)]
struct Work {
    text: String,
    word: Vec<u8>,
    syms: Vec<u32>,
    ranks: Vec<(u32, u32)>,
    links: Vec<(Option<usize>, Option<usize>)>,
    heap: BinaryHeap<Reverse<(u32, usize, u32)>>,
}

/// Merged words: word → a range of `ids`.
#[derive(Debug, Default)]
struct WordCache {
    index: HashMap<Box<[u8]>, (u32, u32), RandomState>,
    ids: Vec<u32>,
}

impl WordCache {
    fn get(&self, word: &[u8]) -> Option<&[u32]> {
        let &(start, len) = self.index.get(word)?;
        self.ids.get(start as usize..(start + len) as usize)
    }

    fn put(&mut self, word: &[u8], ids: &[u32]) {
        if word.len() > CACHE_WORD_MAX {
            return;
        }
        if self.index.len() >= CACHE_WORDS {
            self.index.clear();
            self.ids.clear();
        }
        let (Ok(start), Ok(len)) = (u32::try_from(self.ids.len()), u32::try_from(ids.len())) else {
            return;
        };
        self.ids.extend_from_slice(ids);
        self.index.insert(word.into(), (start, len));
    }
}

/// A thread's buffers and word caches.
#[derive(Debug, Default)]
struct Scratch {
    /// `(encoder key, its cache)`, most recently used last.
    slots: Vec<(u64, WordCache)>,
    work: Work,
}

impl Scratch {
    /// The index of `key`'s cache, made the most recent (evicting the least
    /// recent when all slots are taken).
    fn slot(&mut self, key: u64) -> usize {
        if let Some(i) = self.slots.iter().position(|(k, _)| *k == key) {
            let s = self.slots.remove(i);
            self.slots.push(s);
        } else {
            if self.slots.len() >= CACHE_SLOTS {
                self.slots.remove(0);
            }
            self.slots.push((key, WordCache::default()));
        }
        self.slots.len() - 1
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}
