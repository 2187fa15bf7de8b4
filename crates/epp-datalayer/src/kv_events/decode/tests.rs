//! Payloads are written with the `rmp` crate (an encoder this crate does not
//! use), in each shape vLLM has published.

use rmp::encode as enc;

use super::*;

/// A msgpack writer for building payloads.
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn arr(&mut self, n: u32) -> &mut Self {
        enc::write_array_len(&mut self.0, n).expect("write");
        self
    }
    fn map(&mut self, n: u32) -> &mut Self {
        enc::write_map_len(&mut self.0, n).expect("write");
        self
    }
    fn s(&mut self, s: &str) -> &mut Self {
        enc::write_str(&mut self.0, s).expect("write");
        self
    }
    fn u(&mut self, v: u64) -> &mut Self {
        enc::write_uint(&mut self.0, v).expect("write");
        self
    }
    fn i(&mut self, v: i64) -> &mut Self {
        enc::write_sint(&mut self.0, v).expect("write");
        self
    }
    fn f(&mut self, v: f64) -> &mut Self {
        enc::write_f64(&mut self.0, v).expect("write");
        self
    }
    fn nil(&mut self) -> &mut Self {
        enc::write_nil(&mut self.0).expect("write");
        self
    }
    fn bin(&mut self, b: &[u8]) -> &mut Self {
        enc::write_bin(&mut self.0, b).expect("write");
        self
    }
    fn ints(&mut self, v: &[u64]) -> &mut Self {
        self.arr(u32::try_from(v.len()).expect("short"));
        for &x in v {
            self.u(x);
        }
        self
    }
}

fn decode(w: &W) -> (KvEventBatch, Decoded) {
    let mut b = KvEventBatch::default();
    let d = decode_batch(&w.0, &mut b).expect("decodes");
    (b, d)
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 2,
        lora_id: None,
        medium: Some("GPU".into()),
        lora_name: None,
        extra_keys: Vec::new(),
    })
}

#[test]
fn current_vllm_array_encoding() {
    let mut w = W::default();
    w.arr(2).f(1_700_000_000.5).arr(3);
    w.arr(7)
        .s("BlockStored")
        .ints(&[11, u64::MAX])
        .nil()
        .ints(&[1, 2, 3, 4])
        .u(2)
        .nil()
        .s("GPU");
    w.arr(3).s("BlockRemoved").ints(&[11]).s("GPU");
    w.arr(1).s("AllBlocksCleared");
    let (b, d) = decode(&w);
    assert!((b.ts - 1_700_000_000.5).abs() < 1e-9);
    assert_eq!(b.data_parallel_rank, None);
    assert_eq!(d.unknown_events, 0);
    assert_eq!(
        b.events,
        vec![
            stored(&[11, u64::MAX], None, &[1, 2, 3, 4]),
            KvEvent::BlockRemoved {
                block_hashes: vec![11],
                medium: Some("GPU".into())
            },
            KvEvent::AllBlocksCleared,
        ]
    );
}

#[test]
fn before_medium_the_events_were_shorter() {
    let mut w = W::default();
    w.arr(2).f(1.0).arr(2);
    w.arr(6)
        .s("BlockStored")
        .ints(&[5])
        .u(4)
        .ints(&[9, 9])
        .u(2)
        .u(3);
    w.arr(2).s("BlockRemoved").ints(&[5]);
    let (b, _) = decode(&w);
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(s.parent_block_hash, Some(4));
    assert_eq!(s.lora_id, Some(3));
    assert_eq!(s.medium, None);
    assert_eq!(
        b.events[1],
        KvEvent::BlockRemoved {
            block_hashes: vec![5],
            medium: None
        }
    );
}

