//! `core-metrics-extractor`: queue, running, KV usage, LoRA and cache
//! geometry for each engine (REFERENCE §5), engine chosen per endpoint by
//! label. Data-parallel engines print one series per engine rank: waiting and
//! running are summed, KV usage averaged.

use std::collections::HashMap;

use epp_core::{
    BuildError, CacheGeometry, Endpoint, EndpointMetrics, ExtractError, Extractor, LoraInfo, Plugin,
};
use epp_promtext::{Sample, Selector, SelectorSet};

/// Endpoint labels naming the engine, in order of preference.
pub const ENGINE_LABELS: [&str; 2] = [
    "llm-d.ai/engine-type",
    "inference.networking.k8s.io/engine-type",
];
/// Engine assumed when an endpoint has no engine label.
pub const DEFAULT_ENGINE: &str = "vllm";

/// Metric specs of one engine (each a `family{label="value"}` selector; a
/// comma-free `|` separates alternatives tried in order, for renamed metrics).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EngineConfig {
    /// Engine name (`vllm`, `sglang`, `trtllm-serve`, `triton-tensorrt-llm`, or a new one).
    pub name: String,
    /// Waiting requests.
    #[serde(default)]
    pub queued_requests_spec: Option<String>,
    /// Running requests.
    #[serde(default)]
    pub running_requests_spec: Option<String>,
    /// KV-cache usage in [0, 1].
    #[serde(default)]
    pub kv_usage_spec: Option<String>,
    /// LoRA info series (`running_lora_adapters`, `waiting_lora_adapters`, `max_lora` labels).
    #[serde(default)]
    pub lora_spec: Option<String>,
    /// Cache-config info series with block size and block count labels.
    #[serde(default)]
    pub cache_info_spec: Option<String>,
}

/// Parameters.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CoreMetricsParams {
    /// Per-engine overrides of any spec, or new engines.
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
    cache_labels: (&'static str, &'static str),
}

fn builtin(name: &str) -> Option<EngineConfig> {
    let spec = |s: &str| Some(s.to_owned());
    Some(match name {
        "vllm" => EngineConfig {
            name: name.into(),
            queued_requests_spec: spec("vllm:num_requests_waiting"),
            running_requests_spec: spec("vllm:num_requests_running"),
            kv_usage_spec: spec("vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"),
            lora_spec: spec("vllm:lora_requests_info"),
            cache_info_spec: spec("vllm:cache_config_info"),
        },
        "sglang" => EngineConfig {
            name: name.into(),
            queued_requests_spec: spec("sglang:num_queue_reqs"),
            running_requests_spec: spec("sglang:num_running_reqs"),
            kv_usage_spec: spec("sglang:token_usage"),
            lora_spec: None,
            cache_info_spec: spec("sglang:cache_config_info"),
        },
        "trtllm-serve" => EngineConfig {
            name: name.into(),
            queued_requests_spec: spec("trtllm_num_requests_waiting"),
            running_requests_spec: spec("trtllm_num_requests_running"),
            kv_usage_spec: spec("trtllm_kv_cache_utilization"),
            lora_spec: None,
            cache_info_spec: None,
        },
        "triton-tensorrt-llm" => EngineConfig {
            name: name.into(),
            queued_requests_spec: spec(
                "nv_trt_llm_request_metrics{request_type=\"waiting\"}|nv_trt_llm_request_statistics{request_type=\"waiting\"}",
            ),
            running_requests_spec: spec(
                "nv_trt_llm_request_metrics{request_type=\"scheduled\"}|nv_trt_llm_request_statistics{request_type=\"scheduled\"}",
            ),
            kv_usage_spec: spec(
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}|nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"fraction\"}",
            ),
            lora_spec: None,
            cache_info_spec: None,
        },
        _ => return None,
    })
}

/// Geometry gauges of engines that print them as separate series.
fn geometry_gauges(name: &str) -> &'static [(&'static str, bool)] {
    match name {
        "trtllm-serve" => &[
            ("trtllm_kv_cache_tokens_per_block", true),
            ("trtllm_kv_cache_max_blocks", false),
        ],
        "triton-tensorrt-llm" => &[
            (
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"}",
                true,
            ),
            (
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"}",
                false,
            ),
            (
                "nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"tokens_per\"}",
                true,
            ),
            (
                "nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"max\"}",
                false,
            ),
        ],
        _ => &[],
    }
}

