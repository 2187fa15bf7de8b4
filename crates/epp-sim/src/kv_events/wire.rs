//! vLLM's KV event wire format: msgpack, as msgspec encodes
//! `vllm.distributed.kv_events.KVEventBatch` (`array_like=True`,
//! `omit_defaults=True`, events tagged with their class name).
//!
//! ```text
//! batch  = [ts: f64, events: [event...]]            (data_parallel_rank unset: omitted)
//! event  = ["BlockStored", block_hashes, parent_block_hash | nil, token_ids,
//!           block_size, lora_id | nil, "GPU"(, lora_name | nil(, extra_keys))]
//! extra_keys = [[lora_name?, mm identifier*, cache_salt? (first block of the prompt only)] | nil, ...]
//!        | ["BlockRemoved", block_hashes, "GPU"]
//!        | ["AllBlocksCleared"]
//! hash   = uint64, or (hash_bytes) bin32 whose last 8 bytes are the big-endian u64
//! ```

use std::convert::Infallible;

use rmp::encode::{self as enc, ByteBuf, ValueWriteError};

use crate::blocks::PoolEvent;

/// The `medium` of every event: the simulator has one tier, the GPU.
pub const MEDIUM_GPU: &str = "GPU";

/// How block hashes go on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashEncoding {
    /// msgpack unsigned integers (vLLM's int hashes).
    #[default]
    Int,
    /// 32-byte msgpack `bin` values, the u64 in the last 8 bytes, big-endian
    /// (vLLM's newer bytes hashes).
    Bytes,
}

/// Encodes one batch taken at `ts` (seconds since the epoch).
#[must_use]
pub fn encode_batch(
    ts: f64,
    events: &[PoolEvent],
    block_size: usize,
    hashes: HashEncoding,
) -> Vec<u8> {
    let mut buf = ByteBuf::with_capacity(64 + 8 * events.len());
    match write_batch(&mut buf, ts, events, block_size, hashes) {
        Ok(()) => buf.into_vec(),
        Err(
            ValueWriteError::InvalidMarkerWrite(never) | ValueWriteError::InvalidDataWrite(never),
        ) => match never {},
    }
}

type Written = Result<(), ValueWriteError<Infallible>>;

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn write_batch(
    w: &mut ByteBuf,
    ts: f64,
    events: &[PoolEvent],
    block_size: usize,
    hashes: HashEncoding,
) -> Written {
    // data_parallel_rank is None (no data parallelism): omitted.
    enc::write_array_len(w, 2)?;
    enc::write_f64(w, ts)?;
    enc::write_array_len(w, len32(events.len()))?;
    for e in events {
        write_event(w, e, block_size, hashes)?;
    }
    Ok(())
}

