//! The two pre-tokenizer regexes of byte-level BPE tokenizers, written out
//! as hand-made scanners that cut a text exactly where the `tokenizers`
//! crate's backtracking regex (`fancy-regex`) cuts it.
//!
//! The character classes (`\p{L}`, `\p{N}`, `\s`, `\w` and the
//! case-insensitive letters of Llama 3's contractions) are read once from
//! `regex-syntax`, the crate that gives `fancy-regex` and `regex` theirs, so
//! the scanners and the regexes agree on every code point by construction.

use std::sync::LazyLock;

use regex_syntax::hir::{Class, HirKind};

/// GPT-2's pattern, fixed inside the crate's `ByteLevel` pre-tokenizer.
pub(super) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's pattern, in its `Split` pre-tokenizer.
pub(super) const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which pattern a scanner implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pattern {
    Gpt2,
    Llama3,
}

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 4;
const WORD: u8 = 8;

/// The classes of every code point, as sorted ranges.
#[derive(Debug)]
pub(super) struct Classes {
    /// First code point of each range.
    starts: Vec<u32>,
    /// Class bits of each range.
    bits: Vec<u8>,
    /// Class bits of ASCII.
    ascii: [u8; 128],
    /// For each letter of `s t r e v m l d`: the code points `(?i:x)`
    /// matches (ranges).
    folds: Vec<(u8, Vec<(u32, u32)>)>,
}

fn ranges(pattern: &str) -> Option<Vec<(u32, u32)>> {
    let hir = regex_syntax::parse(pattern).ok()?;
    match hir.into_kind() {
        HirKind::Class(Class::Unicode(c)) => Some(
            c.ranges()
                .iter()
                .map(|r| (u32::from(r.start()), u32::from(r.end())))
                .collect(),
        ),
        HirKind::Literal(l) => {
            let c = std::str::from_utf8(&l.0).ok()?.chars().next()?;
            Some(vec![(u32::from(c), u32::from(c))])
        }
        _ => None,
    }
}

fn contains(ranges: &[(u32, u32)], c: u32) -> bool {
    let i = ranges.partition_point(|&(_, end)| end < c);
    ranges.get(i).is_some_and(|&(start, _)| start <= c)
}

impl Classes {
    fn build() -> Option<Self> {
        let sets = [
            (LETTER, ranges(r"\p{L}")?),
            (NUMBER, ranges(r"\p{N}")?),
            (SPACE, ranges(r"\s")?),
            (WORD, ranges(r"\w")?),
        ];
        let mut cuts: Vec<u32> = vec![0];
        for (_, set) in &sets {
            for &(start, end) in set {
                cuts.push(start);
                cuts.push(end + 1);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let (mut starts, mut bits) = (Vec::new(), Vec::<u8>::new());
        for &cut in &cuts {
            let b = sets
                .iter()
                .filter(|(_, set)| contains(set, cut))
                .fold(0, |acc, (bit, _)| acc | bit);
            if bits.last() != Some(&b) {
                starts.push(cut);
                bits.push(b);
            }
        }
        let mut folds = Vec::new();
        for letter in *b"strevmld" {
            folds.push((letter, ranges(&format!("(?i:{})", char::from(letter)))?));
        }
        let mut classes = Self {
            starts,
            bits,
            ascii: [0; 128],
            folds,
        };
        for b in 0..128u8 {
            classes.ascii[usize::from(b)] = classes.lookup(u32::from(b));
        }
        Some(classes)
    }

    fn lookup(&self, c: u32) -> u8 {
        let i = self.starts.partition_point(|&s| s <= c);
        i.checked_sub(1).map_or(0, |i| self.bits[i])
    }

    #[inline]
    fn of(&self, c: char) -> u8 {
        match self.ascii.get(c as usize) {
            Some(&b) => b,
            None => self.lookup(u32::from(c)),
        }
    }

    /// Whether `c` is whitespace (`\s`).
    pub(super) fn is_space(&self, c: char) -> bool {
        self.of(c) & SPACE != 0
    }

    /// Whether `c` is a word character (`\w`).
    pub(super) fn is_word(&self, c: char) -> bool {
        self.of(c) & WORD != 0
    }

    /// The ASCII letter `c` matches case-insensitively, among Llama 3's
    /// contraction letters.
    fn fold(&self, c: char) -> Option<u8> {
        self.folds
            .iter()
            .find(|(_, set)| contains(set, u32::from(c)))
            .map(|&(l, _)| l)
    }
}

/// The classes, built once; `None` if `regex-syntax` could not give them.
pub(super) fn classes() -> Option<&'static Classes> {
    static CLASSES: LazyLock<Option<Classes>> = LazyLock::new(Classes::build);
    CLASSES.as_ref()
}

/// A scanner over one text.
struct Scan<'a> {
    s: &'a str,
    cls: &'a Classes,
}

