//! Wiring latency-prediction readers (`latency-scorer`,
//! `slo-headroom-tier-filter`, `latency-slo-admitter`, a
//! `prefix-cache-affinity-filter` with `ttftSource: latencyPredictor`) to a
//! producer: when no declared plugin produces predictions, the registry's
//! default latency predictor is added, so a reader never silently reads
//! nothing.

use super::{ConfigError, EndpointPickerConfig, Wiring};
use crate::{PluginRef, Registry, Role};

fn produces(p: &PluginRef) -> bool {
    p.plugin()
        .as_data_producer()
        .is_some_and(crate::DataProducer::produces_latency_predictions)
}

impl EndpointPickerConfig {
    /// Adds the registry's default latency predictor when a plugin reads
    /// predictions and none produces them.
    pub(super) fn wire_latency_predictions(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<(), ConfigError> {
        let Some(reader) = wiring
            .plugins
            .iter()
            .position(|(_, p)| p.plugin().reads_latency_predictions())
        else {
            return Ok(());
        };
        if wiring.plugins.iter().any(|(_, p)| produces(p)) {
            return Ok(());
        }
        let field = format!("plugins[{reader}].type");
        let cannot = |e: crate::BuildError| {
            self.err(
                field.clone(),
                format!(
                    "reads latency predictions, but no plugin produces them and the default \
                     latency predictor cannot be created: {e}"
                ),
            )
        };
        let spec = registry
            .default_spec(Role::LatencyPredictor)
            .map_err(cannot)?;
        if wiring.find(&spec.name).is_some() {
            return Err(self.err(
                field,
                format!(
                    "reads latency predictions, but no plugin produces them, and the name of \
                     the default latency predictor ({:?}) is taken",
                    spec.name
                ),
            ));
        }
        let p = wiring.add(registry, &spec).map_err(cannot)?;
        if !produces(&p) {
            return Err(self.err(
                field,
                format!(
                    "the registered default latency predictor {:?} does not produce \
                     predictions",
                    spec.type_name
                ),
            ));
        }
        Ok(())
    }
}