fn write_event(w: &mut ByteBuf, e: &PoolEvent, block_size: usize, enc_h: HashEncoding) -> Written {
    match e {
        PoolEvent::Stored {
            hashes,
            parent,
            token_ids,
            lora,
            salt,
            media,
        } => {
            // As vLLM: each block's extra keys are the adapter's name, the
            // media items it overlaps, then (the prompt's first block only)
            // the salt; omitted when none.
            let extras = lora.is_some() || salt.is_some() || !media.is_empty();
            let fields = match (lora.is_some(), extras) {
                (_, true) => 9,
                (true, false) => 8,
                (false, false) => 7,
            };
            enc::write_array_len(w, fields)?;
            enc::write_str(w, "BlockStored")?;
            write_hashes(w, hashes, enc_h)?;
            match parent {
                Some(p) => write_hash(w, *p, enc_h)?,
                None => write_nil(w),
            }
            enc::write_array_len(w, len32(token_ids.len()))?;
            for &t in token_ids {
                enc::write_uint(w, u64::from(t))?;
            }
            enc::write_uint(w, block_size as u64)?;
            match lora {
                Some(l) => {
                    enc::write_uint(w, u64::from(l.id))?;
                }
                None => write_nil(w),
            }
            enc::write_str(w, MEDIUM_GPU)?;
            match lora {
                Some(l) => enc::write_str(w, &l.name)?,
                None if extras => write_nil(w),
                None => {}
            }
            if extras {
                enc::write_array_len(w, len32(hashes.len()))?;
                for i in 0..hashes.len() {
                    let salt = salt.as_deref().filter(|_| i == 0);
                    let items = media.get(i).map_or(&[][..], Vec::as_slice);
                    let n =
                        u32::from(lora.is_some()) + len32(items.len()) + u32::from(salt.is_some());
                    if n == 0 {
                        write_nil(w);
                        continue;
                    }
                    enc::write_array_len(w, n)?;
                    if let Some(l) = lora {
                        enc::write_str(w, &l.name)?;
                    }
                    for id in items {
                        enc::write_str(w, id)?;
                    }
                    if let Some(salt) = salt {
                        enc::write_str(w, salt)?;
                    }
                }
            }
        }
        PoolEvent::Removed { hashes } => {
            enc::write_array_len(w, 3)?;
            enc::write_str(w, "BlockRemoved")?;
            write_hashes(w, hashes, enc_h)?;
            enc::write_str(w, MEDIUM_GPU)?;
        }
        PoolEvent::AllCleared => {
            enc::write_array_len(w, 1)?;
            enc::write_str(w, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn write_nil(w: &mut ByteBuf) {
    match enc::write_nil(w) {
        Ok(()) => {}
        Err(never) => match never {},
    }
}

fn write_hashes(w: &mut ByteBuf, hashes: &[u64], enc_h: HashEncoding) -> Written {
    enc::write_array_len(w, len32(hashes.len()))?;
    for &h in hashes {
        write_hash(w, h, enc_h)?;
    }
    Ok(())
}

fn write_hash(w: &mut ByteBuf, h: u64, enc_h: HashEncoding) -> Written {
    match enc_h {
        HashEncoding::Int => {
            enc::write_uint(w, h)?;
        }
        HashEncoding::Bytes => enc::write_bin(w, &hash_bytes(h))?,
    }
    Ok(())
}

/// A hash as vLLM's bytes hashes look: 32 bytes, `h` big-endian at the end.
#[must_use]
pub fn hash_bytes(h: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[24..].copy_from_slice(&h.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use rmpv::Value;

    use super::*;
    use crate::blocks::LoraTag;

    /// Decodes with rmpv, an independent msgpack reader.
    fn decode(bytes: &[u8]) -> Value {
        let mut r = bytes;
        let v = rmpv::decode::read_value(&mut r).expect("valid msgpack");
        assert!(r.is_empty(), "one value, nothing after it");
        v
    }

    fn only_event(batch: &Value) -> &[Value] {
        let b = batch.as_array().expect("batch is an array");
        assert_eq!(b.len(), 2, "ts and events; data_parallel_rank omitted");
        assert_eq!(b[0].as_f64(), Some(1_700_000_000.25), "ts is a float64");
        assert!(matches!(b[0], Value::F64(_)));
        let events = b[1].as_array().expect("events is an array");
        assert_eq!(events.len(), 1);
        events[0].as_array().expect("event is an array")
    }

    const TS: f64 = 1_700_000_000.25;

    #[test]
    fn block_stored_without_lora_has_seven_fields_and_nil_parent() {
        let e = PoolEvent::Stored {
            hashes: vec![u64::MAX, 7],
            parent: None,
            token_ids: vec![1, 300, 70_000, 2, 3, 4, 5, 6],
            lora: None,
            salt: None,
            media: Vec::new(),
        };
        let v = decode(&encode_batch(TS, &[e], 4, HashEncoding::Int));
        let f = only_event(&v);
        assert_eq!(f.len(), 7, "lora_name omitted: {f:?}");
        assert_eq!(f[0].as_str(), Some("BlockStored"));
        let hashes: Vec<u64> = f[1]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        assert_eq!(hashes, [u64::MAX, 7]);
        assert!(f[2].is_nil(), "parent_block_hash nil for a first block");
        let ids: Vec<u64> = f[3]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(ids, [1, 300, 70_000, 2, 3, 4, 5, 6]);
        assert_eq!(f[4].as_u64(), Some(4), "block_size");
        assert!(f[5].is_nil(), "lora_id nil for the base model");
        assert_eq!(f[6].as_str(), Some("GPU"));
    }

    #[test]
    fn block_stored_with_lora_appends_its_name_and_has_a_parent() {
        let e = PoolEvent::Stored {
            hashes: vec![9],
            parent: Some(8),
            token_ids: vec![1, 2],
            lora: Some(LoraTag {
                id: 2,
                name: "sql-lora".into(),
            }),
            salt: None,
            media: Vec::new(),
        };
        let v = decode(&encode_batch(TS, &[e], 2, HashEncoding::Int));
        let f = only_event(&v);
        assert_eq!(f.len(), 9, "{f:?}");
        assert_eq!(f[2].as_u64(), Some(8));
        assert_eq!(f[5].as_u64(), Some(2), "lora_id");
        assert_eq!(f[6].as_str(), Some("GPU"));
        assert_eq!(f[7].as_str(), Some("sql-lora"));
        assert_eq!(
            f[8],
            Value::Array(vec![Value::Array(vec![Value::from("sql-lora")])]),
            "extra_keys: the adapter's name per block"
        );
    }

    /// vLLM's `generate_block_hash_extra_keys`: the adapter's name on every
    /// block, the salt after it on the prompt's first block only.
    #[test]
    fn a_salt_is_the_first_blocks_last_extra_key() {
        let salted = |lora: Option<LoraTag>| PoolEvent::Stored {
            hashes: vec![1, 2],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            lora,
            salt: Some("tenant".into()),
            media: Vec::new(),
        };
        let v = decode(&encode_batch(TS, &[salted(None)], 2, HashEncoding::Int));
        let f = only_event(&v);
        assert_eq!(f.len(), 9, "{f:?}");
        assert!(f[7].is_nil(), "lora_name nil before extra_keys");
        assert_eq!(
            f[8],
            Value::Array(vec![Value::Array(vec![Value::from("tenant")]), Value::Nil])
        );
        let lora = LoraTag {
            id: 1,
            name: "ad".into(),
        };
        let v = decode(&encode_batch(
            TS,
            &[salted(Some(lora))],
            2,
            HashEncoding::Int,
        ));
        let f = only_event(&v);
        assert_eq!(
            f[8],
            Value::Array(vec![
                Value::Array(vec![Value::from("ad"), Value::from("tenant")]),
                Value::Array(vec![Value::from("ad")]),
            ])
        );
        // Media items between the adapter and the salt, in the blocks they
        // overlap; a block with none of the three is nil.
        let with_media = PoolEvent::Stored {
            hashes: vec![1, 2, 3],
            parent: None,
            token_ids: vec![1, 2, 3, 4, 5, 6],
            lora: None,
            salt: Some("tenant".into()),
            media: vec![
                vec!["img".into()],
                vec!["img".into(), "img2".into()],
                vec![],
            ],
        };
        let v = decode(&encode_batch(TS, &[with_media], 2, HashEncoding::Int));
        let f = only_event(&v);
        assert_eq!(
            f[8],
            Value::Array(vec![
                Value::Array(vec![Value::from("img"), Value::from("tenant")]),
                Value::Array(vec![Value::from("img"), Value::from("img2")]),
                Value::Nil,
            ])
        );
    }

    #[test]
    fn block_removed_and_all_cleared() {
        let v = decode(&encode_batch(
            TS,
            &[PoolEvent::Removed { hashes: vec![5, 6] }],
            16,
            HashEncoding::Int,
        ));
        let f = only_event(&v);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].as_str(), Some("BlockRemoved"));
        assert_eq!(
            f[1],
            Value::Array(vec![Value::from(5u64), Value::from(6u64)])
        );
        assert_eq!(f[2].as_str(), Some("GPU"));

        let v = decode(&encode_batch(
            TS,
            &[PoolEvent::AllCleared],
            16,
            HashEncoding::Int,
        ));
        assert_eq!(only_event(&v), [Value::from("AllBlocksCleared")]);
    }

    #[test]
    fn bytes_hashes_are_bin32_with_the_u64_big_endian_at_the_end() {
        let h = 0x0102_0304_0506_0708u64;
        let e = PoolEvent::Stored {
            hashes: vec![h],
            parent: Some(1),
            token_ids: vec![0],
            lora: None,
            salt: None,
            media: Vec::new(),
        };
        let v = decode(&encode_batch(TS, &[e], 1, HashEncoding::Bytes));
        let f = only_event(&v);
        let Value::Binary(b) = &f[1].as_array().unwrap()[0] else {
            panic!("a bin hash: {f:?}");
        };
        assert_eq!(b.len(), 32);
        assert_eq!(b[..24], [0; 24]);
        assert_eq!(b[24..], h.to_be_bytes());
        assert_eq!(f[2], Value::Binary(hash_bytes(1).to_vec()), "parent too");
    }

    #[test]
    fn an_empty_batch_is_two_fields() {
        let v = decode(&encode_batch(TS, &[], 16, HashEncoding::Int));
        assert_eq!(v, Value::Array(vec![Value::F64(TS), Value::Array(vec![])]));
    }
}
