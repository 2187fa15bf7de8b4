//! Decoding vLLM KV-event batches: one batch of 16 `BlockStored` events of
//! 16 blocks × 16 tokens (integer hashes) and 16 `BlockRemoved` of 16
//! blocks, encoded with `rmp` as msgspec does; throughput in block events.
//!
//! ```sh
//! cargo bench -p epp-datalayer --bench kv_decode
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use epp_core::KvEventBatch;
use epp_datalayer::kv_events::decode_batch;
use rmp::encode as enc;

fn payload() -> Vec<u8> {
    let mut w = Vec::new();
    enc::write_array_len(&mut w, 2).unwrap();
    enc::write_f64(&mut w, 1.7e9).unwrap();
    enc::write_array_len(&mut w, 32).unwrap();
    let mut hash = 1u64 << 60;
    for e in 0..16u32 {
        enc::write_array_len(&mut w, 7).unwrap();
        enc::write_str(&mut w, "BlockStored").unwrap();
        enc::write_array_len(&mut w, 16).unwrap();
        for _ in 0..16 {
            hash += 1;
            enc::write_uint(&mut w, hash).unwrap();
        }
        enc::write_uint(&mut w, hash - 17).unwrap();
        enc::write_array_len(&mut w, 256).unwrap();
        for t in 0..256u32 {
            enc::write_uint(&mut w, u64::from(t.wrapping_mul(7919) ^ e) % 128_000).unwrap();
        }
        enc::write_uint(&mut w, 16).unwrap();
        enc::write_nil(&mut w).unwrap();
        enc::write_str(&mut w, "GPU").unwrap();
    }
    for _ in 0..16 {
        enc::write_array_len(&mut w, 3).unwrap();
        enc::write_str(&mut w, "BlockRemoved").unwrap();
        enc::write_array_len(&mut w, 16).unwrap();
        for _ in 0..16 {
            hash += 1;
            enc::write_uint(&mut w, hash).unwrap();
        }
        enc::write_str(&mut w, "GPU").unwrap();
    }
    w
}

fn decode(c: &mut Criterion) {
    let p = payload();
    let mut batch = KvEventBatch::default();
    decode_batch(&p, &mut batch).unwrap();
    assert_eq!(batch.events.len(), 32);
    let mut g = c.benchmark_group("kv-events");
    g.throughput(Throughput::Elements(512));
    g.bench_function("decode", |b| {
        b.iter(|| {
            decode_batch(&p, &mut batch).unwrap();
            batch.events.len()
        });
    });
    g.finish();
    eprintln!("payload: {} bytes for 512 block events", p.len());
}

criterion_group!(benches, decode);
criterion_main!(benches);
