//! What a lookup in the shared prefix index costs (`redisConfig`): a real
//! `redis-server` on loopback holding 16 endpoints' blocks — 8 hold a
//! prompt's 1,024 blocks, 8 hold its first 512 (the in-process index's
//! `lookup-16k` case) — looked up by [`RedisBlockIndex`], one request at a
//! time and 16 at once, for prompts of 256 and 1,024 blocks (16K tokens in
//! blocks of 64 and 16 tokens).
//!
//! ```sh
//! cargo bench -p epp-datalayer --bench shared_index     # needs redis-server (scripts/setup.sh)
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use epp_core::{RedisAddress, SharedBlockIndex, SharedIndexSpec};
use epp_datalayer::RedisBlockIndex;
use epp_test_support::{process::scratch_dir, redis::RedisServer};
use tokio_util::sync::CancellationToken;

fn lookups(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = scratch_dir("bench-shared-index");
    let server = RedisServer::start(&dir);
    let spec = SharedIndexSpec {
        address: RedisAddress::parse(&server.url()).unwrap(),
        backend: "redis".into(),
        lookup_timeout: Duration::from_secs(5),
    };
    let shutdown = CancellationToken::new();
    let keys: Vec<u64> = (0..1024u64)
        .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let store = rt.block_on(async {
        let store = RedisBlockIndex::start(&spec, shutdown.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !store.stats().connected {
            assert!(Instant::now() < deadline, "redis-server never answered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for e in 0..16 {
            let held = if e < 8 { &keys[..] } else { &keys[..512] };
            store.update(&format!("10.0.0.{e}:8000"), held, &[]);
        }
        // Written once a lookup sees them.
        while store.lookup(keys.clone()).await.unwrap().len() < 16 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        store
    });
    let mut g = c.benchmark_group("shared-index");
    g.sample_size(30).measurement_time(Duration::from_secs(5));
    for blocks in [256, 1024] {
        let keys = keys[..blocks].to_vec();
        g.bench_function(format!("lookup-{blocks}-blocks"), |b| {
            b.iter(|| rt.block_on(store.lookup(keys.clone())).unwrap().len());
        });
        g.bench_function(format!("lookup-{blocks}-blocks-x16-concurrent"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let all: Vec<_> = (0..16).map(|_| store.lookup(keys.clone())).collect();
                    let mut n = 0;
                    for f in all {
                        n += f.await.unwrap().len();
                    }
                    n
                })
            });
        });
    }
    g.finish();
    shutdown.cancel();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
