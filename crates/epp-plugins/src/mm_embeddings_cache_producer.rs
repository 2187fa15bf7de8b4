//! `mm-embeddings-cache-producer` (llm-d's): which endpoints recently
//! encoded the request's images, audio or video, so a scorer can send the
//! request where the encoder cache already holds them.
//!
//! ```text
//! items(request) = the distinct media references of the prompt
//! for each endpoint e:  matched(e) = |items ∩ LRU(e)|
//! after the pick: the items are recorded in the primary target's LRU,
//!   LRU capacity = cacheSizeInMBPerServer / 2 entries (llm-d assumes 2 MiB
//!   per encoded item; default 4096 MiB → 2048 entries)
//! ```
//!
//! Items: as in llm-d, the content hashes the model server's renderer
//! reported for the prompt (`token-producer` with a `vllm` backend renders it
//! before scheduling: [`InferenceRequest::media_items`]), so the same image
//! at two URLs is one item. Without a render, the media references the
//! request parser writes into the prompt (`<image_url:…>`,
//! `<input_audio:…>`, … — the URL or the inline data), hashed: the same
//! image at the same URL (or inline) is the same item; at two URLs, two.
//! An endpoint that leaves
//! the pool (or comes back as a new endpoint) starts empty; llm-d's configs
//! list this producer as an extractor of `endpoint-notification-source` to
//! hear of deletions, which loads here and needs nothing delivered.
//!
//! Metrics (llm-d's names): `llm_d_epp_encoder_cache_queries_total{plugin_type,
//! plugin_name, modality}` (one per item of each request),
//! `llm_d_epp_encoder_cache_hits_total{plugin_type, plugin_name, pod,
//! modality}` (one per item and endpoint that holds it, `pod` = the
//! endpoint's name) and `llm_d_epp_encoder_cache_hit_ratio{plugin_type,
//! plugin_name}` (per request and candidate, matched / items, buckets 0, 0.1,
//! …, 1). Modality: `image` (`image_url`, `input_image`, `image`), `audio`
//! (`input_audio`, `audio_url`), `video` (`video_url`), `file` (`document`,
//! `input_file`).

use std::{
    collections::{HashMap, VecDeque},
    hash::{Hash, Hasher},
    sync::{Arc, Weak},
};

use epp_core::{
    BuildError, Candidate, CycleContext, DataProducer, Endpoint, InferenceRequest, MetricFamily,
    MetricSink, Plugin, PluginMetrics, PreRequest, SchedulingResult,
};
use parking_lot::Mutex;

use crate::Builtin;

/// llm-d's assumed size of one encoded item.
const MIB_PER_ITEM: i64 = 2;
/// llm-d's default budget.
const DEFAULT_MIB: i64 = 4096;

/// The media parts the request parser writes into the prompt as
/// `<kind:reference>` (see docs/api-parsing.md), with their modality (an
/// index into [`MODALITIES`]).
const MEDIA_KINDS: [(&str, usize); 8] = [
    ("image_url", 0),
    ("input_image", 0),
    ("video_url", 2),
    ("input_audio", 1),
    ("image", 0),
    ("document", 3),
    ("audio_url", 1),
    ("input_file", 3),
];

/// The `modality` label values.
const MODALITIES: [&str; 4] = ["image", "audio", "video", "file"];

/// Upper bounds of the hit-ratio histogram's buckets (llm-d's), then +Inf.
const RATIO_BOUNDS: [f64; 12] = [
    0.0,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
    f64::MAX,
];

const QUERIES: MetricFamily = MetricFamily {
    name: "llm_d_epp_encoder_cache_queries",
    help: "Total number of multimodal item hash lookups made against the encoder-cache affinity LRU",
};
const HITS: MetricFamily = MetricFamily {
    name: "llm_d_epp_encoder_cache_hits",
    help: "Total number of multimodal item hash lookups that found a match in the encoder-cache \
           affinity LRU, by endpoint",
};
const HIT_RATIO: MetricFamily = MetricFamily {
    name: "llm_d_epp_encoder_cache_hit_ratio",
    help: "Ratio of matched multimodal items to total items per endpoint in an encoder-cache lookup",
};

