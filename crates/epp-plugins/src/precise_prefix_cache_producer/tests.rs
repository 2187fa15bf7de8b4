use epp_core::{
    ApiKind, BlockStored, InferenceRequest, KvEvent, PluginRef, Scheduler, SchedulingProfile,
    SingleProfileHandler,
};
use epp_test_support::{process::scratch_dir, tokenizer::write_test_tokenizer};

use super::*;
use crate::{
    MaxScorePicker, PickerParams, PrefixCacheScorer, PrefixCacheScorerParams, TokenProducer,
    TokenProducerParams, testing::snapshot,
};

fn params(yaml: &str) -> PrecisePrefixParams {
    serde_yaml_ng::from_str(yaml).expect("parses")
}

fn token_producer() -> TokenProducer {
    let dir = scratch_dir("precise-prefix");
    let file = write_test_tokenizer(&dir).expect("tokenizer written");
    let p: TokenProducerParams = serde_yaml_ng::from_str(&format!(
        "{{local: {{path: {}, reloadInterval: 0s}}}}",
        file.display()
    ))
    .expect("parses");
    TokenProducer::build("tok", p).expect("builds")
}

struct Setup {
    tokens: Arc<TokenProducer>,
    precise: Arc<PrecisePrefixCacheProducer>,
    scheduler: Scheduler,
}

fn setup(with_tokens: bool) -> Setup {
    setup_with(with_tokens, "{tokenProcessorConfig: {blockSize: 4}}")
}

/// The token producer (unless `with_tokens` is false), the precise producer
/// with `producer_params`, a prefix-cache-scorer reading it, a max-score picker.
fn setup_with(with_tokens: bool, producer_params: &str) -> Setup {
    let tokens = Arc::new(token_producer());
    let precise = Arc::new(
        PrecisePrefixCacheProducer::build("precise-prefix-cache-producer", params(producer_params))
            .expect("builds"),
    );
    let scorer = Arc::new(
        PrefixCacheScorer::build(
            "prefix",
            PrefixCacheScorerParams {
                prefix_match_info_producer_name: Some("precise-prefix-cache-producer".into()),
                ..PrefixCacheScorerParams::default()
            },
        )
        .expect("builds"),
    );
    let picker = Arc::new(MaxScorePicker::build("pick", PickerParams::default()).expect("builds"));
    let profile = SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(scorer.clone()), 1.0)
        .with_picker(PluginRef::new(picker));
    // Declared in the "wrong" order: the token producer must still run first.
    let mut hooks = vec![PluginRef::new(precise.clone()), PluginRef::new(scorer)];
    if with_tokens {
        hooks.push(PluginRef::new(tokens.clone()));
    }
    let scheduler = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
        .expect("valid")
        .with_hooks(hooks);
    Setup {
        tokens,
        precise,
        scheduler,
    }
}

/// What an engine of block size `size` reports storing for `tokens`.
fn stored_batch(tokens: &[u32], size: usize, model: &str) -> KvEventBatch {
    let blocks = tokens.len() / size;
    KvEventBatch {
        events: vec![KvEvent::BlockStored(BlockStored {
            block_hashes: (0..blocks as u64).map(|b| 1000 + b).collect(),
            parent_block_hash: None,
            token_ids: tokens[..blocks * size].to_vec(),
            block_size: u32::try_from(size).expect("small"),
            medium: Some("GPU".into()),
            ..BlockStored::default()
        })],
        model: Some(model.into()),
        ..KvEventBatch::default()
    }
}

const SYSTEM: &str = "The system prompt is the same for every user of the application. ";

#[test]
fn routes_to_the_endpoint_whose_engine_reports_the_prompts_blocks() {
    let s = setup(true);
    let snap = snapshot(4);
    let home = &snap.endpoints()[2];
    let mut ids = Vec::new();
    s.tokens
        .tokenize(&SYSTEM.repeat(4), &mut ids)
        .expect("tokenizes");
    assert!(ids.len() > 40, "{} tokens", ids.len());
    s.precise.apply(home, &stored_batch(&ids, 4, "m"));
    for q in 0..10 {
        let req = InferenceRequest::builder("m")
            .api(ApiKind::Completions)
            .prompt(format!("{}Question {q}?", SYSTEM.repeat(4)))
            .build();
        let r = s.scheduler.schedule(&req, &snap).expect("schedules");
        assert_eq!(r.primary().expect("a pick").id(), home.id(), "request {q}");
    }
    let c = s.precise.index().counters();
    assert_eq!(c.lookups.load(Ordering::Relaxed), 10);
    assert!(c.hit_blocks.load(Ordering::Relaxed) >= 100);
    // Once the engine evicts everything, nothing matches any more.
    s.precise.apply(
        home,
        &KvEventBatch {
            events: vec![KvEvent::AllBlocksCleared],
            ..KvEventBatch::default()
        },
    );
    let req = InferenceRequest::builder("m")
        .api(ApiKind::Completions)
        .prompt(SYSTEM.repeat(4))
        .build();
    let hits = c.hit_blocks.load(Ordering::Relaxed);
    s.scheduler.schedule(&req, &snap).expect("schedules");
    assert_eq!(c.hit_blocks.load(Ordering::Relaxed), hits);
}

