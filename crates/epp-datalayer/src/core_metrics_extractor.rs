//! `core-metrics-extractor`: queue, running, KV usage, LoRA and cache
//! geometry for each engine (REFERENCE §5), engine chosen per endpoint by
//! label. Data-parallel engines print one series per engine rank: waiting and
//! running are summed, KV usage averaged.

use std::collections::HashMap;

use epp_core::{
    BuildError, CacheGeometry, Endpoint, EndpointMetrics, ExtractError, Extractor, LoraInfo, Plugin,
};
use epp_promtext::{Sample, Selector, SelectorSet};

/// Endpoint labels naming the engine, in order of preference, when
/// `engineLabelKey` is not set.
pub const ENGINE_LABELS: [&str; 2] = [
    "llm-d.ai/engine-type",
    "inference.networking.k8s.io/engine-type",
];
/// Engine assumed when an endpoint has no engine label (`defaultEngine`).
pub const DEFAULT_ENGINE: &str = "vllm";

/// The metric specs of one engine, as the reference's `engineConfigs`
/// entries spell them. Each spec is a `family{label="value"}` selector
/// (values quoted or bare); an empty or absent spec is not scraped. Ours
/// also accepts `a|b`: alternatives tried in order, for renamed metrics.
///
/// An entry replaces the whole built-in entry of the same name (fields it
/// leaves out are not scraped), as in the reference.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EngineConfig {
    /// Engine name (`vllm`, `sglang`, `trtllm-serve`, `triton-tensorrt-llm`, or a new one).
    pub name: String,
    /// Waiting requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_requests_spec: Option<String>,
    /// Running requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests_spec: Option<String>,
    /// KV-cache usage in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_usage_spec: Option<String>,
    /// LoRA info series (`running_lora_adapters`, `waiting_lora_adapters`, `max_lora` labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_spec: Option<String>,
    /// Cache-config info series whose labels hold block size and block count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_info_spec: Option<String>,
    /// Label of `cacheInfoSpec` holding the block size (default `block_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_block_size_label_name: Option<String>,
    /// Label of `cacheInfoSpec` holding the block count (default `num_gpu_blocks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_num_blocks_label_name: Option<String>,
    /// A gauge whose value is the block size (instead of `cacheInfoSpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_block_size_spec: Option<String>,
    /// A gauge whose value is the block count (instead of `cacheInfoSpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_num_blocks_spec: Option<String>,
}

/// Parameters, named as in the reference.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CoreMetricsParams {
    /// The endpoint label naming the engine. Unset: [`ENGINE_LABELS`], first found.
    #[serde(default)]
    pub engine_label_key: Option<String>,
    /// Engine of endpoints without the label, or with an engine that has no
    /// entry (default [`DEFAULT_ENGINE`]); must name a built-in or configured engine.
    #[serde(default)]
    pub default_engine: Option<String>,
    /// Engines replacing the built-in entry of the same name, or new ones.
    #[serde(default)]
    pub engine_configs: Vec<EngineConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Waiting(u8),
    Running(u8),
    Kv(u8),
    Lora,
    CacheInfo,
    BlockSize,
    NumBlocks,
}

#[derive(Debug, Clone)]
struct Engine {
    set: SelectorSet,
    roles: Vec<Role>,
    /// Labels of the cache-info series holding block size and block count.
    cache_labels: (String, String),
    /// Whether any of queue, running or KV usage is scraped.
    has_core: bool,
}

/// The built-in entry of engine `name` (`vllm`, `sglang`, `trtllm-serve`,
/// `triton-tensorrt-llm`), e.g. to start an `engineConfigs` entry that
/// changes one of its specs.
#[must_use]
pub fn builtin_engine(name: &str) -> Option<EngineConfig> {
    builtins().into_iter().find(|e| e.name == name)
}

