//! The `EndpointPickerConfig` file: schema, defaults, strict validation with
//! file:line:column errors, and building the scheduler from it.
//!
//! Three phases: the raw serde structs (unknown keys rejected), validation
//! and defaulting against a [`Registry`] (every plugin is built, every
//! reference resolved), and the [`BuiltConfig`] the binary runs.
//!
//! ```
//! use epp_core::{Registry, SingleProfileHandler, config::EndpointPickerConfig};
//!
//! let text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\n\
//!             kind: EndpointPickerConfig\n\
//!             plugins:\n\
//!             - type: no-such-scorer\n";
//! let err = EndpointPickerConfig::parse(text, "epp.yaml")
//!     .unwrap()
//!     .build(&Registry::new())
//!     .unwrap_err();
//! assert_eq!(err.to_string(), "epp.yaml:4:3: plugins[0].type: unknown plugin type \"no-such-scorer\"");
//! ```

mod flow;
mod locate;
mod objectives;
mod prefix;
mod raw;

use std::{collections::HashMap, fmt, sync::Arc};

use locate::Locations;
pub use objectives::{
    ModelMatchDecl, ModelNameMatch, ModelRewriteDecl, ModelRewriteRules, ObjectiveDecl,
    RewriteRuleDecl, RewriteTargetDecl,
};
use raw::{DataLayerDecl, RawConfig};
pub use raw::{
    FlowControlConfig, PluginDecl, PluginRefDecl, PriorityBandDecl, ProfileDecl, ProfilePluginDecl,
    SourceDecl,
};

use crate::{
    BuildError, Plugin, PluginRef, PluginSpec, Registry, Scheduler, SchedulingProfile,
    SingleProfileHandler,
};

/// API versions accepted (the reference's and llm-d's).
pub const API_VERSIONS: [&str; 2] = [
    "inference.networking.x-k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
];
/// Feature gates this picker knows. `enableLegacyMetrics` (the reference's
/// switch back to its older metrics polling) is accepted and changes nothing:
/// this picker has one metrics path, which reads the same metrics either way.
pub const FEATURE_GATES: [&str; 4] = [
    "flowControl",
    "prepareDataPlugins",
    "dataLayer",
    "enableLegacyMetrics",
];

/// The config used when none is given: the reference picker's default.
pub const DEFAULT_CONFIG: &str = "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
";

/// A config error: where (file, line, column), which field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// File name (or `--config-text`).
    pub origin: String,
    /// 1-based line, 0 when unknown.
    pub line: usize,
    /// 1-based column, 0 when unknown.
    pub column: usize,
    /// Field path, e.g. `schedulingProfiles[0].plugins[1].pluginRef`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.origin, self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A parsed, not yet built, config.
#[derive(Debug)]
pub struct EndpointPickerConfig {
    origin: String,
    raw: RawConfig,
    locations: Locations,
}

/// One metrics source with its extractors, for the data layer.
#[derive(Debug, Clone)]
pub struct SourceWiring {
    /// The source plugin (implements [`crate::MetricsSource`]).
    pub source: PluginRef,
    /// Its extractors (each implements [`crate::Extractor`]).
    pub extractors: Vec<PluginRef>,
}

/// Everything a config defines, built.
#[derive(Debug)]
pub struct BuiltConfig {
    /// The scheduler, with hooks and the saturation detector wired.
    pub scheduler: Scheduler,
    /// Every plugin instance by name, in declaration order.
    pub plugins: Vec<(String, PluginRef)>,
    /// Metrics sources and extractors for the data layer.
    pub data_layer: Vec<SourceWiring>,
    /// Enabled feature gates.
    pub feature_gates: Vec<String>,
    /// Flow-control settings, when given.
    pub flow_control: Option<FlowControlConfig>,
    /// Objective name (`x-gateway-inference-objective`) → priority.
    pub objectives: HashMap<String, i32>,
    /// Model rewrite rules (empty when none are declared).
    pub model_rewrites: ModelRewriteRules,
    /// The effective config with every default filled in, as YAML.
    pub effective_yaml: String,
}

