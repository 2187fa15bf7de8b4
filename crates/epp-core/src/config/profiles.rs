//! The profile handler (one at most; the registry's default when none is
//! declared) and the scheduling profiles it runs, each with its filters,
//! weighted scorers and one picker (the registry's default picker when the
//! profile names none).

use std::{collections::HashMap, sync::Arc};

use super::{
    ConfigError, EndpointPickerConfig, Wiring,
    raw::{PluginDecl, ProfileDecl, ProfilePluginDecl},
};
use crate::{
    BuildError, Plugin, PluginRef, Registry, Role, SchedulingProfile, SingleProfileHandler,
};

impl EndpointPickerConfig {
    /// The one declared profile handler, else the registry's default one.
    pub(super) fn profile_handler(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<Arc<dyn Plugin>, ConfigError> {
        let handlers: Vec<usize> = (0..wiring.plugins.len())
            .filter(|&i| wiring.plugins[i].1.plugin().as_profile_handler().is_some())
            .collect();
        if let Some(&second) = handlers.get(1) {
            return Err(self.err(
                format!("plugins[{second}]"),
                "only one profile handler may be declared",
            ));
        }
        if let Some(&i) = handlers.first() {
            return Ok(Arc::clone(&wiring.plugins[i].1.0));
        }
        // Not a named plugin: the scheduler holds it, the effective config
        // declares it.
        let spec = registry.default_spec(Role::ProfileHandler);
        let handler = spec.and_then(|spec| Ok((registry.build(&spec)?, spec)));
        let (handler, spec) = handler.map_err(|e| {
            self.err(
                "plugins",
                format!("no profile handler is declared and the default one cannot be built: {e}"),
            )
        })?;
        wiring.effective.plugins.push(PluginDecl::of_spec(&spec));
        Ok(handler)
    }

    /// The declared profiles (or one `default` profile holding every filter,
    /// scorer and picker declared), each given a picker; writes them with
    /// their weights into the effective config.
    pub(super) fn build_profiles(
        &self,
        registry: &Registry,
        handler: &Arc<dyn Plugin>,
        wiring: &mut Wiring,
    ) -> Result<Vec<SchedulingProfile>, ConfigError> {
        let profile_decls = if self.raw.scheduling_profiles.is_empty() {
            vec![default_profile(&wiring.plugins)]
        } else {
            self.raw.scheduling_profiles.clone()
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
        if let Some(h) = handler.as_profile_handler() {
            let names: Vec<&str> = profile_decls.iter().map(|p| p.name.as_str()).collect();
            if let Err(reason) = h.check_profiles(&names) {
                let at = wiring
                    .plugins
                    .iter()
                    .position(|(_, p)| Arc::ptr_eq(&p.0, handler))
                    .filter(|&i| i < self.raw.plugins.len())
                    .map_or_else(
                        || "schedulingProfiles".to_owned(),
                        |i| format!("plugins[{i}]"),
                    );
                return Err(self.err(
                    at,
                    format!("{} {:?}: {reason}", handler.type_name(), handler.name()),
                ));
            }
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
            profiles.push(self.build_profile(registry, pi, pd, wiring)?);
        }
        wiring.effective.scheduling_profiles = profile_decls
            .iter()
            .map(|pd| ProfileDecl {
                name: pd.name.clone(),
                plugins: pd
                    .plugins
                    .iter()
                    .map(|r| ProfilePluginDecl {
                        plugin_ref: r.plugin_ref.clone(),
                        weight: r.weight.or_else(|| {
                            wiring
                                .find(&r.plugin_ref)
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
        Ok(profiles)
    }

    /// Profile `pi`: its plugins by role, and a picker.
    fn build_profile(
        &self,
        registry: &Registry,
        pi: usize,
        pd: &ProfileDecl,
        wiring: &mut Wiring,
    ) -> Result<SchedulingProfile, ConfigError> {
        let mut profile = SchedulingProfile::new(&pd.name);
        let mut has_picker = false;
        for (ri, r) in pd.plugins.iter().enumerate() {
            let field = format!("schedulingProfiles[{pi}].plugins[{ri}]");
            let plugin = self.referenced(wiring, &format!("{field}.pluginRef"), &r.plugin_ref)?;
            let p = plugin.plugin();
            if p.as_picker().is_some() {
                if has_picker {
                    return Err(self.err(format!("{field}.pluginRef"), "a profile has one picker"));
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
            } else if p.as_data_producer().is_some() || p.as_admitter().is_some() {
                // Producers and admitters run once per request for every
                // profile; some configs list them in a profile too, which
                // means the same.
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
            let picker = self.default_picker(registry, wiring).map_err(|e| {
                self.err(
                    format!("schedulingProfiles[{pi}]"),
                    format!("the profile has no picker and the default one cannot be built: {e}"),
                )
            })?;
            profile = profile.with_picker(picker);
        }
        Ok(profile)
    }

    /// The default picker: the plugin named after the registry's default
    /// picker type when it is a picker, else a new one (added to the plugins
    /// unless a plugin already has that name).
    fn default_picker(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<PluginRef, BuildError> {
        let spec = registry.default_spec(Role::Picker)?;
        match wiring.find(&spec.name) {
            Some(p) if p.plugin().as_picker().is_some() => Ok(p),
            Some(_) => Ok(PluginRef::new(registry.build(&spec)?)),
            None => wiring.add(registry, &spec),
        }
    }
}

/// One profile named `default` holding every filter, scorer and picker
/// declared (saturation detectors, which may filter too, excepted).
fn default_profile(plugins: &[(String, PluginRef)]) -> ProfileDecl {
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
    ProfileDecl {
        name: "default".into(),
        plugins: plugins_in_default,
    }
}
