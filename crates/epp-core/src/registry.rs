//! The plugin registry: YAML `type:` → factory, and the defaults for each
//! [`Role`].
//!
//! The registry is a value, not a global: the binary builds one, every crate
//! that ships plugins adds its own (`epp_plugins::register_builtins`, the data
//! layer's extractors, a downstream crate's scorer), and config loading asks it
//! to build each declared plugin. The crate that owns a plugin also names it
//! the default for a role ([`Registry::set_default`]) and may register the
//! config used when none is given ([`Registry::set_default_config`]), so
//! config loading knows roles, never concrete plugin names.

use std::{collections::BTreeMap, fmt, sync::Arc};

use serde::de::DeserializeOwned;

use crate::Plugin;

/// One plugin as declared in a config: `type`, `name`, `parameters`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSpec {
    /// The plugin type (`queue-scorer`).
    pub type_name: String,
    /// The instance name (defaults to the type).
    pub name: String,
    /// Raw parameters (`Null` when absent).
    pub parameters: serde_yaml_ng::Value,
}

impl PluginSpec {
    /// A spec with no parameters, named after its type.
    #[must_use]
    pub fn new(type_name: impl Into<String>) -> Self {
        let type_name = type_name.into();
        Self {
            name: type_name.clone(),
            type_name,
            parameters: serde_yaml_ng::Value::Null,
        }
    }

    /// Sets the parameters.
    #[must_use]
    pub fn with_parameters(mut self, parameters: serde_yaml_ng::Value) -> Self {
        self.parameters = parameters;
        self
    }

    /// Deserialises the parameters into `T` (absent parameters = `T`'s
    /// defaults, i.e. an empty mapping).
    ///
    /// # Errors
    /// [`BuildError::Parameters`] naming the field and the reason.
    pub fn params<T: DeserializeOwned>(&self) -> Result<T, BuildError> {
        let value = match &self.parameters {
            serde_yaml_ng::Value::Null => {
                serde_yaml_ng::Value::Mapping(serde_yaml_ng::Mapping::new())
            }
            v => v.clone(),
        };
        serde_yaml_ng::from_value(value).map_err(|e| BuildError::Parameters {
            plugin: self.name.clone(),
            reason: e.to_string(),
        })
    }

    /// An error saying parameter `field` has a bad `value`.
    #[must_use]
    pub fn invalid(&self, field: &str, value: impl fmt::Display, reason: &str) -> BuildError {
        BuildError::InvalidValue {
            plugin: self.name.clone(),
            field: field.to_owned(),
            value: value.to_string(),
            reason: reason.to_owned(),
        }
    }
}

/// Why a plugin could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No factory for the type.
    #[error("unknown plugin type {type_name:?}{hint}")]
    UnknownType {
        /// The type asked for.
        type_name: String,
        /// A "did you mean" hint, possibly empty.
        hint: String,
    },
    /// Parameters did not deserialise.
    #[error("plugin {plugin:?}: bad parameters: {reason}")]
    Parameters {
        /// Plugin instance name.
        plugin: String,
        /// What serde said.
        reason: String,
    },
    /// A role's default was asked for, and the registry names none.
    #[error("no default {role} is registered")]
    NoDefault {
        /// The role without a default.
        role: Role,
    },
    /// A parameter has a value out of range or otherwise invalid.
    #[error("plugin {plugin:?}: parameter {field} = {value}: {reason}")]
    InvalidValue {
        /// Plugin instance name.
        plugin: String,
        /// Parameter name (camelCase as in YAML).
        field: String,
        /// The offending value.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
}