/// What the producer counts across requests.
#[derive(Debug, Default)]
struct Stats {
    queries: [u64; MODALITIES.len()],
    ratio_buckets: [u64; RATIO_BOUNDS.len()],
    ratio_sum: f64,
    ratio_count: u64,
}

impl Stats {
    fn observe_ratio(&mut self, ratio: f64) {
        let b = RATIO_BOUNDS
            .iter()
            .position(|&bound| ratio <= bound)
            .unwrap_or(RATIO_BOUNDS.len() - 1);
        self.ratio_buckets[b] += 1;
        self.ratio_sum += ratio;
        self.ratio_count += 1;
    }
}

/// Parameters of `mm-embeddings-cache-producer` (llm-d's names).
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MmEmbeddingsParams {
    /// Each endpoint's encoder-cache budget in MiB (≤ 0: 4096).
    #[serde(default, rename = "cacheSizeInMBPerServer")]
    pub cache_size_in_mb_per_server: i64,
    /// The spelling of llm-d's shipped `epp-mm-embeddings-cache-config.yaml`
    /// (llm-d's decoder ignores it, so that file runs with the default);
    /// here it sets the budget when `cacheSizeInMBPerServer` is not given.
    #[serde(default, rename = "cacheSizeInMB")]
    pub cache_size_in_mb: i64,
}

/// One endpoint's recently encoded items, least recently used first.
#[derive(Debug, Default)]
struct Lru {
    endpoint: Weak<Endpoint>,
    /// The endpoint's name (the `pod` label of its hits).
    name: String,
    last_use: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    clock: u64,
    /// Request items found here, by modality.
    hits: [u64; MODALITIES.len()],
}

impl Lru {
    fn touch(&mut self, item: u64, capacity: usize) {
        self.clock += 1;
        self.last_use.insert(item, self.clock);
        self.order.push_back((item, self.clock));
        while self.last_use.len() > capacity {
            let Some((old, at)) = self.order.pop_front() else {
                break;
            };
            if self.last_use.get(&old) == Some(&at) {
                self.last_use.remove(&old);
            }
        }
        if self.order.len() > 2 * capacity + 16 {
            let live = &self.last_use;
            self.order.retain(|(i, at)| live.get(i) == Some(at));
        }
    }
}

/// `mm-embeddings-cache-producer`: see the module docs.
#[derive(Debug)]
pub struct MmEmbeddingsCacheProducer {
    name: String,
    capacity: usize,
    lrus: Mutex<Vec<Lru>>,
    stats: Mutex<Stats>,
}

impl Builtin for MmEmbeddingsCacheProducer {
    const TYPE: &'static str = "mm-embeddings-cache-producer";
    type Params = MmEmbeddingsParams;

    /// # Errors
    /// None: a budget ≤ 0 means the default, as in llm-d.
    fn build(name: impl Into<String>, p: MmEmbeddingsParams) -> Result<Self, BuildError> {
        let mib = [
            p.cache_size_in_mb_per_server,
            p.cache_size_in_mb,
            DEFAULT_MIB,
        ]
        .into_iter()
        .find(|&m| m > 0)
        .unwrap_or(DEFAULT_MIB);
        Ok(Self {
            name: name.into(),
            capacity: usize::try_from((mib / MIB_PER_ITEM).max(1)).unwrap_or(usize::MAX),
            lrus: Mutex::new(Vec::new()),
            stats: Mutex::new(Stats::default()),
        })
    }
}

fn item_hash(reference: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    reference.hash(&mut h);
    h.finish()
}