impl Scan<'_> {
    /// The character at byte `i` and its bits, if any.
    #[inline]
    fn at(&self, i: usize) -> Option<(char, u8)> {
        let c = self.s.get(i..)?.chars().next()?;
        Some((c, self.cls.of(c)))
    }

    /// End of the run from `i` of characters whose bits satisfy `keep`.
    #[inline]
    fn run(&self, mut i: usize, keep: impl Fn(char, u8) -> bool) -> usize {
        while let Some((c, b)) = self.at(i) {
            if !keep(c, b) {
                break;
            }
            i += c.len_utf8();
        }
        i
    }

    /// `\s+(?!\S)|\s+` at `i`, where a whitespace character starts.
    fn spaces(&self, i: usize) -> usize {
        let end = self.run(i, |_, b| b & SPACE != 0);
        if end == self.s.len() {
            return end;
        }
        // Give back the last whitespace character so that the next one is
        // not `\S`, unless that would leave nothing.
        let last = self.s[..end].chars().next_back().map_or(0, char::len_utf8);
        if end - last > i { end - last } else { end }
    }

    /// The end of the GPT-2 match at `i` (`i < len`).
    fn gpt2(&self, i: usize) -> usize {
        let bytes = self.s.as_bytes();
        if bytes[i] == b'\'' {
            if let Some(b"re" | b"ve" | b"ll") = bytes.get(i + 1..i + 3) {
                return i + 3;
            }
            if let Some(b's' | b't' | b'm' | b'd') = bytes.get(i + 1) {
                return i + 2;
            }
        }
        let Some((c, b)) = self.at(i) else {
            return self.s.len();
        };
        let after_space = if c == ' ' { self.at(i + 1) } else { None };
        for class in [LETTER, NUMBER] {
            if after_space.is_some_and(|(_, nb)| nb & class != 0) {
                return self.run(i + 1, |_, b| b & class != 0);
            }
            if b & class != 0 {
                return self.run(i, |_, b| b & class != 0);
            }
        }
        let other = |_: char, b: u8| b & (LETTER | NUMBER | SPACE) == 0;
        if after_space.is_some_and(|(nc, nb)| other(nc, nb)) {
            return self.run(i + 1, other);
        }
        if other(c, b) {
            return self.run(i, other);
        }
        self.spaces(i)
    }

    /// The end of the Llama 3 match at `i` (`i < len`).
    fn llama3(&self, i: usize) -> usize {
        let Some((c, b)) = self.at(i) else {
            return self.s.len();
        };
        let next = self.at(i + c.len_utf8());
        if c == '\''
            && let Some((n1, _)) = next
        {
            let j = i + 1 + n1.len_utf8();
            match self.cls.fold(n1) {
                Some(b's' | b't' | b'm' | b'd') => return j,
                Some(first @ (b'r' | b'v' | b'l')) => {
                    let second = if first == b'l' { b'l' } else { b'e' };
                    if let Some((n2, _)) = self.at(j)
                        && self.cls.fold(n2) == Some(second)
                    {
                        return j + n2.len_utf8();
                    }
                }
                _ => {}
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        let letters = |_: char, b: u8| b & LETTER != 0;
        if c != '\r' && c != '\n' && b & (LETTER | NUMBER) == 0 {
            if next.is_some_and(|(_, nb)| nb & LETTER != 0) {
                return self.run(i + c.len_utf8(), letters);
            }
        } else if b & LETTER != 0 {
            return self.run(i, letters);
        }
        // \p{N}{1,3}
        if b & NUMBER != 0 {
            let mut end = i;
            for _ in 0..3 {
                match self.at(end) {
                    Some((d, db)) if db & NUMBER != 0 => end += d.len_utf8(),
                    _ => break,
                }
            }
            return end;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let other = |_: char, b: u8| b & (LETTER | NUMBER | SPACE) == 0;
        let newlines = |c: char, _: u8| c == '\r' || c == '\n';
        let start = if c == ' ' && next.is_some_and(|(nc, nb)| other(nc, nb)) {
            Some(i + 1)
        } else if other(c, b) {
            Some(i)
        } else {
            None
        };
        if let Some(start) = start {
            let end = self.run(start, other);
            return self.run(end, newlines);
        }
        // \s*[\r\n]+ : up to the last line break of the whitespace run.
        let end = self.run(i, |_, b| b & SPACE != 0);
        if let Some(p) = self.s[i..end].rfind(['\r', '\n']) {
            return i + p + 1;
        }
        self.spaces(i)
    }
}

/// Calls `piece` with each piece `pattern` cuts `s` into, in order.
pub(super) fn split(cls: &Classes, pattern: Pattern, s: &str, mut piece: impl FnMut(&str)) {
    let scan = Scan { s, cls };
    let mut i = 0;
    while i < s.len() {
        let end = match pattern {
            Pattern::Gpt2 => scan.gpt2(i),
            Pattern::Llama3 => scan.llama3(i),
        };
        // Every character starts a match; this guards the loop anyway.
        let end = if end > i { end } else { s.len() };
        piece(&s[i..end]);
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pattern: Pattern, s: &str) -> Vec<String> {
        let mut out = Vec::new();
        split(classes().expect("classes"), pattern, s, |p| {
            out.push(p.to_owned())
        });
        out
    }

    #[test]
    fn gpt2_cuts_words_numbers_and_whitespace_runs() {
        assert_eq!(
            pieces(Pattern::Gpt2, "Hello  world's 123!!\n\n x"),
            ["Hello", " ", " world", "'s", " 123", "!!", "\n\n", " x"]
        );
        assert_eq!(pieces(Pattern::Gpt2, "a \t"), ["a", " \t"]);
        assert_eq!(pieces(Pattern::Gpt2, "'S 'x"), ["'", "S", " '", "x"]);
    }

    #[test]
    fn llama3_cuts_digit_triples_and_folds_contractions() {
        assert_eq!(
            pieces(Pattern::Llama3, "I'LL pay 12345 now!\r\n\n  ok"),
            [
                "I", "'LL", " pay", " ", "123", "45", " now", "!\r\n\n", " ", " ok"
            ]
        );
        // U+017F LATIN SMALL LETTER LONG S folds to `s`.
        assert_eq!(pieces(Pattern::Llama3, "it'ſ"), ["it", "'ſ"]);
        assert_eq!(pieces(Pattern::Llama3, "x \n \ny"), ["x", " \n \n", "y"]);
    }

    #[test]
    fn classes_agree_with_the_regex_crate_on_samples() {
        let cls = classes().expect("classes");
        let re = |p: &str| regex::Regex::new(p).expect("regex");
        let (l, n, s, w) = (re(r"^\p{L}$"), re(r"^\p{N}$"), re(r"^\s$"), re(r"^\w$"));
        for c in (0..0x3_0000u32).step_by(7).filter_map(char::from_u32) {
            let t = c.to_string();
            let b = cls.of(c);
            assert_eq!(b & LETTER != 0, l.is_match(&t), "{c:?}");
            assert_eq!(b & NUMBER != 0, n.is_match(&t), "{c:?}");
            assert_eq!(b & SPACE != 0, s.is_match(&t), "{c:?}");
            assert_eq!(b & WORD != 0, w.is_match(&t), "{c:?}");
        }
    }
}