#[test]
fn byte_hashes_keep_their_last_eight_bytes() {
    let mut digest = [0u8; 32];
    digest[24..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    digest[0] = 0xff;
    let mut w = W::default();
    w.arr(2).i(3).arr(1);
    w.arr(7).s("BlockStored").arr(2).bin(&digest).bin(&[1, 2]);
    w.bin(&digest).ints(&[1, 2, 3, 4]).u(2).nil().s("GPU");
    let (b, _) = decode(&w);
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(s.block_hashes, vec![0x0102_0304_0506_0708, 0x0102]);
    assert_eq!(s.parent_block_hash, Some(0x0102_0304_0506_0708));
    assert!((b.ts - 3.0).abs() < 1e-9);
}

#[test]
fn negative_integer_hashes_are_their_bits() {
    let mut w = W::default();
    w.arr(2).f(0.0).arr(1).arr(2).s("BlockRemoved").arr(1).i(-2);
    let (b, _) = decode(&w);
    assert_eq!(
        b.events[0],
        KvEvent::BlockRemoved {
            block_hashes: vec![u64::MAX - 1],
            medium: None
        }
    );
}

#[test]
fn later_fields_rank_and_lora_name_are_read_or_skipped() {
    let mut w = W::default();
    w.arr(3).f(2.0).arr(1);
    // lora_name, extra_keys (nested), group_idx, kv_cache_spec_kind.
    w.arr(11)
        .s("BlockStored")
        .ints(&[1])
        .nil()
        .ints(&[7, 8])
        .u(2)
        .u(1)
        .s("GPU");
    w.s("sql-lora")
        .arr(1)
        .arr(2)
        .s("salt")
        .map(1)
        .s("k")
        .arr(0)
        .u(0)
        .s("full_attention");
    w.u(3);
    let (b, _) = decode(&w);
    assert_eq!(b.data_parallel_rank, Some(3));
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(s.lora_name.as_deref(), Some("sql-lora"));
    assert_eq!(s.lora_id, Some(1));
    assert_eq!(s.token_ids, vec![7, 8]);
    assert_eq!(
        s.extra_keys,
        vec![vec![ExtraKey::Text("salt".into()), ExtraKey::Other]]
    );
}

/// Every shape of extra key vLLM has sent: LoRA names and ids, multimodal
/// identifiers bare or with their offset, the salt, blocks without keys,
/// in both encodings; an event whose blocks have no key has none.
#[test]
fn extra_keys_per_block() {
    let mut w = W::default();
    w.arr(2).f(0.0).arr(3);
    w.arr(9)
        .s("BlockStored")
        .ints(&[1, 2, 3])
        .nil()
        .ints(&[1, 2, 3])
        .u(1)
        .u(4)
        .nil()
        .s("ad");
    w.arr(3).arr(3).s("ad").arr(2).s("img").i(-1).s("tenant");
    w.nil();
    w.arr(2).i(4).s("img2");
    w.map(6)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .ints(&[9])
        .s("token_ids")
        .ints(&[5])
        .s("block_size")
        .u(1)
        .s("extra_keys")
        .arr(1)
        .arr(1)
        .s("salt")
        .s("group_idx")
        .u(0);
    w.arr(9)
        .s("BlockStored")
        .ints(&[4])
        .nil()
        .ints(&[4])
        .u(1)
        .nil()
        .nil()
        .nil()
        .arr(1)
        .nil();
    let (b, _) = decode(&w);
    let stored: Vec<&BlockStored> = b
        .events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored(s) => s,
            other => panic!("{other:?}"),
        })
        .collect();
    let text = |s: &str| ExtraKey::Text(s.into());
    assert_eq!(
        stored[0].extra_keys,
        vec![
            vec![
                text("ad"),
                ExtraKey::Media {
                    id: "img".into(),
                    offset: -1
                },
                text("tenant")
            ],
            vec![],
            vec![ExtraKey::Int(4), text("img2")],
        ]
    );
    assert_eq!(stored[1].extra_keys, vec![vec![text("salt")]]);
    assert!(stored[2].extra_keys.is_empty());
}

#[test]
fn map_encoded_events_and_batches() {
    let mut w = W::default();
    w.map(3)
        .s("ts")
        .f(5.0)
        .s("data_parallel_rank")
        .nil()
        .s("events")
        .arr(2);
    w.map(6)
        .s("type")
        .s("BlockStored")
        .s("token_ids")
        .ints(&[1, 2]);
    w.s("block_hashes").ints(&[42]).s("block_size").u(2);
    w.s("parent_block_hash").nil().s("group_idx").u(0);
    w.map(3)
        .s("block_hashes")
        .ints(&[42])
        .s("type")
        .s("BlockRemoved")
        .s("medium")
        .s("CPU");
    let (b, _) = decode(&w);
    assert!((b.ts - 5.0).abs() < 1e-9);
    let KvEvent::BlockStored(s) = &b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(
        (s.block_hashes.as_slice(), s.medium.as_deref()),
        (&[42][..], None)
    );
    assert_eq!(
        b.events[1],
        KvEvent::BlockRemoved {
            block_hashes: vec![42],
            medium: Some("CPU".into())
        }
    );
}