impl Engine {
    fn build(cfg: &EngineConfig, plugin: &str) -> Result<Self, BuildError> {
        let mut selectors = Vec::new();
        let mut roles = Vec::new();
        let mut add = |field: &str,
                       spec: &Option<String>,
                       role: &dyn Fn(u8) -> Role|
         -> Result<(), BuildError> {
            let Some(spec) = spec else { return Ok(()) };
            for (i, alt) in spec.split('|').enumerate() {
                let sel = Selector::parse(alt).map_err(|e| BuildError::InvalidValue {
                    plugin: plugin.into(),
                    field: format!("engineConfigs[{}].{field}", cfg.name),
                    value: spec.clone(),
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
        for (spec, is_block_size) in geometry_gauges(&cfg.name) {
            if let Ok(sel) = Selector::parse(spec) {
                selectors.push(sel);
                roles.push(if *is_block_size {
                    Role::BlockSize
                } else {
                    Role::NumBlocks
                });
            }
        }
        let cache_labels = if cfg.name == "sglang" {
            ("page_size", "num_pages")
        } else {
            ("block_size", "num_gpu_blocks")
        };
        Ok(Self {
            set: SelectorSet::new(selectors),
            roles,
            cache_labels,
        })
    }
}

/// `core-metrics-extractor`.
#[derive(Debug, Clone)]
pub struct CoreMetricsExtractor {
    name: String,
    engines: HashMap<String, Engine>,
}

impl CoreMetricsExtractor {
    /// YAML type.
    pub const TYPE: &'static str = "core-metrics-extractor";

    /// An extractor named `name`.
    ///
    /// # Errors
    /// An unparsable spec in `engineConfigs`.
    pub fn new(name: impl Into<String>, params: &CoreMetricsParams) -> Result<Self, BuildError> {
        let name = name.into();
        let engines = Self::engines(&name, params)?;
        Ok(Self { name, engines })
    }

    /// The extractor with the built-in engine table only.
    #[must_use]
    pub fn builtin(name: impl Into<String>) -> Self {
        let name = name.into();
        // The built-in specs always parse (a unit test holds us to it).
        let engines = Self::engines(&name, &CoreMetricsParams::default()).unwrap_or_default();
        Self { name, engines }
    }

    fn engines(
        name: &str,
        params: &CoreMetricsParams,
    ) -> Result<HashMap<String, Engine>, BuildError> {
        let mut configs: HashMap<String, EngineConfig> =
            ["vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"]
                .into_iter()
                .filter_map(|n| builtin(n).map(|c| (n.to_owned(), c)))
                .collect();
        for over in &params.engine_configs {
            let base = configs
                .entry(over.name.clone())
                .or_insert_with(|| EngineConfig {
                    name: over.name.clone(),
                    ..Default::default()
                });
            for (dst, src) in [
                (&mut base.queued_requests_spec, &over.queued_requests_spec),
                (&mut base.running_requests_spec, &over.running_requests_spec),
                (&mut base.kv_usage_spec, &over.kv_usage_spec),
                (&mut base.lora_spec, &over.lora_spec),
                (&mut base.cache_info_spec, &over.cache_info_spec),
            ] {
                if src.is_some() {
                    dst.clone_from(src);
                }
            }
        }
        configs
            .iter()
            .map(|(n, c)| Engine::build(c, name).map(|e| (n.clone(), e)))
            .collect()
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
    fn extract(
        &self,
        endpoint: &Endpoint,
        page: &str,
        m: &mut EndpointMetrics,
    ) -> Result<(), ExtractError> {
        let engine_name = ENGINE_LABELS
            .iter()
            .find_map(|l| endpoint.label(l))
            .unwrap_or(DEFAULT_ENGINE);
        let engine = self.engines.get(engine_name).ok_or_else(|| {
            ExtractError(format!(
                "unknown engine type {engine_name:?}; add it under engineConfigs"
            ))
        })?;
        let (mut waiting, mut running, mut kv) = (Acc::default(), Acc::default(), Acc::default());
        let mut lora: Option<(f64, LoraInfo)> = None;
        let (mut block_size, mut num_blocks) = (None, None);
        let report = engine.set.scan(page, |i, s| match engine.roles[i] {
            Role::Waiting(a) => waiting.add(a, s.value),
            Role::Running(a) => running.add(a, s.value),
            Role::Kv(a) => kv.add(a, s.value),
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
                    };
                    lora = Some((s.value, info));
                }
            }
            Role::CacheInfo => {
                block_size = block_size.or_else(|| label_u64(s, engine.cache_labels.0));
                num_blocks = num_blocks.or_else(|| label_u64(s, engine.cache_labels.1));
            }
            Role::BlockSize => block_size = block_size.or(Some(s.value as u64)),
            Role::NumBlocks => num_blocks = num_blocks.or(Some(s.value as u64)),
        });
        let (w, r, k) = (waiting.first(), running.first(), kv.first());
        if w.is_none() && r.is_none() && k.is_none() {
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