fn builtins() -> [EngineConfig; 4] {
    let spec = |s: &str| Some(s.to_owned());
    [
        EngineConfig {
            name: "vllm".into(),
            queued_requests_spec: spec("vllm:num_requests_waiting"),
            running_requests_spec: spec("vllm:num_requests_running"),
            kv_usage_spec: spec("vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"),
            lora_spec: spec("vllm:lora_requests_info"),
            cache_info_spec: spec("vllm:cache_config_info"),
            ..EngineConfig::default()
        },
        EngineConfig {
            name: "sglang".into(),
            queued_requests_spec: spec("sglang:num_queue_reqs"),
            running_requests_spec: spec("sglang:num_running_reqs"),
            kv_usage_spec: spec("sglang:token_usage"),
            cache_info_spec: spec("sglang:cache_config_info"),
            cache_block_size_label_name: spec("page_size"),
            cache_num_blocks_label_name: spec("num_pages"),
            ..EngineConfig::default()
        },
        EngineConfig {
            name: "trtllm-serve".into(),
            queued_requests_spec: spec("trtllm_num_requests_waiting"),
            running_requests_spec: spec("trtllm_num_requests_running"),
            kv_usage_spec: spec("trtllm_kv_cache_utilization"),
            cache_block_size_spec: spec("trtllm_kv_cache_tokens_per_block"),
            cache_num_blocks_spec: spec("trtllm_kv_cache_max_blocks"),
            ..EngineConfig::default()
        },
        EngineConfig {
            name: "triton-tensorrt-llm".into(),
            queued_requests_spec: spec(
                "nv_trt_llm_request_metrics{request_type=\"waiting\"}|nv_trt_llm_request_statistics{request_type=\"waiting\"}",
            ),
            running_requests_spec: spec(
                "nv_trt_llm_request_metrics{request_type=\"scheduled\"}|nv_trt_llm_request_statistics{request_type=\"scheduled\"}",
            ),
            kv_usage_spec: spec(
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}|nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"fraction\"}",
            ),
            cache_block_size_spec: spec(
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"}|nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"tokens_per\"}",
            ),
            cache_num_blocks_spec: spec(
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"}|nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"max\"}",
            ),
            ..EngineConfig::default()
        },
    ]
}

/// Splits `a|b` at the bars outside double quotes.
fn alternatives(spec: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in spec.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '|' if !quoted => {
                out.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&spec[start..]);
    out
}

impl Engine {
    fn build(cfg: &EngineConfig, plugin: &str) -> Result<Self, BuildError> {
        let mut selectors = Vec::new();
        let mut roles = Vec::new();
        let mut add = |field: &str,
                       spec: &Option<String>,
                       role: &dyn Fn(u8) -> Role|
         -> Result<(), BuildError> {
            let Some(spec) = spec.as_deref().filter(|s| !s.trim().is_empty()) else {
                return Ok(());
            };
            for (i, alt) in alternatives(spec).into_iter().enumerate() {
                let sel = Selector::parse(alt).map_err(|e| BuildError::InvalidValue {
                    plugin: plugin.into(),
                    field: format!("engineConfigs[{}].{field}", cfg.name),
                    value: spec.to_owned(),
                    reason: e.to_string(),
                })?;
                selectors.push(sel);
                roles.push(role(u8::try_from(i).unwrap_or(u8::MAX)));
            }
            Ok(())
        };
        add(
            "queuedRequestsSpec",
            &cfg.queued_requests_spec,
            &Role::Waiting,
        )?;
        add(
            "runningRequestsSpec",
            &cfg.running_requests_spec,
            &Role::Running,
        )?;
        add("kvUsageSpec", &cfg.kv_usage_spec, &Role::Kv)?;
        add("loraSpec", &cfg.lora_spec, &|_| Role::Lora)?;
        add("cacheInfoSpec", &cfg.cache_info_spec, &|_| Role::CacheInfo)?;
        add("cacheBlockSizeSpec", &cfg.cache_block_size_spec, &|_| {
            Role::BlockSize
        })?;
        add("cacheNumBlocksSpec", &cfg.cache_num_blocks_spec, &|_| {
            Role::NumBlocks
        })?;
        let label = |name: &Option<String>, default: &str| {
            name.as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(default)
                .to_owned()
        };
        let has_core = roles
            .iter()
            .any(|r| matches!(r, Role::Waiting(_) | Role::Running(_) | Role::Kv(_)));
        Ok(Self {
            set: SelectorSet::new(selectors),
            roles,
            has_core,
            cache_labels: (
                label(&cfg.cache_block_size_label_name, "block_size"),
                label(&cfg.cache_num_blocks_label_name, "num_gpu_blocks"),
            ),
        })
    }
}

