//! Decoding vLLM's KV-event batches (the payload frame of each ZeroMQ
//! message) into [`KvEventBatch`].
//!
//! Input contract: one msgpack value, vLLM's `KVEventBatch` as msgspec
//! encodes it with `array_like=True, omit_defaults=True`:
//!
//! ```text
//! batch  = [ts: float|int, events: [event...], data_parallel_rank?: int|nil]
//!        | {"ts": .., "events": [..], "data_parallel_rank": ..}
//! event  = ["BlockStored", block_hashes, parent_block_hash|nil, token_ids,
//!           block_size, lora_id?|nil, medium?|nil, lora_name?|nil,
//!           extra_keys?|nil, ...]
//!        | ["BlockRemoved", block_hashes, medium?|nil, ...]
//!        | ["AllBlocksCleared", ...]
//!        | {"type": <tag>, <field name>: <value>, ...}
//! hash   = uint | int (two's complement) | bin/str (last 8 bytes, big-endian)
//! extra_keys = [ nil | [ str | int | [str, int] | any ... ] ... ]   (one per block)
//! ```
//!
//! Every encoding vLLM has shipped is accepted: integer hashes (before 0.10)
//! and byte hashes (after), with or without `medium`, `lora_name`,
//! `extra_keys` and the rank; later trailing fields (`group_idx`, …) are
//! skipped, as are events with a tag this build does not know (counted in
//! [`Decoded::unknown_events`]). Anything else is a [`DecodeError`] naming
//! the byte offset; the batch is then not applied at all.
//!
//! Nesting deeper than [`MAX_DEPTH`] and lengths larger than the bytes left
//! are errors, so a hostile publisher costs at most its payload's size.

use std::fmt;

use epp_core::{BlockStored, ExtraKey, KvEvent, KvEventBatch};

/// Deepest nesting of arrays and maps skipped inside an event.
pub const MAX_DEPTH: u32 = 16;

/// What a decode found besides the events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Events whose tag this build does not know, skipped.
    pub unknown_events: u32,
}

/// Why a payload is not a KV-event batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError {
    /// Byte offset in the payload.
    pub at: usize,
    /// What was wrong there.
    pub kind: DecodeErrorKind,
}