/// The distinct media items of `request` into `out` (cleared first), and
/// each one's modality (an index into [`MODALITIES`]) into `modalities`:
/// the rendered items when the server rendered the prompt, else the
/// references in the prompt.
pub(crate) fn request_items(
    request: &InferenceRequest,
    out: &mut Vec<u64>,
    modalities: &mut Vec<usize>,
) {
    if request.media_items.is_empty() {
        return media_items(&request.prompt, out, modalities);
    }
    out.clear();
    modalities.clear();
    for m in &request.media_items {
        let item = item_hash(&m.hash);
        if !out.contains(&item) {
            out.push(item);
            // A modality this picker does not name counts as a file.
            let modality = MODALITIES.iter().position(|k| *k == m.modality);
            modalities.push(modality.unwrap_or(MODALITIES.len() - 1));
        }
    }
}

/// The distinct media references of `prompt` into `out` (cleared first),
/// and each one's modality (an index into [`MODALITIES`]) into `modalities`.
pub(crate) fn media_items(prompt: &str, out: &mut Vec<u64>, modalities: &mut Vec<usize>) {
    out.clear();
    modalities.clear();
    let mut rest = prompt;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let Some((kind, after)) = rest.split_once(':') else {
            break;
        };
        let Some(&(_, modality)) = MEDIA_KINDS.iter().find(|(k, _)| *k == kind) else {
            continue;
        };
        let Some(end) = after.find('>') else {
            break;
        };
        let item = item_hash(&after[..end]);
        if !out.contains(&item) {
            out.push(item);
            modalities.push(modality);
        }
        rest = &after[end + 1..];
    }
}

impl MmEmbeddingsCacheProducer {
    /// Entries remembered per endpoint.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Plugin for MmEmbeddingsCacheProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        Some(self)
    }
    fn follows_endpoint_lifecycle(&self) -> bool {
        true
    }
}

impl PluginMetrics for MmEmbeddingsCacheProducer {
    fn report(&self, out: &mut dyn MetricSink) {
        let plugin = [("plugin_type", Self::TYPE), ("plugin_name", &*self.name)];
        {
            let stats = self.stats.lock();
            for (modality, &n) in MODALITIES.iter().zip(&stats.queries) {
                if n > 0 {
                    let [t, p] = plugin;
                    out.counter(QUERIES, &[t, p, ("modality", modality)], n);
                }
            }
            if stats.ratio_count > 0 {
                let buckets: Vec<(f64, u64)> = RATIO_BOUNDS
                    .iter()
                    .copied()
                    .zip(stats.ratio_buckets.iter().copied())
                    .collect();
                out.histogram(
                    HIT_RATIO,
                    &plugin,
                    &buckets,
                    stats.ratio_sum,
                    stats.ratio_count,
                );
            }
        }
        let lrus = self.lrus.lock();
        for lru in lrus.iter().filter(|l| l.endpoint.strong_count() > 0) {
            for (modality, &n) in MODALITIES.iter().zip(&lru.hits) {
                if n > 0 {
                    let [t, p] = plugin;
                    out.counter(HITS, &[t, p, ("pod", &lru.name), ("modality", modality)], n);
                }
            }
        }
    }
}

impl DataProducer for MmEmbeddingsCacheProducer {
    fn produce(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) {
        let mm = &mut cx.state.multimodal;
        let mut modalities = Vec::new();
        request_items(cx.request, &mut mm.items, &mut modalities);
        if mm.items.is_empty() {
            return;
        }
        let mut lrus = self.lrus.lock();
        // llm-d's counts: every item looked up, and each endpoint holding it.
        for lru in lrus.iter_mut().filter(|l| l.endpoint.strong_count() > 0) {
            for (item, &m) in mm.items.iter().zip(&modalities) {
                if lru.last_use.contains_key(item) {
                    lru.hits[m] += 1;
                }
            }
        }
        let mut stats = self.stats.lock();
        for &m in &modalities {
            stats.queries[m] += 1;
        }
        for c in candidates {
            let Some(lru) = lrus.get(c.id().index()) else {
                continue;
            };
            if !std::ptr::eq(lru.endpoint.as_ptr(), Arc::as_ptr(&c.endpoint)) {
                continue;
            }
            let n = mm
                .items
                .iter()
                .filter(|i| lru.last_use.contains_key(i))
                .count();
            mm.set_matched(c.id(), u32::try_from(n).unwrap_or(u32::MAX));
        }
        // A candidate this producer has never recorded matched nothing.
        for c in candidates {
            stats.observe_ratio(f64::from(mm.matched(c.id())) / mm.items.len() as f64);
        }
    }
}