/// `core-metrics-extractor`.
#[derive(Debug, Clone)]
pub struct CoreMetricsExtractor {
    name: String,
    engines: HashMap<String, Engine>,
    engine_label_key: Option<String>,
    default_engine: String,
}

impl CoreMetricsExtractor {
    /// YAML type.
    pub const TYPE: &'static str = "core-metrics-extractor";

    /// An extractor named `name`.
    ///
    /// # Errors
    /// An unparsable spec, an entry without a name or named twice, or a
    /// `defaultEngine` that names no engine.
    pub fn new(name: impl Into<String>, params: &CoreMetricsParams) -> Result<Self, BuildError> {
        let name = name.into();
        let bad = |field: String, value: &str, reason: &str| BuildError::InvalidValue {
            plugin: name.clone(),
            field,
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        let mut configs: Vec<EngineConfig> = Vec::new();
        for (i, cfg) in params.engine_configs.iter().enumerate() {
            if cfg.name.trim().is_empty() {
                return Err(bad(
                    format!("engineConfigs[{i}].name"),
                    &cfg.name,
                    "an engine entry needs a name",
                ));
            }
            if configs.iter().any(|c| c.name == cfg.name) {
                return Err(bad(
                    format!("engineConfigs[{i}].name"),
                    &cfg.name,
                    "this engine already has an entry; one entry per engine",
                ));
            }
            configs.push(cfg.clone());
        }
        // Built-in engines the config does not replace.
        for b in builtins() {
            if !configs.iter().any(|c| c.name == b.name) {
                configs.push(b);
            }
        }
        let default_engine = params
            .default_engine
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or(DEFAULT_ENGINE)
            .to_owned();
        if !configs.iter().any(|c| c.name == default_engine) {
            let known: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
            return Err(bad(
                "defaultEngine".into(),
                &default_engine,
                &format!(
                    "not found in engineConfigs or the built-in engines ({})",
                    known.join(", ")
                ),
            ));
        }
        let engines = configs
            .iter()
            .map(|c| Engine::build(c, &name).map(|e| (c.name.clone(), e)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            engines,
            engine_label_key: params.engine_label_key.clone().filter(|k| !k.is_empty()),
            default_engine,
            name,
        })
    }

    /// The extractor with the built-in engine table only.
    #[must_use]
    pub fn builtin(name: impl Into<String>) -> Self {
        let name = name.into();
        // The built-in specs always parse (a unit test holds us to it).
        Self::new(name.clone(), &CoreMetricsParams::default()).unwrap_or_else(|_| Self {
            name,
            engines: HashMap::new(),
            engine_label_key: None,
            default_engine: DEFAULT_ENGINE.to_owned(),
        })
    }

    /// The engine of `endpoint`: its label's engine if configured, else the default.
    fn engine_of<'s>(&'s self, endpoint: &'s Endpoint) -> (&'s str, Option<&'s Engine>) {
        let labelled = match &self.engine_label_key {
            Some(key) => endpoint.label(key),
            None => ENGINE_LABELS.iter().find_map(|l| endpoint.label(l)),
        };
        if let Some(name) = labelled.filter(|n| !n.is_empty())
            && let Some(engine) = self.engines.get(name)
        {
            return (name, Some(engine));
        }
        let name = self.default_engine.as_str();
        (name, self.engines.get(name))
    }
}

impl Plugin for CoreMetricsExtractor {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_extractor(&self) -> Option<&dyn Extractor> {
        Some(self)
    }
}

/// Sum and count per alternative name (at most four).
#[derive(Default)]
struct Acc {
    sum: [f64; 4],
    n: [u32; 4],
}

