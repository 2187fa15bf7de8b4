//! The `EndpointPickerConfig` file: schema, defaults, strict validation with
//! file:line:column errors, and building the scheduler from it.
//!
//! Three phases: the raw serde structs (unknown keys rejected, `raw.rs`),
//! validation and defaulting against a [`Registry`] (every plugin is built,
//! every reference resolved), and the [`BuiltConfig`] the binary runs.
//! [`EndpointPickerConfig::build`] validates and defaults in steps, one file
//! each:
//!
//! 1. `header.rs`: `apiVersion`, `kind`, `featureGates`;
//! 2. `plugins.rs`: every declared plugin, by name;
//! 3. `prefix.rs`: every prefix-match reader gets its producer;
//! 4. `profiles.rs`: the profile handler, then the profiles, each with a picker;
//! 5. `flow.rs`: flow-control keys;
//! 6. `detector.rs`: the saturation detector;
//! 7. `parser.rs`: the request parsers;
//! 8. `data_layer.rs`: metrics sources and their extractors.
//!
//! Where a config leaves a part out, the step builds the registry's default
//! for that [`Role`]; this module knows roles, not plugin names.
//!
//! ```
//! use epp_core::{Registry, config::EndpointPickerConfig};
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

mod data_layer;
mod detector;
mod flow;
mod header;
mod latency;
mod locate;
mod objectives;
mod parser;
mod plugins;
mod prefix;
mod profiles;
mod raw;

use std::{collections::HashMap, fmt};

/// Parses a Go duration (`60s`, `1m30s`, `500ms`, `0`), as llm-d's configs
/// write them; `None` when `text` is not one or is negative.
pub use flow::duration as parse_duration;
use locate::Locations;
pub use objectives::{
    ModelMatchDecl, ModelNameMatch, ModelRewriteDecl, ModelRewriteRules, ObjectiveDecl,
    RewriteRuleDecl, RewriteTargetDecl,
};
use raw::RawConfig;
pub use raw::{
    FlowControlConfig, PluginDecl, PluginRefDecl, PriorityBandDecl, ProfileDecl, ProfilePluginDecl,
    SourceDecl,
};

use crate::{BuildError, Plugin, PluginRef, PluginSpec, Registry, Role, Scheduler};

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
    /// The endpoint-discovery plugin `dataLayer.discovery` names: endpoints
    /// come from it instead of Kubernetes (llm-d).
    pub discovery: Option<PluginRef>,
    /// The cross-replica syncer `dataLayer.crossReplicaSyncerPluginRef`
    /// names, with its peers and interval (see [`crate::replicas`]).
    pub replicas: Option<crate::replicas::ReplicaSync>,
    /// Enabled feature gates.
    pub feature_gates: Vec<String>,
    /// Flow-control settings, when given.
    pub flow_control: Option<FlowControlConfig>,
    /// The flow controller's settings, built when the `flowControl` gate is
    /// on (from the section, or llm-d's defaults without one).
    pub flow_settings: Option<crate::flow::FlowSettings>,
    /// Objective name (`x-gateway-inference-objective`) → priority.
    pub objectives: HashMap<String, i32>,
    /// Model rewrite rules (empty when none are declared).
    pub model_rewrites: ModelRewriteRules,
    /// Which request APIs are read ([`crate::RequestParsers`]).
    pub parsers: crate::RequestParsers,
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

    /// The config `registry` gives when none is written
    /// ([`Registry::set_default_config`]; `epp_plugins` registers the
    /// reference picker's default).
    ///
    /// # Errors
    /// The registry has no default config, or its text does not parse
    /// (errors name the origin `<default config>`).
    pub fn default_config(registry: &Registry) -> Result<Self, ConfigError> {
        const ORIGIN: &str = "<default config>";
        let text = registry.default_config().ok_or_else(|| ConfigError {
            origin: ORIGIN.to_owned(),
            line: 0,
            column: 0,
            field: String::new(),
            message: "no config was given and the plugin registry has no default config".to_owned(),
        })?;
        Self::parse(text, ORIGIN)
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

    /// Validates against `registry` and builds every plugin and the scheduler,
    /// in phases; each fills in from the registry's [`Role`] defaults what the
    /// config leaves out, and writes it into the effective config.
    ///
    /// # Errors
    /// The first problem found, with its location.
    pub fn build(&self, registry: &Registry) -> Result<BuiltConfig, ConfigError> {
        let raw = &self.raw;
        self.check_header()?;
        let objectives = objectives::build_objectives(&raw.objectives)
            .map_err(|(field, message)| self.err(field, message))?;
        let model_rewrites = ModelRewriteRules::build(&raw.model_rewrites)
            .map_err(|(field, message)| self.err(field, message))?;

        let mut wiring = self.build_plugins(registry)?;
        self.bind_named_plugins(&wiring)?;
        self.wire_latency_predictions(registry, &mut wiring)?;
        let prefix_sources = self.wire_prefix_matches(registry, &mut wiring)?;
        let handler = self.profile_handler(registry, &mut wiring)?;
        let profiles = self.build_profiles(registry, &handler, &mut wiring)?;
        let mut scheduler = Scheduler::new(profiles, handler)
            .map_err(|e| self.err("schedulingProfiles", e.to_string()))?;
        let feature_gates = self.enabled_gates();
        let flow_gate = feature_gates.iter().any(|g| g == "flowControl");
        let flow_settings = if flow_gate || raw.flow_control.is_some() {
            let built =
                self.build_flow_control(raw.flow_control.as_ref(), &wiring.plugins, registry)?;
            flow_gate.then_some(built)
        } else {
            None
        };
        if let Some(detector) = self.saturation_detector(registry, &mut wiring)? {
            scheduler = scheduler
                .with_saturation_detector(detector)
                .map_err(|e| self.err("saturationDetector", e.to_string()))?;
        }
        let parsers = self.check_parsers(registry, &mut wiring)?;
        let data_layer = self.build_data_layer(registry, &mut wiring)?;
        let discovery = self.discovery(&wiring);
        let replicas = self.replicas(&wiring);
        self.check_custom_metrics(&wiring, &data_layer)?;

        let Wiring { plugins, effective } = wiring;
        let scheduler = scheduler.with_hooks(
            plugins
                .iter()
                .filter(|(n, p)| prefix::runs_hooks(&prefix_sources, n, p))
                .map(|(_, p)| p.clone()),
        );
        Ok(BuiltConfig {
            scheduler,
            plugins,
            data_layer,
            discovery,
            replicas,
            feature_gates,
            flow_control: raw.flow_control.clone(),
            flow_settings,
            objectives,
            model_rewrites,
            parsers,
            effective_yaml: header::render(effective),
        })
    }
}

