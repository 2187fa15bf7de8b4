//! The saturation detector: the one referenced (llm-d moved the reference
//! under `flowControl`; that one wins when both are set), else the registry's
//! default one, else none.

use super::{ConfigError, EndpointPickerConfig, Wiring, raw::PluginRefDecl};
use crate::{PluginRef, Registry, Role};

impl EndpointPickerConfig {
    /// The detector the scheduler consults, written into the effective config.
    pub(super) fn saturation_detector(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<Option<PluginRef>, ConfigError> {
        let raw = &self.raw;
        let referenced = match raw
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
        let detector = match referenced {
            Some((r, field)) => Some(self.referenced_as(
                wiring,
                field,
                &r.plugin_ref,
                "a saturation detector",
                |p| p.as_saturation_detector().is_some(),
            )?),
            None => self.default_plugin(registry, Role::SaturationDetector, wiring)?,
        };
        if let Some(d) = &detector {
            wiring.effective.saturation_detector = Some(PluginRefDecl {
                plugin_ref: d.plugin().name().to_owned(),
            });
        }
        Ok(detector)
    }
}