impl Acc {
    fn add(&mut self, alt: u8, v: f64) {
        let i = usize::from(alt.min(3));
        if v.is_finite() {
            self.sum[i] += v;
            self.n[i] += 1;
        }
    }
    /// (sum, count) of the first alternative seen.
    fn first(&self) -> Option<(f64, u32)> {
        (0..4)
            .find(|&i| self.n[i] > 0)
            .map(|i| (self.sum[i], self.n[i]))
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

fn label_u64(s: &Sample<'_>, name: &str) -> Option<u64> {
    s.label(name)?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| *v >= 0.0 && v.is_finite())
        .map(|v| v as u64)
}

impl Extractor for CoreMetricsExtractor {
    fn custom_metrics(&self) -> Option<&[String]> {
        Some(&[])
    }

    fn extract(
        &self,
        endpoint: &Endpoint,
        page: &str,
        m: &mut EndpointMetrics,
    ) -> Result<(), ExtractError> {
        let (engine_name, engine) = self.engine_of(endpoint);
        let engine = engine
            .ok_or_else(|| ExtractError(format!("no metric specs for engine {engine_name:?}")))?;
        let (mut waiting, mut running, mut kv) = (Acc::default(), Acc::default(), Acc::default());
        let mut lora: Option<(f64, LoraInfo)> = None;
        let (mut block_size, mut num_blocks) = (None, None);
        // The name the server serves its base model under: the model adapters
        // apply to (read from the first core series that names it).
        let mut base_model: Option<String> = None;
        let mut name_base = |s: &Sample<'_>| {
            if base_model.is_none() {
                base_model = s
                    .label("model_name")
                    .filter(|v| !v.is_empty())
                    .map(std::borrow::Cow::into_owned);
            }
        };
        let report = engine.set.scan(page, |i, s| match engine.roles[i] {
            Role::Waiting(a) => {
                name_base(s);
                waiting.add(a, s.value);
            }
            Role::Running(a) => {
                name_base(s);
                running.add(a, s.value);
            }
            Role::Kv(a) => {
                name_base(s);
                kv.add(a, s.value);
            }
            Role::Lora => {
                // The newest series (highest timestamp value) wins.
                if lora.as_ref().is_none_or(|(t, _)| s.value > *t) {
                    let info = LoraInfo {
                        active: s
                            .label("running_lora_adapters")
                            .map(|v| split_list(&v))
                            .unwrap_or_default(),
                        waiting: s
                            .label("waiting_lora_adapters")
                            .map(|v| split_list(&v))
                            .unwrap_or_default(),
                        max_loras: label_u64(s, "max_lora")
                            .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
                        base_model: None,
                    };
                    lora = Some((s.value, info));
                }
            }
            Role::CacheInfo => {
                block_size = block_size.or_else(|| label_u64(s, &engine.cache_labels.0));
                num_blocks = num_blocks.or_else(|| label_u64(s, &engine.cache_labels.1));
            }
            Role::BlockSize => block_size = block_size.or(Some(s.value as u64)),
            Role::NumBlocks => num_blocks = num_blocks.or(Some(s.value as u64)),
        });
        let (w, r, k) = (waiting.first(), running.first(), kv.first());
        if engine.has_core && w.is_none() && r.is_none() && k.is_none() {
            let why = report.first_error.map_or_else(
                || format!("the page has none of the {engine_name} queue, running or KV-cache metrics"),
                |e| format!("the page has none of the {engine_name} core metrics (first malformed line: {e})"),
            );
            return Err(ExtractError(why));
        }
        let clamp_u32 = |v: f64| {
            if v <= 0.0 {
                0
            } else {
                v.min(f64::from(u32::MAX)) as u32
            }
        };
        m.waiting = w.map_or(0, |(s, _)| clamp_u32(s));
        m.running = r.map_or(0, |(s, _)| clamp_u32(s));
        m.kv_usage = k.map_or(0.0, |(s, n)| (s / f64::from(n)).clamp(0.0, 1.0));
        if let Some((_, info)) = lora {
            m.lora = info;
        }
        m.lora.base_model = base_model;
        if let (Some(bs), Some(nb)) = (block_size, num_blocks)
            && bs > 0
        {
            m.cache = Some(CacheGeometry {
                block_size_tokens: u32::try_from(bs).unwrap_or(u32::MAX),
                num_blocks: nb,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
