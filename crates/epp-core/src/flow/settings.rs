//! What a flow controller is configured with (built from the config's
//! `flowControl` section by `config::flow`).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::PluginRef;

/// llm-d's default byte capacity of a band: 1 GB.
pub const DEFAULT_BAND_MAX_BYTES: u64 = 1_000_000_000;
/// llm-d's default request capacity of a band.
pub const DEFAULT_BAND_MAX_REQUESTS: u64 = 5000;

/// llm-d's queue-wait budget when `defaultRequestTTL` is absent: 60 s.
pub const DEFAULT_REQUEST_TTL: Duration = Duration::from_secs(60);

/// One priority band.
#[derive(Debug, Clone)]
pub struct BandSettings {
    /// Its priority (higher dispatches first).
    pub priority: i32,
    /// Bytes it may hold (0: no limit).
    pub max_bytes: u64,
    /// Requests it may hold (0: no limit).
    pub max_requests: u64,
    /// Picks the flow to dispatch from (a [`super::FairnessPolicy`]).
    pub fairness: PluginRef,
    /// Orders each flow's requests (a [`super::OrderingPolicy`]).
    pub ordering: PluginRef,
    /// The busiest flow's ceiling (`busiestFlowCeiling`, an epp extension):
    /// once the pool's saturation reaches it, the band's flows with the
    /// most requests in flight wait while another of its flows is active,
    /// so that the rest of the pool stays free for the lighter flows.
    /// `None`: no flow is held back for another (llm-d's behaviour).
    pub busiest_flow_ceiling: Option<f64>,
    /// How long a flow counts as active after its last request was
    /// released, with nothing of it queued or in flight
    /// ([`ACTIVE_FLOW_WINDOW`] from a config).
    pub active_flow_window: Duration,
}

/// How long a flow with nothing queued or in flight still counts as active
/// for [`BandSettings::busiest_flow_ceiling`] after its last release: a
/// tenant sending now and then keeps its share between requests.
pub const ACTIVE_FLOW_WINDOW: Duration = Duration::from_secs(10);

/// A flow controller's settings.
#[derive(Debug, Clone)]
pub struct FlowSettings {
    /// Bytes queued at most over all bands (0: no limit).
    pub max_bytes: u64,
    /// Requests queued at most over all bands (0: no limit).
    pub max_requests: u64,
    /// How long a request may wait (`defaultRequestTTL`, absent from a
    /// config: [`DEFAULT_REQUEST_TTL`]); `None`: until it goes away
    /// (`"0s"`).
    pub default_ttl: Option<Duration>,
    /// How long it may wait while the pool has no endpoint
    /// (`noEndpointRequestTTL`, absent from a config: `default_ttl`);
    /// `None`: until it goes away.
    pub no_endpoint_ttl: Option<Duration>,
    /// The configured bands by priority.
    pub bands: BTreeMap<i32, Arc<BandSettings>>,
    /// The template of a priority no band names (`defaultPriorityBand`).
    pub default_band: BandSettings,
    /// The template of a negative priority no band names
    /// (`defaultNegativePriorityBand`); `None`: `default_band`.
    pub default_negative_band: Option<BandSettings>,
    /// Ceilings per band (a [`super::UsageLimitPolicy`]).
    pub usage_limit: PluginRef,
}

impl FlowSettings {
    /// The band requests of `priority` queue in.
    #[must_use]
    pub fn band_for(&self, priority: i32) -> Arc<BandSettings> {
        if let Some(b) = self.bands.get(&priority) {
            return Arc::clone(b);
        }
        let template = match &self.default_negative_band {
            Some(neg) if priority < 0 => neg,
            _ => &self.default_band,
        };
        Arc::new(BandSettings {
            priority,
            ..template.clone()
        })
    }
}