/// The kinds of [`DecodeError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The payload ends inside a value.
    Truncated,
    /// A value of another type than the field needs.
    Unexpected(&'static str),
    /// A field every event of its kind has is missing.
    Missing(&'static str),
    /// A token id or block size out of range.
    OutOfRange(&'static str),
    /// Arrays or maps nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A string that is not UTF-8.
    BadUtf8,
    /// Bytes left after the batch.
    Trailing,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.at;
        match self.kind {
            DecodeErrorKind::Truncated => write!(f, "truncated at byte {at}"),
            DecodeErrorKind::Unexpected(what) => write!(f, "expected {what} at byte {at}"),
            DecodeErrorKind::Missing(what) => write!(f, "missing {what} at byte {at}"),
            DecodeErrorKind::OutOfRange(what) => write!(f, "{what} out of range at byte {at}"),
            DecodeErrorKind::TooDeep => write!(f, "nested too deep at byte {at}"),
            DecodeErrorKind::BadUtf8 => write!(f, "string is not UTF-8 at byte {at}"),
            DecodeErrorKind::Trailing => write!(f, "bytes left after the batch at byte {at}"),
        }
    }
}

impl std::error::Error for DecodeError {}

type Result<T> = std::result::Result<T, DecodeError>;

/// Decodes `payload` into `out`, replacing its contents (its event vector's
/// capacity is kept).
///
/// # Errors
/// When `payload` is not one batch as described in the module docs; `out`
/// is then left empty.
pub fn decode_batch(payload: &[u8], out: &mut KvEventBatch) -> Result<Decoded> {
    out.events.clear();
    out.ts = 0.0;
    out.data_parallel_rank = None;
    let mut r = Reader {
        buf: payload,
        pos: 0,
    };
    let mut decoded = Decoded::default();
    let res = r.batch(out, &mut decoded).and_then(|()| {
        if r.pos == payload.len() {
            Ok(())
        } else {
            Err(r.err(DecodeErrorKind::Trailing))
        }
    });
    if let Err(e) = res {
        out.events.clear();
        return Err(e);
    }
    Ok(decoded)
}

/// A msgpack value's header, read without its payload.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Head {
    Nil,
    Bool,
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(usize),
    Bin(usize),
    Array(usize),
    Map(usize),
    Ext(usize),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, kind: DecodeErrorKind) -> DecodeError {
        DecodeError { at: self.pos, kind }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(DecodeError {
                at: self.pos,
                kind: DecodeErrorKind::Truncated,
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn len_of(&mut self, bytes: usize) -> Result<usize> {
        let n = match bytes {
            1 => u64::from(self.be::<1>()?[0]),
            2 => u64::from(u16::from_be_bytes(self.be()?)),
            _ => u64::from(u32::from_be_bytes(self.be()?)),
        };
        usize::try_from(n).map_err(|_| self.err(DecodeErrorKind::Truncated))
    }

    /// Reads one value's header; for strings, bins and exts the payload
    /// follows, for arrays and maps their elements.
    fn head(&mut self) -> Result<Head> {
        let b = self.be::<1>()?[0];
        Ok(match b {
            0x00..=0x7f => Head::Uint(u64::from(b)),
            0x80..=0x8f => Head::Map(usize::from(b & 0x0f)),
            0x90..=0x9f => Head::Array(usize::from(b & 0x0f)),
            0xa0..=0xbf => Head::Str(usize::from(b & 0x1f)),
            0xc0 => Head::Nil,
            0xc2 | 0xc3 => Head::Bool,
            0xc4 => Head::Bin(self.len_of(1)?),
            0xc5 => Head::Bin(self.len_of(2)?),
            0xc6 => Head::Bin(self.len_of(4)?),
            0xc7 => Head::Ext(self.len_of(1)? + 1),
            0xc8 => Head::Ext(self.len_of(2)? + 1),
            0xc9 => Head::Ext(self.len_of(4)?.saturating_add(1)),
            0xca => Head::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Head::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Head::Uint(u64::from(self.be::<1>()?[0])),
            0xcd => Head::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Head::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Head::Uint(u64::from_be_bytes(self.be()?)),
            0xd0 => Head::Int(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Head::Int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Head::Int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Head::Int(i64::from_be_bytes(self.be()?)),
            0xd4 => Head::Ext(2),
            0xd5 => Head::Ext(3),
            0xd6 => Head::Ext(5),
            0xd7 => Head::Ext(9),
            0xd8 => Head::Ext(17),
            0xd9 => Head::Str(self.len_of(1)?),
            0xda => Head::Str(self.len_of(2)?),
            0xdb => Head::Str(self.len_of(4)?),
            0xdc => Head::Array(self.len_of(2)?),
            0xdd => Head::Array(self.len_of(4)?),
            0xde => Head::Map(self.len_of(2)?),
            0xdf => Head::Map(self.len_of(4)?),
            0xe0..=0xff => Head::Int(i64::from(b as i8)),
            // 0xc1 is never used.
            0xc1 => {
                self.pos -= 1;
                return Err(self.err(DecodeErrorKind::Unexpected("a msgpack value")));
            }
        })
    }

    /// The elements of an array can only be as many as the bytes left:
    /// refusing larger counts keeps preallocation bounded by the payload.
    fn count(&self, n: usize) -> Result<usize> {
        if n > self.buf.len() - self.pos {
            return Err(self.err(DecodeErrorKind::Truncated));
        }
        Ok(n)
    }

    fn array(&mut self, what: &'static str) -> Result<usize> {
        let at = self.pos;
        match self.head()? {
            Head::Array(n) => self.count(n),
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected(what),
            }),
        }
    }

    fn str(&mut self, what: &'static str) -> Result<&'a str> {
        let at = self.pos;
        match self.head()? {
            Head::Str(n) => {
                let s = self.take(n)?;
                std::str::from_utf8(s).map_err(|_| DecodeError {
                    at,
                    kind: DecodeErrorKind::BadUtf8,
                })
            }
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected(what),
            }),
        }
    }

    /// `None` for nil.
    fn opt_str(&mut self, what: &'static str) -> Result<Option<String>> {
        if self.peek_nil() {
            self.pos += 1;
            return Ok(None);
        }
        self.str(what).map(|s| Some(s.to_owned()))
    }

    fn peek_nil(&self) -> bool {
        self.buf.get(self.pos) == Some(&0xc0)
    }

    fn int(&mut self, what: &'static str) -> Result<i64> {
        let at = self.pos;
        match self.head()? {
            Head::Int(i) => Ok(i),
            Head::Uint(u) => i64::try_from(u).map_err(|_| DecodeError {
                at,
                kind: DecodeErrorKind::OutOfRange(what),
            }),
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected(what),
            }),
        }
    }

    fn opt_int(&mut self, what: &'static str) -> Result<Option<i64>> {
        if self.peek_nil() {
            self.pos += 1;
            return Ok(None);
        }
        self.int(what).map(Some)
    }

    /// A block hash: an integer (as its 64 bits) or bytes (the last 8,
    /// big-endian, left-padded with zeros when shorter).
    fn hash(&mut self) -> Result<u64> {
        let at = self.pos;
        match self.head()? {
            Head::Uint(u) => Ok(u),
            Head::Int(i) => Ok(i as u64),
            Head::Bin(n) | Head::Str(n) => {
                let s = self.take(n)?;
                let tail = &s[s.len().saturating_sub(8)..];
                Ok(tail.iter().fold(0u64, |h, &b| (h << 8) | u64::from(b)))
            }
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected("a block hash"),
            }),
        }
    }

    fn opt_hash(&mut self) -> Result<Option<u64>> {
        if self.peek_nil() {
            self.pos += 1;
            return Ok(None);
        }
        self.hash().map(Some)
    }

    fn hashes(&mut self, out: &mut Vec<u64>) -> Result<()> {
        let n = self.array("an array of block hashes")?;
        out.reserve(n);
        for _ in 0..n {
            out.push(self.hash()?);
        }
        Ok(())
    }

    fn tokens(&mut self, out: &mut Vec<u32>) -> Result<()> {
        let n = self.array("an array of token ids")?;
        out.reserve(n);
        for _ in 0..n {
            let at = self.pos;
            let t = self.int("a token id")?;
            out.push(u32::try_from(t).map_err(|_| DecodeError {
                at,
                kind: DecodeErrorKind::OutOfRange("token id"),
            })?);
        }
        Ok(())
    }

    /// `extra_keys`: nil, or one entry per block, each nil or a list of
    /// keys. Keys of shapes not in [`ExtraKey`] are skipped and kept as
    /// [`ExtraKey::Other`].
    fn extra_keys(&mut self, out: &mut Vec<Vec<ExtraKey>>) -> Result<()> {
        out.clear();
        if self.peek_nil() {
            self.pos += 1;
            return Ok(());
        }
        let blocks = self.array("extra_keys (an array per block)")?;
        out.reserve(blocks);
        for _ in 0..blocks {
            let mut keys = Vec::new();
            if self.peek_nil() {
                self.pos += 1;
            } else {
                let n = self.array("a block's extra keys (an array)")?;
                keys.reserve(n);
                for _ in 0..n {
                    keys.push(self.extra_key()?);
                }
            }
            out.push(keys);
        }
        // No block with a key: as if none were sent.
        if out.iter().all(Vec::is_empty) {
            out.clear();
        }
        Ok(())
    }

    fn extra_key(&mut self) -> Result<ExtraKey> {
        let start = self.pos;
        Ok(match self.head()? {
            Head::Str(_) => {
                self.pos = start;
                ExtraKey::Text(self.str("an extra key")?.to_owned())
            }
            Head::Int(i) => ExtraKey::Int(i),
            Head::Uint(u) => i64::try_from(u).map_or(ExtraKey::Other, ExtraKey::Int),
            Head::Array(2) if matches!(self.buf.get(self.pos), Some(0xa0..=0xbf | 0xd9..=0xdb)) => {
                let id = self.str("a multimodal identifier")?.to_owned();
                let at = self.pos;
                match self.head()? {
                    Head::Int(offset) => ExtraKey::Media { id, offset },
                    Head::Uint(u) => ExtraKey::Media {
                        id,
                        offset: i64::try_from(u).unwrap_or(i64::MAX),
                    },
                    _ => {
                        self.pos = at;
                        self.skip(2)?;
                        ExtraKey::Other
                    }
                }
            }
            _ => {
                self.pos = start;
                self.skip(2)?;
                ExtraKey::Other
            }
        })
    }

    fn skip(&mut self, depth: u32) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(self.err(DecodeErrorKind::TooDeep));
        }
        match self.head()? {
            Head::Nil | Head::Bool | Head::Uint(_) | Head::Int(_) | Head::Float(_) => Ok(()),
            Head::Str(n) | Head::Bin(n) | Head::Ext(n) => self.take(n).map(drop),
            Head::Array(n) => {
                for _ in 0..self.count(n)? {
                    self.skip(depth + 1)?;
                }
                Ok(())
            }
            Head::Map(n) => {
                for _ in 0..self.count(n)? {
                    self.skip(depth + 1)?;
                    self.skip(depth + 1)?;
                }
                Ok(())
            }
        }
    }

    fn batch(&mut self, out: &mut KvEventBatch, decoded: &mut Decoded) -> Result<()> {
        let at = self.pos;
        match self.head()? {
            Head::Array(n) => {
                let n = self.count(n)?;
                if n < 2 {
                    return Err(DecodeError {
                        at,
                        kind: DecodeErrorKind::Missing("ts and events"),
                    });
                }
                out.ts = self.float()?;
                self.events(out, decoded)?;
                if n > 2 {
                    out.data_parallel_rank = self.opt_int("a data-parallel rank")?;
                }
                for _ in 3..n {
                    self.skip(1)?;
                }
                Ok(())
            }
            Head::Map(n) => {
                let mut events = false;
                for _ in 0..self.count(n)? {
                    match self.str("a field name")? {
                        "ts" => out.ts = self.float()?,
                        "events" => {
                            self.events(out, decoded)?;
                            events = true;
                        }
                        "data_parallel_rank" => {
                            out.data_parallel_rank = self.opt_int("a data-parallel rank")?;
                        }
                        _ => self.skip(1)?,
                    }
                }
                if events {
                    Ok(())
                } else {
                    Err(DecodeError {
                        at,
                        kind: DecodeErrorKind::Missing("events"),
                    })
                }
            }
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected("a batch (array or map)"),
            }),
        }
    }

    fn float(&mut self) -> Result<f64> {
        let at = self.pos;
        match self.head()? {
            Head::Float(f) => Ok(f),
            Head::Uint(u) => Ok(u as f64),
            Head::Int(i) => Ok(i as f64),
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected("a timestamp"),
            }),
        }
    }

    fn events(&mut self, out: &mut KvEventBatch, decoded: &mut Decoded) -> Result<()> {
        let n = self.array("an array of events")?;
        for _ in 0..n {
            match self.event()? {
                Some(e) => out.events.push(e),
                None => decoded.unknown_events += 1,
            }
        }
        Ok(())
    }

    /// One event; `None` for a tag this build does not know.
    fn event(&mut self) -> Result<Option<KvEvent>> {
        let at = self.pos;
        match self.head()? {
            Head::Array(n) => {
                let n = self.count(n)?;
                if n == 0 {
                    return Err(DecodeError {
                        at,
                        kind: DecodeErrorKind::Missing("the event's tag"),
                    });
                }
                let tag = self.str("an event tag")?;
                let mut left = n - 1;
                let event = self.positional(tag, &mut left, at)?;
                for _ in 0..left {
                    self.skip(1)?;
                }
                Ok(event)
            }
            Head::Map(n) => self.named(self.count(n)?, at),
            _ => Err(DecodeError {
                at,
                kind: DecodeErrorKind::Unexpected("an event (array or map)"),
            }),
        }
    }

    /// The fields after the tag of an array-encoded event; `left` counts
    /// those not yet read.
    fn positional(&mut self, tag: &str, left: &mut usize, at: usize) -> Result<Option<KvEvent>> {
        let missing = |what| DecodeError {
            at,
            kind: DecodeErrorKind::Missing(what),
        };
        // Reads the next field when there is one.
        macro_rules! next {
            ($read:expr) => {
                if *left > 0 {
                    *left -= 1;
                    Some($read)
                } else {
                    None
                }
            };
        }
        Ok(Some(match tag {
            "BlockStored" => {
                if *left < 4 {
                    return Err(missing(
                        "BlockStored fields (block_hashes, parent, token_ids, block_size)",
                    ));
                }
                let mut s = BlockStored::default();
                *left -= 4;
                self.hashes(&mut s.block_hashes)?;
                s.parent_block_hash = self.opt_hash()?;
                self.tokens(&mut s.token_ids)?;
                s.block_size = self.block_size()?;
                s.lora_id = next!(self.opt_int("a LoRA id")?).flatten();
                s.medium = next!(self.opt_str("a medium")?).flatten();
                s.lora_name = next!(self.opt_str("a LoRA name")?).flatten();
                next!(self.extra_keys(&mut s.extra_keys)?);
                KvEvent::BlockStored(s)
            }
            "BlockRemoved" => {
                if *left < 1 {
                    return Err(missing("BlockRemoved's block_hashes"));
                }
                *left -= 1;
                let mut block_hashes = Vec::new();
                self.hashes(&mut block_hashes)?;
                let medium = next!(self.opt_str("a medium")?).flatten();
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                }
            }
            "AllBlocksCleared" => KvEvent::AllBlocksCleared,
            _ => return Ok(None),
        }))
    }

    fn block_size(&mut self) -> Result<u32> {
        let at = self.pos;
        let n = self.int("a block size")?;
        u32::try_from(n).ok().filter(|&n| n > 0).ok_or(DecodeError {
            at,
            kind: DecodeErrorKind::OutOfRange("block size"),
        })
    }

    /// A map-encoded event (`{"type": tag, field: value, ...}`).
    fn named(&mut self, n: usize, at: usize) -> Result<Option<KvEvent>> {
        let mut tag: Option<&str> = None;
        let mut s = BlockStored::default();
        let (mut hashes, mut tokens, mut size) = (false, false, false);
        for _ in 0..n {
            match self.str("a field name")? {
                "type" => tag = Some(self.str("an event tag")?),
                "block_hashes" => {
                    self.hashes(&mut s.block_hashes)?;
                    hashes = true;
                }
                "parent_block_hash" => s.parent_block_hash = self.opt_hash()?,
                "token_ids" => {
                    self.tokens(&mut s.token_ids)?;
                    tokens = true;
                }
                "block_size" => {
                    s.block_size = self.block_size()?;
                    size = true;
                }
                "lora_id" => s.lora_id = self.opt_int("a LoRA id")?,
                "medium" => s.medium = self.opt_str("a medium")?,
                "lora_name" => s.lora_name = self.opt_str("a LoRA name")?,
                "extra_keys" => self.extra_keys(&mut s.extra_keys)?,
                _ => self.skip(1)?,
            }
        }
        let missing = |what| DecodeError {
            at,
            kind: DecodeErrorKind::Missing(what),
        };
        Ok(Some(
            match tag.ok_or_else(|| missing("the event's \"type\""))? {
                "BlockStored" => {
                    if !(hashes && tokens && size) {
                        return Err(missing(
                            "BlockStored fields (block_hashes, token_ids, block_size)",
                        ));
                    }
                    KvEvent::BlockStored(s)
                }
                "BlockRemoved" => {
                    if !hashes {
                        return Err(missing("BlockRemoved's block_hashes"));
                    }
                    KvEvent::BlockRemoved {
                        block_hashes: s.block_hashes,
                        medium: s.medium,
                    }
                }
                "AllBlocksCleared" => KvEvent::AllBlocksCleared,
                _ => return Ok(None),
            },
        ))
    }
}

#[cfg(test)]
mod tests;