/// A part config loading fills in when a config does not declare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Role {
    /// Picks the endpoints of a profile that declares no picker.
    Picker,
    /// Chooses the profiles to run when no profile handler is declared.
    ProfileHandler,
    /// Judges saturation when no saturation detector is referenced; none
    /// runs when the registry has no default.
    SaturationDetector,
    /// Parses request bodies when no parser is referenced; none is set when
    /// the registry has no default.
    Parser,
    /// Scrapes each endpoint when no data layer is given; the data layer is
    /// empty when the registry has no default for this role or for
    /// [`Role::MetricsExtractor`].
    MetricsSource,
    /// Reads the default metrics source's pages.
    MetricsExtractor,
    /// Delivers engine KV-cache events to a declared consumer that no
    /// declared source feeds.
    NotificationSource,
    /// Fills prefix-cache matches for readers that name the default producer
    /// ([`crate::DEFAULT_PREFIX_PRODUCER`]) when no plugin has that name.
    PrefixProducer,
    /// Predicts latencies for plugins that read predictions
    /// ([`crate::Plugin::reads_latency_predictions`]) when no declared
    /// plugin produces them.
    LatencyPredictor,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Picker => "picker",
            Self::ProfileHandler => "profile handler",
            Self::SaturationDetector => "saturation detector",
            Self::Parser => "parser",
            Self::MetricsSource => "metrics source",
            Self::MetricsExtractor => "metrics extractor",
            Self::NotificationSource => "notification source",
            Self::PrefixProducer => "prefix-match producer",
            Self::LatencyPredictor => "latency predictor",
        })
    }
}

/// Builds a plugin from its spec.
pub type Factory = Arc<dyn Fn(&PluginSpec) -> Result<Arc<dyn Plugin>, BuildError> + Send + Sync>;

