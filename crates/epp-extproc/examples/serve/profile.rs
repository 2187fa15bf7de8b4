//! The schedulers the `serve` example runs: the binary's default profile
//! (the real built-in plugins: queue ×2, KV ×2, prefix ×3, max-score picker),
//! or a trivial one to measure the service without scheduling work.

use std::sync::Arc;

use epp_core::{
    Candidate, CycleContext, Picker, Plugin, PluginRef, Scheduler, SchedulingProfile,
    SingleProfileHandler, config::EndpointPickerConfig,
};

/// The first candidate (to measure the service without scheduling work).
#[derive(Debug)]
struct First;

impl Plugin for First {
    fn type_name(&self) -> &str {
        "first-picker"
    }
    fn name(&self) -> &str {
        "first-picker"
    }
    fn as_picker(&self) -> Option<&dyn Picker> {
        Some(self)
    }
}

impl Picker for First {
    fn pick(&self, _: &mut CycleContext<'_>, c: &[Candidate], _: &[f64], out: &mut Vec<usize>) {
        out.extend((!c.is_empty()).then_some(0));
    }
}

/// A profile doing no work: one picker taking the first endpoint.
pub(crate) fn trivial() -> Result<Scheduler, Box<dyn std::error::Error>> {
    let profile = SchedulingProfile::new("default").with_picker(PluginRef::new(Arc::new(First)));
    Ok(Scheduler::new(
        vec![profile],
        Arc::new(SingleProfileHandler::default()),
    )?)
}

/// The `epp` binary's scheduler when no config is given: the built-in
/// plugins and [`epp_plugins::DEFAULT_CONFIG`].
pub(crate) fn default() -> Result<Scheduler, Box<dyn std::error::Error>> {
    let config = EndpointPickerConfig::parse(epp_plugins::DEFAULT_CONFIG, "default config")?;
    Ok(config.build(&epp_plugins::builtin_registry())?.scheduler)
}