#[test]
fn unknown_tags_are_skipped_and_counted() {
    let mut w = W::default();
    w.arr(2).f(0.0).arr(3);
    w.arr(3).s("BlockMoved").ints(&[1]).map(1).s("x").arr(0);
    w.map(2).s("type").s("Future").s("x").u(1);
    w.arr(1).s("AllBlocksCleared");
    let (b, d) = decode(&w);
    assert_eq!(b.events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(d.unknown_events, 2);
}

fn error_of(w: &W) -> DecodeError {
    let mut b = KvEventBatch::default();
    b.events.push(KvEvent::AllBlocksCleared);
    let e = decode_batch(&w.0, &mut b).expect_err("must not decode");
    assert!(b.events.is_empty(), "nothing of a bad batch is kept");
    e
}

#[test]
fn malformed_payloads_name_the_byte() {
    // Truncated inside the token ids.
    let mut w = W::default();
    w.arr(2)
        .f(0.0)
        .arr(1)
        .arr(5)
        .s("BlockStored")
        .ints(&[1])
        .nil()
        .arr(3)
        .u(1);
    assert_eq!(error_of(&w).kind, DecodeErrorKind::Truncated);
    // A count larger than the bytes left is refused before allocating.
    let mut w = W::default();
    w.arr(2).f(0.0).arr(u32::MAX);
    assert_eq!(error_of(&w).kind, DecodeErrorKind::Truncated);
    // Missing fields.
    let mut w = W::default();
    w.arr(2)
        .f(0.0)
        .arr(1)
        .arr(3)
        .s("BlockStored")
        .ints(&[1])
        .nil();
    assert!(matches!(error_of(&w).kind, DecodeErrorKind::Missing(_)));
    // A negative token id.
    let mut w = W::default();
    w.arr(2)
        .f(0.0)
        .arr(1)
        .arr(5)
        .s("BlockStored")
        .ints(&[1])
        .nil()
        .arr(1)
        .i(-1)
        .u(1);
    let e = error_of(&w);
    assert_eq!(e.kind, DecodeErrorKind::OutOfRange("token id"));
    assert_eq!(
        e.to_string(),
        format!("token id out of range at byte {}", e.at)
    );
    // A zero block size.
    let mut w = W::default();
    w.arr(2)
        .f(0.0)
        .arr(1)
        .arr(5)
        .s("BlockStored")
        .ints(&[1])
        .nil()
        .ints(&[1])
        .u(0);
    assert_eq!(error_of(&w).kind, DecodeErrorKind::OutOfRange("block size"));
    // Trailing bytes.
    let mut w = W::default();
    w.arr(2).f(0.0).arr(0).u(1);
    assert_eq!(error_of(&w).kind, DecodeErrorKind::Trailing);
    // Not a batch at all.
    let mut w = W::default();
    w.s("hello");
    assert!(matches!(error_of(&w).kind, DecodeErrorKind::Unexpected(_)));
    assert_eq!(error_of(&W::default()).kind, DecodeErrorKind::Truncated);
}

#[test]
fn deep_nesting_is_refused_without_recursing_far() {
    let mut w = W::default();
    w.arr(2).f(0.0).arr(1).arr(2).s("BlockMoved");
    for _ in 0..100_000 {
        w.arr(1);
    }
    w.u(0);
    assert_eq!(error_of(&w).kind, DecodeErrorKind::TooDeep);
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let mut b = KvEventBatch::default();
        let _ = decode_batch(&bytes, &mut b);
    }

    #[test]
    fn a_valid_batch_cut_short_is_an_error(cut in 0usize..60) {
        let mut w = W::default();
        w.arr(2).f(0.0).arr(1);
        w.arr(7).s("BlockStored").ints(&[11, 12]).nil().ints(&[1, 2, 3, 4]).u(2).nil().s("GPU");
        let cut = cut.min(w.0.len() - 1);
        let mut b = KvEventBatch::default();
        proptest::prop_assert!(decode_batch(&w.0[..cut], &mut b).is_err());
    }
}