impl PreRequest for MmEmbeddingsCacheProducer {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        let items = &cx.state.multimodal.items;
        let Some(target) = result.primary() else {
            return;
        };
        if items.is_empty() {
            return;
        }
        let mut lrus = self.lrus.lock();
        let i = target.id().index();
        if lrus.len() <= i {
            lrus.resize_with(i + 1, Lru::default);
        }
        let lru = &mut lrus[i];
        if !std::ptr::eq(lru.endpoint.as_ptr(), Arc::as_ptr(target)) {
            // A new endpoint under this id: it has encoded nothing yet.
            *lru = Lru {
                endpoint: Arc::downgrade(target),
                name: target.name().to_owned(),
                ..Lru::default()
            };
        }
        for &item in items {
            lru.touch(item, self.capacity);
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest, ProfilePicks};

    use super::*;
    use crate::{
        test_sink::Sink,
        testing::{candidates, with_cx},
    };

    fn producer(yaml: &str) -> MmEmbeddingsCacheProducer {
        MmEmbeddingsCacheProducer::build("p", serde_yaml_ng::from_str(yaml).unwrap()).unwrap()
    }

    #[test]
    fn items_are_the_distinct_media_references() {
        let (mut out, mut modalities) = (Vec::new(), Vec::new());
        media_items(
            "user:\n<image_url:http://x/a.png>\n<image_url:http://x/b.png>\nsee <b> and \
             <image_url:http://x/a.png><input_audio:data:abc>\n",
            &mut out,
            &mut modalities,
        );
        assert_eq!(out.len(), 3, "a, b, the audio; <b> is text");
        assert_eq!(modalities, [0, 0, 1], "image, image, audio");
        media_items("no media <here:x>", &mut out, &mut modalities);
        assert!(out.is_empty() && modalities.is_empty());
    }