impl EndpointPickerConfig {
    /// Parses `text`; `origin` names it in errors.
    ///
    /// # Errors
    /// Syntax errors, unknown keys, wrong types, each with line and column.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| {
                let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
                let message = e.to_string();
                // serde_yaml_ng prefixes the path: "plugins[0]: unknown field ...".
                let (field, message) = match message.split_once(": ") {
                    Some((f, m)) if !f.contains(' ') => (f.to_owned(), m.to_owned()),
                    _ => (String::new(), message),
                };
                let message = message
                    .split(" at line ")
                    .next()
                    .unwrap_or(&message)
                    .to_owned();
                ConfigError {
                    origin: origin.to_owned(),
                    line,
                    column,
                    field,
                    message,
                }
            })?
        };
        Ok(Self {
            origin: origin.to_owned(),
            raw,
            locations: Locations::scan(text),
        })
    }

    /// The built-in default config.
    #[must_use]
    pub fn default_config() -> Self {
        match Self::parse(DEFAULT_CONFIG, "<default config>") {
            Ok(c) => c,
            Err(_) => Self {
                origin: "<default config>".into(),
                raw: RawConfig::default(),
                locations: Locations::default(),
            },
        }
    }

    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        let field = field.into();
        let (line, column) = self.locations.find(&field).unwrap_or((0, 0));
        ConfigError {
            origin: self.origin.clone(),
            line,
            column,
            field,
            message: message.into(),
        }
    }

    /// Validates against `registry` and builds every plugin and the scheduler.
    ///
    /// # Errors
    /// The first problem found, with its location.
    pub fn build(&self, registry: &Registry) -> Result<BuiltConfig, ConfigError> {
        let raw = &self.raw;
        if let Some(v) = &raw.api_version
            && !API_VERSIONS.contains(&v.as_str())
        {
            return Err(self.err(
                "apiVersion",
                format!("unsupported apiVersion {v:?}, expected one of {API_VERSIONS:?}"),
            ));
        }
        if let Some(k) = &raw.kind
            && k != "EndpointPickerConfig"
        {
            return Err(self.err(
                "kind",
                format!("kind must be EndpointPickerConfig, not {k:?}"),
            ));
        }
        for (i, gate) in raw.feature_gates.iter().enumerate() {
            if !FEATURE_GATES.contains(&gate.as_str()) {
                return Err(self.err(
                    format!("featureGates[{i}]"),
                    format!("unknown feature gate {gate:?}, known: {FEATURE_GATES:?}"),
                ));
            }
        }

        let objectives = objectives::build_objectives(&raw.objectives)
            .map_err(|(field, message)| self.err(field, message))?;
        let model_rewrites = ModelRewriteRules::build(&raw.model_rewrites)
            .map_err(|(field, message)| self.err(field, message))?;

        // Phase 1: every declared plugin, by name.
        let mut decls = raw.plugins.clone();
        let mut plugins: Vec<(String, PluginRef)> = Vec::new();

        for (i, d) in decls.iter_mut().enumerate() {
            let name = d.name.clone().unwrap_or_else(|| d.type_name.clone());
            d.name = Some(name.clone());
            if plugins.iter().any(|(n, _)| *n == name) {
                let field = if raw.plugins[i].name.is_some() {
                    "name"
                } else {
                    "type"
                };
                return Err(self.err(
                    format!("plugins[{i}].{field}"),
                    format!("duplicate plugin name {name:?}"),
                ));
            }
            let spec = PluginSpec {
                type_name: d.type_name.clone(),
                name: name.clone(),
                parameters: d.parameters.clone().unwrap_or(serde_yaml_ng::Value::Null),
            };
            let plugin = registry.build(&spec).map_err(|e| {
                let field = match &e {
                    BuildError::UnknownType { .. } => format!("plugins[{i}].type"),
                    BuildError::InvalidValue { field, .. } => {
                        format!("plugins[{i}].parameters.{field}")
                    }
                    _ => format!("plugins[{i}].parameters"),
                };
                let message = match &e {
                    BuildError::Parameters { reason, .. } => {
                        format!("bad parameters for {:?}: {reason}", d.type_name)
                    }
                    BuildError::InvalidValue { value, reason, .. } => format!("{value}: {reason}"),
                    other => other.to_string(),
                };
                self.err(field, message)
            })?;
            plugins.push((name, PluginRef::new(plugin)));
        }

        let mut effective = raw.clone();
        effective.plugins = decls;

        // Phase 1b: every prefix-match reader gets its producer.
        let prefix_source = self.wire_prefix_matches(registry, &mut plugins, &mut effective)?;

        // Phase 2: the profile handler (one at most; single by default).
        let handlers: Vec<usize> = (0..plugins.len())
            .filter(|&i| plugins[i].1.plugin().as_profile_handler().is_some())
            .collect();
        if handlers.len() > 1 {
            return Err(self.err(
                format!("plugins[{}]", handlers[1]),
                "only one profile handler may be declared",
            ));
        }
        let handler: Arc<dyn Plugin> = match handlers.first() {
            Some(&i) => Arc::clone(&plugins[i].1.0),
            None => Arc::new(SingleProfileHandler::default()),
        };
        if handlers.is_empty() {
            effective
                .plugins
                .push(PluginDecl::new(SingleProfileHandler::TYPE));
        }

        // Phase 3: profiles.
        let profile_decls = if raw.scheduling_profiles.is_empty() {
            // One profile holding every filter, scorer and picker declared.
            let plugins_in_default = plugins
                .iter()
                .filter(|(_, p)| {
                    let p = p.plugin();
                    p.as_filter().is_some() || p.as_scorer().is_some() || p.as_picker().is_some()
                })
                .filter(|(_, p)| p.plugin().as_saturation_detector().is_none())
                .map(|(n, _)| ProfilePluginDecl {
                    plugin_ref: n.clone(),
                    weight: None,
                })
                .collect();
            vec![ProfileDecl {
                name: "default".into(),
                plugins: plugins_in_default,
            }]
        } else {
            raw.scheduling_profiles.clone()
        };
        if handler.type_name() == SingleProfileHandler::TYPE && profile_decls.len() > 1 {
            return Err(self.err(
                "schedulingProfiles[1]",
                format!(
                    "{} runs one profile, but {} are declared",
                    SingleProfileHandler::TYPE,
                    profile_decls.len()
                ),
            ));
        }
        let mut profiles = Vec::new();
        let mut seen_profiles = HashMap::new();
        for (pi, pd) in profile_decls.iter().enumerate() {
            if seen_profiles.insert(pd.name.clone(), pi).is_some() {
                return Err(self.err(
                    format!("schedulingProfiles[{pi}].name"),
                    format!("duplicate profile name {:?}", pd.name),
                ));
            }
            let mut profile = SchedulingProfile::new(&pd.name);
            let mut has_picker = false;
            for (ri, r) in pd.plugins.iter().enumerate() {
                let field = format!("schedulingProfiles[{pi}].plugins[{ri}]");
                let plugin = find_plugin(&plugins, &r.plugin_ref).ok_or_else(|| {
                    self.err(
                        format!("{field}.pluginRef"),
                        format!("no plugin named {:?} is declared", r.plugin_ref),
                    )
                })?;
                let p = plugin.plugin();
                if p.as_picker().is_some() {
                    if has_picker {
                        return Err(
                            self.err(format!("{field}.pluginRef"), "a profile has one picker")
                        );
                    }
                    has_picker = true;
                    profile = profile.with_picker(plugin);
                } else if p.as_scorer().is_some() {
                    let weight = r.weight.unwrap_or(1.0);
                    if !weight.is_finite() || weight < 0.0 {
                        return Err(self.err(
                            format!("{field}.weight"),
                            format!("weight {weight} must be a finite number >= 0"),
                        ));
                    }
                    profile = profile.with_scorer(plugin, weight);
                } else if p.as_filter().is_some() {
                    profile = profile.with_filter(plugin);
                } else if p.as_data_producer().is_some() {
                    // Producers run once per request for every profile; some
                    // configs list them in a profile too, which means the same.
                } else {
                    return Err(self.err(
                        format!("{field}.pluginRef"),
                        format!(
                            "plugin {:?} ({}) is not a filter, scorer or picker",
                            r.plugin_ref,
                            p.type_name()
                        ),
                    ));
                }
            }
            if !has_picker {
                let name = "max-score-picker";
                let picker = match find_plugin(&plugins, name) {
                    Some(p) if p.plugin().as_picker().is_some() => p,
                    _ => {
                        let built = registry.build(&PluginSpec::new(name)).map_err(|e| self.err(format!("schedulingProfiles[{pi}]"), format!("the profile has no picker and the default one cannot be built: {e}")))?;
                        let p = PluginRef::new(built);
                        if find_plugin(&plugins, name).is_none() {
                            plugins.push((name.to_owned(), p.clone()));
                            effective.plugins.push(PluginDecl::new(name));
                        }
                        p
                    }
                };
                profile = profile.with_picker(picker);
            }
            profiles.push(profile);
        }
        effective.scheduling_profiles = profile_decls
            .iter()
            .map(|pd| ProfileDecl {
                name: pd.name.clone(),
                plugins: pd
                    .plugins
                    .iter()
                    .map(|r| ProfilePluginDecl {
                        plugin_ref: r.plugin_ref.clone(),
                        weight: r.weight.or_else(|| {
                            find_plugin(&plugins, &r.plugin_ref)
                                .filter(|p| {
                                    p.plugin().as_picker().is_none()
                                        && p.plugin().as_scorer().is_some()
                                })
                                .map(|_| 1.0)
                        }),
                    })
                    .collect(),
            })
            .collect();

        let mut scheduler = Scheduler::new(profiles, handler)
            .map_err(|e| self.err("schedulingProfiles", e.to_string()))?;

        if let Some(fc) = &raw.flow_control {
            self.check_flow_control(fc, &plugins)?;
        }

        // Phase 4: saturation detector (utilization-detector by default).
        // llm-d moved it under `flowControl`; that one wins when both are set.
        let detector_ref = match raw
            .flow_control
            .as_ref()
            .and_then(|f| f.saturation_detector.as_ref())
        {
            Some(r) => Some((r, "flowControl.saturationDetector.pluginRef")),
            None => raw
                .saturation_detector
                .as_ref()
                .map(|r| (r, "saturationDetector.pluginRef")),
        };
        let detector = match detector_ref {
            Some((r, field)) => {
                let p = find_plugin(&plugins, &r.plugin_ref).ok_or_else(|| {
                    self.err(
                        field,
                        format!("no plugin named {:?} is declared", r.plugin_ref),
                    )
                })?;
                if p.plugin().as_saturation_detector().is_none() {
                    return Err(self.err(
                        field,
                        format!("plugin {:?} is not a saturation detector", r.plugin_ref),
                    ));
                }
                Some(p)
            }
            None => self.default_plugin(
                registry,
                "utilization-detector",
                &mut plugins,
                &mut effective,
            )?,
        };
        if let Some(d) = &detector {
            effective.saturation_detector = Some(PluginRefDecl {
                plugin_ref: d.plugin().name().to_owned(),
            });
            scheduler = scheduler
                .with_saturation_detector(d.clone())
                .map_err(|e| self.err("saturationDetector", e.to_string()))?;
        }

        // Phase 5: parser.
        // llm-d's `requestHandler.parsers` wins over the older `parser`.
        let parser_refs: Vec<(String, &PluginRefDecl)> = match &raw.request_handler {
            Some(h) if !h.parsers.is_empty() => h
                .parsers
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("requestHandler.parsers[{i}].pluginRef"), r))
                .collect(),
            _ => raw
                .parser
                .iter()
                .map(|r| ("parser.pluginRef".to_owned(), r))
                .collect(),
        };
        match parser_refs.as_slice() {
            [_, ..] => {
                for (field, r) in &parser_refs {
                    find_plugin(&plugins, &r.plugin_ref).ok_or_else(|| {
                        self.err(
                            field.as_str(),
                            format!("no plugin named {:?} is declared", r.plugin_ref),
                        )
                    })?;
                }
            }
            [] => {
                if let Some(p) =
                    self.default_plugin(registry, "openai-parser", &mut plugins, &mut effective)?
                {
                    effective.parser = Some(PluginRefDecl {
                        plugin_ref: p.plugin().name().to_owned(),
                    });
                }
            }
        }

        // Phase 6: the data layer (`dataLayer`, or `data` as the reference docs say).
        let (layer, key) = match (&raw.data_layer, &raw.data) {
            (Some(_), Some(_)) => {
                return Err(self.err("data", "give either `dataLayer` or `data`, not both"));
            }
            (Some(d), None) => (Some(d.clone()), "dataLayer"),
            (None, Some(d)) => (Some(d.clone()), "data"),
            (None, None) => (None, "dataLayer"),
        };
        let layer = match layer {
            Some(l) => l,
            None => {
                let source = self.default_plugin(
                    registry,
                    "metrics-data-source",
                    &mut plugins,
                    &mut effective,
                )?;
                let extractor = self.default_plugin(
                    registry,
                    "core-metrics-extractor",
                    &mut plugins,
                    &mut effective,
                )?;
                match (source, extractor) {
                    (Some(s), Some(e)) => DataLayerDecl {
                        sources: vec![SourceDecl {
                            plugin_ref: s.plugin().name().to_owned(),
                            extractors: vec![PluginRefDecl {
                                plugin_ref: e.plugin().name().to_owned(),
                            }],
                        }],
                    },
                    _ => DataLayerDecl::default(),
                }
            }
        };
        let mut data_layer = Vec::new();
        for (si, s) in layer.sources.iter().enumerate() {
            let field = format!("{key}.sources[{si}]");
            let source = find_plugin(&plugins, &s.plugin_ref).ok_or_else(|| {
                self.err(
                    format!("{field}.pluginRef"),
                    format!("no plugin named {:?} is declared", s.plugin_ref),
                )
            })?;
            if source.plugin().as_metrics_source().is_none() {
                return Err(self.err(
                    format!("{field}.pluginRef"),
                    format!("plugin {:?} is not a data source", s.plugin_ref),
                ));
            }
            let mut extractors = Vec::new();
            for (ei, e) in s.extractors.iter().enumerate() {
                let ef = format!("{field}.extractors[{ei}].pluginRef");
                let ex = find_plugin(&plugins, &e.plugin_ref).ok_or_else(|| {
                    self.err(
                        &ef,
                        format!("no plugin named {:?} is declared", e.plugin_ref),
                    )
                })?;
                if ex.plugin().as_extractor().is_none() {
                    return Err(
                        self.err(ef, format!("plugin {:?} is not an extractor", e.plugin_ref))
                    );
                }
                extractors.push(ex);
            }
            data_layer.push(SourceWiring { source, extractors });
        }
        effective.data = None;
        effective.data_layer = Some(layer);

        scheduler = scheduler.with_hooks(
            plugins
                .iter()
                .filter(|(n, p)| prefix::runs_hooks(prefix_source.as_deref(), n, p))
                .map(|(_, p)| p.clone()),
        );
        effective
            .api_version
            .get_or_insert_with(|| API_VERSIONS[0].to_owned());
        effective
            .kind
            .get_or_insert_with(|| "EndpointPickerConfig".to_owned());
        let effective_yaml = serde_yaml_ng::to_string(&effective)
            .unwrap_or_else(|e| format!("# cannot render: {e}\n"));
        Ok(BuiltConfig {
            scheduler,
            plugins,
            data_layer,
            feature_gates: raw.feature_gates.clone(),
            flow_control: raw.flow_control.clone(),
            objectives,
            model_rewrites,
            effective_yaml,
        })
    }

    /// Builds a default plugin of `type_name` if the registry has it and no
    /// plugin of that name is declared; returns the plugin of that name.
    fn default_plugin(
        &self,
        registry: &Registry,
        type_name: &str,
        plugins: &mut Vec<(String, PluginRef)>,
        effective: &mut RawConfig,
    ) -> Result<Option<PluginRef>, ConfigError> {
        if let Some((_, p)) = plugins
            .iter()
            .find(|(_, p)| p.plugin().type_name() == type_name)
        {
            return Ok(Some(p.clone()));
        }
        if !registry.contains(type_name) {
            return Ok(None);
        }
        let p = registry
            .build(&PluginSpec::new(type_name))
            .map_err(|e| self.err("plugins", format!("default plugin {type_name:?}: {e}")))?;
        let p = PluginRef::new(p);
        plugins.push((type_name.to_owned(), p.clone()));
        effective.plugins.push(PluginDecl::new(type_name));
        Ok(Some(p))
    }
}

fn find_plugin(plugins: &[(String, PluginRef)], name: &str) -> Option<PluginRef> {
    plugins
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| p.clone())
}

#[cfg(test)]
mod tests;