/// Maps plugin type names to factories, and roles to their default types.
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<String, Factory>,
    defaults: BTreeMap<Role, String>,
    default_parameters: BTreeMap<Role, serde_yaml_ng::Value>,
    default_config: Option<Arc<str>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("types", &self.factories.keys().collect::<Vec<_>>())
            .field("defaults", &self.defaults)
            .field("default_config", &self.default_config.is_some())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the factory for `type_name`. Replacing lets a
    /// downstream crate override a built-in deliberately.
    pub fn register<F>(&mut self, type_name: &str, factory: F) -> &mut Self
    where
        F: Fn(&PluginSpec) -> Result<Arc<dyn Plugin>, BuildError> + Send + Sync + 'static,
    {
        self.factories
            .insert(type_name.to_owned(), Arc::new(factory));
        self
    }

    /// Makes `type_name` the plugin config loading builds for `role` when a
    /// config leaves the role empty (replacing any earlier default). The
    /// type's factory is looked up when the default is built, so the order
    /// of `register` and `set_default` does not matter.
    pub fn set_default(&mut self, role: Role, type_name: &str) -> &mut Self {
        self.defaults.insert(role, type_name.to_owned());
        self
    }

    /// The type registered as `role`'s default, if any.
    #[must_use]
    pub fn default_type(&self, role: Role) -> Option<&str> {
        self.defaults.get(&role).map(String::as_str)
    }

    /// Gives `role`'s default plugin these parameters when config loading
    /// builds it (a config that declares its own plugin for the role is not
    /// affected). The binary sets them from flags, e.g. the metric names of
    /// the default metrics extractor.
    pub fn set_default_parameters(
        &mut self,
        role: Role,
        parameters: serde_yaml_ng::Value,
    ) -> &mut Self {
        self.default_parameters.insert(role, parameters);
        self
    }

    /// The spec of `role`'s default: its type, the parameters given with
    /// [`Self::set_default_parameters`] (none otherwise), named after the type. Config loading renames it where the role has a default name.
    ///
    /// # Errors
    /// [`BuildError::NoDefault`] when the role has no default.
    pub fn default_spec(&self, role: Role) -> Result<PluginSpec, BuildError> {
        let mut spec = self
            .default_type(role)
            .map(PluginSpec::new)
            .ok_or(BuildError::NoDefault { role })?;
        if let Some(p) = self.default_parameters.get(&role) {
            spec.parameters = p.clone();
        }
        Ok(spec)
    }

    /// Sets the config text used when none is given (the binary's default
    /// config), replacing any earlier one.
    pub fn set_default_config(&mut self, text: impl Into<Arc<str>>) -> &mut Self {
        self.default_config = Some(text.into());
        self
    }

    /// The config text used when none is given, if one is registered.
    #[must_use]
    pub fn default_config(&self) -> Option<&str> {
        self.default_config.as_deref()
    }

    /// Whether `type_name` has a factory.
    #[must_use]
    pub fn contains(&self, type_name: &str) -> bool {
        self.factories.contains_key(type_name)
    }

    /// Registered type names, sorted.
    pub fn types(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Builds the plugin `spec` declares.
    ///
    /// # Errors
    /// Unknown type, or whatever the factory reports.
    pub fn build(&self, spec: &PluginSpec) -> Result<Arc<dyn Plugin>, BuildError> {
        match self.factories.get(&spec.type_name) {
            Some(factory) => factory(spec),
            None => Err(BuildError::UnknownType {
                type_name: spec.type_name.clone(),
                hint: self
                    .closest(&spec.type_name)
                    .map_or_else(String::new, |t| format!(" (did you mean {t:?}?)")),
            }),
        }
    }

    fn closest(&self, wanted: &str) -> Option<&str> {
        self.types()
            .map(|t| (edit_distance(t, wanted), t))
            .filter(|(d, t)| *d <= 3.max(t.len() / 4))
            .min()
            .map(|(_, t)| t)
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SingleProfileHandler;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Params {
        #[serde(default)]
        max_num: u32,
    }

    #[test]
    fn builds_registered_types_and_hints_typos() {
        let mut r = Registry::new();
        r.register(SingleProfileHandler::TYPE, |spec| {
            let p: Params = spec.params()?;
            if p.max_num > 10 {
                return Err(spec.invalid("maxNum", p.max_num, "must be at most 10"));
            }
            Ok(Arc::new(SingleProfileHandler::new(spec.name.clone())))
        });
        let ok = r.build(&PluginSpec::new("single-profile-handler")).unwrap();
        assert_eq!(ok.name(), "single-profile-handler");

        let err = r
            .build(&PluginSpec::new("single-profile-handlr"))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("did you mean \"single-profile-handler\""),
            "{err}"
        );

        let bad: serde_yaml_ng::Value = serde_yaml_ng::from_str("{maxNum: 11}").unwrap();
        let err = r
            .build(&PluginSpec::new("single-profile-handler").with_parameters(bad))
            .unwrap_err();
        assert!(err.to_string().contains("maxNum = 11"), "{err}");

        let unknown: serde_yaml_ng::Value = serde_yaml_ng::from_str("{maxNumm: 1}").unwrap();
        let err = r
            .build(&PluginSpec::new("single-profile-handler").with_parameters(unknown))
            .unwrap_err();
        assert!(err.to_string().contains("unknown field `maxNumm`"), "{err}");
    }

    #[test]
    fn roles_name_their_default_types_and_the_last_setting_wins() {
        let mut r = Registry::new();
        assert_eq!(
            r.default_spec(Role::Picker).unwrap_err().to_string(),
            "no default picker is registered"
        );
        assert_eq!(r.default_type(Role::Parser), None);
        assert_eq!(r.default_config(), None);
        r.set_default(Role::Picker, "a-picker")
            .set_default(Role::Picker, "b-picker")
            .set_default_config("plugins: []\n");
        assert_eq!(
            r.default_spec(Role::Picker),
            Ok(PluginSpec::new("b-picker"))
        );
        assert_eq!(r.default_config(), Some("plugins: []\n"));
        // A default need not be registered yet; building it says what is missing.
        let err = r.build(&r.default_spec(Role::Picker).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("unknown plugin type \"b-picker\""),
            "{err}"
        );
    }
}