    #[test]
    fn the_servers_content_hashes_win_over_the_references() {
        let item = |m: &str, h: &str| epp_core::MediaItem {
            modality: m.into(),
            hash: h.into(),
            placeholder: None,
        };
        // Two URLs of one image: one item by its content hash.
        let mut req = InferenceRequest::builder("m")
            .prompt("<image_url:http://a/x.png><image_url:http://b/x.png><input_audio:z>")
            .build();
        req.media_items = vec![
            item("image", "h1"),
            item("image", "h1"),
            item("audio", "h2"),
        ];
        let (mut out, mut modalities) = (Vec::new(), Vec::new());
        request_items(&req, &mut out, &mut modalities);
        assert_eq!((out.len(), &modalities), (2, &vec![0, 1]));
        req.media_items = vec![item("3d-mesh", "h3")];
        request_items(&req, &mut out, &mut modalities);
        assert_eq!(modalities, vec![3], "an unknown modality counts as a file");
        // Not rendered: the three references.
        req.media_items.clear();
        request_items(&req, &mut out, &mut modalities);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn the_budget_is_llm_ds_2_mib_per_item() {
        assert_eq!(producer("{}").capacity(), 2048);
        assert_eq!(producer("{cacheSizeInMBPerServer: 10}").capacity(), 5);
        assert_eq!(producer("{cacheSizeInMBPerServer: -1}").capacity(), 2048);
        assert_eq!(producer("{cacheSizeInMB: 2048}").capacity(), 1024);
        assert!(serde_yaml_ng::from_str::<MmEmbeddingsParams>("{cacheSize: 1}").is_err());
    }

    /// Matches of `prompt` over `c` after the picks recorded so far.
    fn matches(p: &MmEmbeddingsCacheProducer, c: &[Candidate], prompt: &str) -> Vec<u32> {
        let req = InferenceRequest::builder("m").prompt(prompt).build();
        with_cx(&req, 0, |cx| {
            p.produce(cx, c);
            c.iter()
                .map(|x| cx.state.multimodal.matched(x.id()))
                .collect()
        })
    }

    fn pick(p: &MmEmbeddingsCacheProducer, c: &Candidate, prompt: &str) {
        let req = InferenceRequest::builder("m").prompt(prompt).build();
        with_cx(&req, 0, |cx| {
            p.produce(cx, std::slice::from_ref(c));
            let result = SchedulingResult {
                runs: vec![ProfilePicks {
                    targets: vec![Arc::clone(&c.endpoint)],
                    scores: vec![1.0],
                    ..ProfilePicks::default()
                }],
                ..SchedulingResult::default()
            };
            p.pre_request(cx, &result);
        });
    }

    #[test]
    fn the_target_remembers_what_it_encoded_up_to_its_capacity() {
        let p = producer("{cacheSizeInMBPerServer: 4}"); // 2 entries
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        pick(&p, &c[1], "<image_url:a><image_url:b>");
        assert_eq!(matches(&p, &c, "<image_url:a><image_url:c>"), vec![0, 1]);
        assert_eq!(matches(&p, &c, "<image_url:b><image_url:a>"), vec![0, 2]);
        // c evicts the least recently used (a).
        pick(&p, &c[1], "<image_url:c>");
        assert_eq!(
            matches(&p, &c, "<image_url:a><image_url:b><image_url:c>"),
            vec![0, 2]
        );
        assert_eq!(matches(&p, &c, "<image_url:a>"), vec![0, 0]);
        // A request without media matches nothing and records nothing.
        assert_eq!(matches(&p, &c, "text only"), vec![0, 0]);
    }

    #[test]
    fn counts_lookups_hits_per_endpoint_and_hit_ratios_as_llm_d() {
        let p = producer("{}");
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        pick(&p, &c[1], "<image_url:a><input_audio:b>");
        // 2 items looked up (+ 2 by the pick's own produce); c[1] holds both.
        assert_eq!(matches(&p, &c, "<image_url:a><input_audio:b>"), vec![0, 2]);
        let mut sink = Sink::default();
        p.report(&mut sink);
        let plugin = ["mm-embeddings-cache-producer", "p"];
        let get = |sink: &Sink, family: &MetricFamily, rest: &[&str]| {
            let labels: Vec<&str> = plugin.iter().chain(rest).copied().collect();
            sink.get(family.name, &labels)
        };
        assert_eq!(get(&sink, &QUERIES, &["image"]), Some(2.0));
        assert_eq!(get(&sink, &QUERIES, &["audio"]), Some(2.0));
        let pod = c[1].endpoint.name();
        assert_eq!(get(&sink, &HITS, &[pod, "image"]), Some(1.0));
        assert_eq!(get(&sink, &HITS, &[pod, "audio"]), Some(1.0));
        assert_eq!(get(&sink, &HITS, &[c[0].endpoint.name()]), None);
        // Ratios observed: the pick's produce (c[1]: 0), then c[0] 0 and c[1] 1.
        assert_eq!(get(&sink, &HIT_RATIO, &[]), Some(3.0));
        let stats = p.stats.lock();
        assert_eq!((stats.ratio_buckets[0], stats.ratio_buckets[10]), (2, 1));
        assert!((stats.ratio_sum - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_replaced_endpoint_starts_empty() {
        let p = producer("{}");
        let c = candidates(vec![EndpointMetrics::default(); 1]);
        pick(&p, &c[0], "<image_url:a>");
        // The same id, a new endpoint.
        let fresh = candidates(vec![EndpointMetrics::default(); 1]);
        assert_eq!(matches(&p, &fresh, "<image_url:a>"), vec![0]);
        assert_eq!(matches(&p, &c, "<image_url:a>"), vec![1]);
    }
}