/// What the phases build up: every plugin by name, declared ones first in
/// declaration order, then the defaults the phases add; and the effective
/// config, the input with every default written in.
#[derive(Debug)]
struct Wiring {
    plugins: Vec<(String, PluginRef)>,
    effective: RawConfig,
}

impl Wiring {
    /// The plugin named `name`.
    fn find(&self, name: &str) -> Option<PluginRef> {
        find_plugin(&self.plugins, name)
    }

    /// Builds a default plugin the config did not declare and adds it to the
    /// plugins and to the effective config.
    fn add(&mut self, registry: &Registry, spec: &PluginSpec) -> Result<PluginRef, BuildError> {
        let plugin = PluginRef::new(registry.build(spec)?);
        self.effective.plugins.push(PluginDecl::of_spec(spec));
        self.plugins.push((spec.name.clone(), plugin.clone()));
        Ok(plugin)
    }
}

impl EndpointPickerConfig {
    /// Hands every declared plugin the plugins its parameters name
    /// ([`Plugin::named_plugins`]); an unknown name, or a plugin that cannot
    /// play the part, is an error at that parameter.
    fn bind_named_plugins(&self, wiring: &Wiring) -> Result<(), ConfigError> {
        for (i, (_, p)) in wiring.plugins.iter().enumerate() {
            let named = p.plugin().named_plugins();
            if named.is_empty() {
                continue;
            }
            let field = |path: &str| format!("plugins[{i}].parameters.{path}");
            let refs = named
                .iter()
                .map(|(path, name)| self.referenced(wiring, &field(path), name))
                .collect::<Result<Vec<_>, _>>()?;
            p.plugin().bind_plugins(&refs).map_err(|(at, reason)| {
                let path = named.get(at).map_or("", |(path, _)| path);
                self.err(field(path), reason)
            })?;
        }
        Ok(())
    }

    /// The plugin a reference at `field` names.
    fn referenced(
        &self,
        wiring: &Wiring,
        field: &str,
        name: &str,
    ) -> Result<PluginRef, ConfigError> {
        wiring
            .find(name)
            .ok_or_else(|| self.err(field, format!("no plugin named {name:?} is declared")))
    }

    /// The plugin a reference at `field` names, which must be `what`
    /// (`plays` says whether it is).
    fn referenced_as(
        &self,
        wiring: &Wiring,
        field: &str,
        name: &str,
        what: &str,
        plays: impl Fn(&dyn Plugin) -> bool,
    ) -> Result<PluginRef, ConfigError> {
        let p = self.referenced(wiring, field, name)?;
        if plays(p.plugin()) {
            Ok(p)
        } else {
            Err(self.err(field, format!("plugin {name:?} is not {what}")))
        }
    }

    /// The plugin of `role`'s default type: a declared one of that type, else
    /// one built from the registry's default spec (its default parameters, if
    /// any) and added. `None` when the registry has no default for `role`.
    fn default_plugin(
        &self,
        registry: &Registry,
        role: Role,
        wiring: &mut Wiring,
    ) -> Result<Option<PluginRef>, ConfigError> {
        let Some(type_name) = registry.default_type(role) else {
            return Ok(None);
        };
        if let Some((_, p)) = wiring
            .plugins
            .iter()
            .find(|(_, p)| p.plugin().type_name() == type_name)
        {
            return Ok(Some(p.clone()));
        }
        let spec = registry
            .default_spec(role)
            .map_err(|e| self.err("plugins", e.to_string()))?;
        wiring
            .add(registry, &spec)
            .map(Some)
            .map_err(|e| self.err("plugins", format!("default {role} {type_name:?}: {e}")))
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