#[test]
fn another_model_or_a_salt_or_no_tokens_match_nothing() {
    let s = setup(true);
    let snap = snapshot(2);
    let mut ids = Vec::new();
    s.tokens.tokenize(SYSTEM, &mut ids).expect("tokenizes");
    s.precise
        .apply(&snap.endpoints()[1], &stored_batch(&ids, 4, "m"));
    let c = s.precise.index().counters();
    for req in [
        InferenceRequest::builder("other")
            .api(ApiKind::Completions)
            .prompt(SYSTEM)
            .build(),
        InferenceRequest::builder("m")
            .api(ApiKind::Completions)
            .prompt(SYSTEM)
            .cache_salt("tenant")
            .build(),
        // Chat is not tokenized (no chat template yet).
        InferenceRequest::builder("m")
            .api(ApiKind::ChatCompletions)
            .prompt(SYSTEM)
            .build(),
    ] {
        s.scheduler.schedule(&req, &snap).expect("schedules");
    }
    assert_eq!(c.hit_blocks.load(Ordering::Relaxed), 0);
    // Without a token producer the producer looks nothing up.
    let bare = setup(false);
    bare.precise
        .apply(&snap.endpoints()[1], &stored_batch(&ids, 4, "m"));
    let req = InferenceRequest::builder("m")
        .api(ApiKind::Completions)
        .prompt(SYSTEM)
        .build();
    bare.scheduler.schedule(&req, &snap).expect("schedules");
    assert_eq!(
        bare.precise
            .index()
            .counters()
            .lookups
            .load(Ordering::Relaxed),
        0
    );
}

#[test]
fn speculative_indexing_sends_a_prefix_after_its_first_pick() {
    let Setup {
        precise, scheduler, ..
    } = setup_with(
        true,
        "{tokenProcessorConfig: {blockSize: 4}, speculativeIndexing: true, speculativeTTL: 5s}",
    );
    let snap = snapshot(8);
    let ask = |q: usize| {
        let req = InferenceRequest::builder("m")
            .api(ApiKind::Completions)
            .prompt(format!("{}Question {q}?", SYSTEM.repeat(3)))
            .build();
        scheduler
            .schedule(&req, &snap)
            .expect("schedules")
            .primary()
            .expect("a pick")
            .id()
    };
    let first = ask(0);
    for q in 1..10 {
        assert_eq!(
            ask(q),
            first,
            "request {q} follows the first pick before any event"
        );
    }
    assert!(
        precise
            .index()
            .counters()
            .speculated
            .load(Ordering::Relaxed)
            >= 10
    );
}

#[test]
fn llm_d_parameters_load_and_unbuilt_backends_are_refused() {
    let ok = params(
        "{tokenProcessorConfig: {blockSize: 64, hashSeed: '42'}, \
          kvEventsConfig: {zmqEndpoint: 'tcp://0.0.0.0:5557', topicFilter: 'kv@', concurrency: 4, \
          discoverPods: true, podDiscoveryConfig: {socketPort: 5557, podLabelSelector: 'app=vllm'}}, \
          indexerConfig: {kvBlockIndexConfig: {enableMetrics: true, metricsLoggingInterval: 60000000000, \
          inMemoryConfig: {size: 1000}}}}",
    );
    let p = PrecisePrefixCacheProducer::build("p", ok).expect("loads");
    assert_eq!(p.index().block_size(), 64);
    assert_eq!(
        p.kv_events_config().zmq_endpoint.as_deref(),
        Some("tcp://0.0.0.0:5557")
    );
    let p = PrecisePrefixCacheProducer::build(
        "p",
        params("{tokenProcessorConfig: {blockSizeTokens: 5}}"),
    )
    .expect("loads");
    assert_eq!(p.index().block_size(), 5);
    for (yaml, field) in [
        (
            "{indexerConfig: {kvBlockIndexConfig: {redisConfig: {address: 'redis://x'}}}}",
            "redisConfig",
        ),
        ("{speculativeTTL: soon}", "speculativeTTL"),
        ("{kvEventsConfig: {engineType: sglang}}", "engineType"),
    ] {
        let e = PrecisePrefixCacheProducer::build("p", params(yaml))
            .expect_err(yaml)
            .to_string();
        assert!(e.contains(field), "{e}");
    }
    assert!(serde_yaml_ng::from_str::<PrecisePrefixParams>("{bogus: 1}").is_err());
}
