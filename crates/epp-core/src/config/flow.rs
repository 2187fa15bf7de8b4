//! llm-d's flow-control keys: policy references resolved (a declared plugin
//! of the right kind, or llm-d's built-in default for the role, built from
//! the registry), quantities and durations read, and the result built into
//! [`FlowSettings`] for the flow controller.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use super::{
    EndpointPickerConfig, find_plugin,
    raw::{FlowControlConfig, PriorityBandDecl},
};
use crate::{
    Plugin, PluginRef, PluginSpec, Registry,
    config::ConfigError,
    flow::{
        ACTIVE_FLOW_WINDOW, BandSettings, DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS,
        DEFAULT_REQUEST_TTL, FlowSettings,
    },
};

/// The three policy roles.
#[derive(Clone, Copy)]
enum PolicyKind {
    UsageLimit,
    Fairness,
    Ordering,
}

impl PolicyKind {
    fn builtin(self) -> &'static str {
        match self {
            Self::UsageLimit => BUILTIN_USAGE_LIMIT_POLICY,
            Self::Fairness => BUILTIN_FAIRNESS_POLICY,
            Self::Ordering => BUILTIN_ORDERING_POLICY,
        }
    }
    fn noun(self) -> &'static str {
        match self {
            Self::UsageLimit => "usage-limit policy",
            Self::Fairness => "fairness policy",
            Self::Ordering => "ordering policy",
        }
    }
    fn fits(self, p: &dyn Plugin) -> bool {
        match self {
            Self::UsageLimit => p.as_usage_limit_policy().is_some(),
            Self::Fairness => p.as_fairness_policy().is_some(),
            Self::Ordering => p.as_ordering_policy().is_some(),
        }
    }
}

/// Policies llm-d provides without a declaration (its defaults).
const BUILTIN_USAGE_LIMIT_POLICY: &str = "static-usage-limit-policy";
const BUILTIN_FAIRNESS_POLICY: &str = "global-strict-fairness-policy";
const BUILTIN_ORDERING_POLICY: &str = "fcfs-ordering-policy";

impl EndpointPickerConfig {
    /// Checks the `flowControl` section and builds the controller's
    /// settings from it (`fc` absent: llm-d's defaults).
    pub(super) fn build_flow_control(
        &self,
        fc: Option<&FlowControlConfig>,
        plugins: &[(String, PluginRef)],
        registry: &Registry,
    ) -> Result<FlowSettings, ConfigError> {
        let empty = FlowControlConfig::default();
        let fc = fc.unwrap_or(&empty);
        let usage_limit = self.policy(
            "flowControl.usageLimitPolicyPluginRef",
            fc.usage_limit_policy_plugin_ref.as_deref(),
            PolicyKind::UsageLimit,
            plugins,
            registry,
        )?;
        let mut global = [0u64; 2];
        for (slot, (key, v)) in global.iter_mut().zip([
            ("maxBytes", &fc.max_bytes),
            ("maxRequests", &fc.max_requests),
        ]) {
            if let Some(v) = v {
                *slot = quantity(v).map_err(|why| self.err(format!("flowControl.{key}"), why))?;
            }
        }
        // Per key: absent (`None`), or "0s" (`Some(None)`: no limit), or a
        // budget.
        let mut ttls: [Option<Option<Duration>>; 2] = [None; 2];
        for (slot, (key, v)) in ttls.iter_mut().zip([
            ("defaultRequestTTL", &fc.default_request_ttl),
            ("noEndpointRequestTTL", &fc.no_endpoint_request_ttl),
        ]) {
            if let Some(v) = v {
                let d = duration(v).ok_or_else(|| {
                    self.err(
                        format!("flowControl.{key}"),
                        format!("{v:?} is not a duration such as 60s, 1m30s or 500ms"),
                    )
                })?;
                *slot = Some((!d.is_zero()).then_some(d));
            }
        }
        // As llm-d: an absent defaultRequestTTL is 60 s, and an absent
        // noEndpointRequestTTL follows it ("0s" in either turns that
        // eviction off).
        let default_ttl = ttls[0].unwrap_or(Some(DEFAULT_REQUEST_TTL));
        let no_endpoint_ttl = ttls[1].unwrap_or(default_ttl);
        let empty_band = PriorityBandDecl::default();
        let default_band = self.band(
            "flowControl.defaultPriorityBand",
            fc.default_priority_band.as_ref().unwrap_or(&empty_band),
            0,
            plugins,
            registry,
        )?;
        let default_negative_band = match &fc.default_negative_priority_band {
            Some(b) => Some(self.band(
                "flowControl.defaultNegativePriorityBand",
                b,
                -1,
                plugins,
                registry,
            )?),
            None => None,
        };
        let mut bands = BTreeMap::new();
        for (i, band) in fc.priority_bands.iter().enumerate() {
            let at = format!("flowControl.priorityBands[{i}]");
            let priority = band.priority.unwrap_or(0);
            let priority = i32::try_from(priority).map_err(|_| {
                self.err(
                    format!("{at}.priority"),
                    format!("{priority} is outside the 32-bit range of priorities"),
                )
            })?;
            if bands.contains_key(&priority) {
                return Err(self.err(
                    format!("{at}.priority"),
                    format!("duplicate priority level {priority}"),
                ));
            }
            let built = self.band(&at, band, priority, plugins, registry)?;
            bands.insert(priority, Arc::new(built));
        }
        Ok(FlowSettings {
            max_bytes: global[0],
            max_requests: global[1],
            default_ttl,
            no_endpoint_ttl,
            bands,
            default_band,
            default_negative_band,
            usage_limit,
        })
    }

    fn band(
        &self,
        at: &str,
        band: &PriorityBandDecl,
        priority: i32,
        plugins: &[(String, PluginRef)],
        registry: &Registry,
    ) -> Result<BandSettings, ConfigError> {
        let mut limits = [DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS];
        for (slot, (key, v)) in limits.iter_mut().zip([
            ("maxBytes", &band.max_bytes),
            ("maxRequests", &band.max_requests),
        ]) {
            if let Some(v) = v {
                let q = quantity(v).map_err(|why| self.err(format!("{at}.{key}"), why))?;
                // llm-d reads a band's 0 as "unset": the default, not "no limit".
                if q != 0 {
                    *slot = q;
                }
            }
        }
        let fairness = self.policy(
            &format!("{at}.fairnessPolicyRef"),
            band.fairness_policy_ref.as_deref(),
            PolicyKind::Fairness,
            plugins,
            registry,
        )?;
        let ordering = self.policy(
            &format!("{at}.orderingPolicyRef"),
            band.ordering_policy_ref.as_deref(),
            PolicyKind::Ordering,
            plugins,
            registry,
        )?;
        let busiest_flow_ceiling = match band.busiest_flow_ceiling {
            Some(c) if !(c > 0.0 && c <= 1.0) => {
                return Err(self.err(
                    format!("{at}.busiestFlowCeiling"),
                    format!("{c} is not a saturation in (0, 1]"),
                ));
            }
            c => c,
        };
        Ok(BandSettings {
            priority,
            max_bytes: limits[0],
            max_requests: limits[1],
            fairness,
            ordering,
            busiest_flow_ceiling,
            active_flow_window: ACTIVE_FLOW_WINDOW,
        })
    }

    /// The policy `name` names: a declared plugin of that kind, or (also
    /// when `name` is absent) llm-d's built-in default for the role, which
    /// needs no declaration.
    fn policy(
        &self,
        field: &str,
        name: Option<&str>,
        kind: PolicyKind,
        plugins: &[(String, PluginRef)],
        registry: &Registry,
    ) -> Result<PluginRef, ConfigError> {
        let builtin = kind.builtin();
        let noun = kind.noun();
        let name = name.unwrap_or(builtin);
        if let Some(p) = find_plugin(plugins, name) {
            if kind.fits(p.plugin()) {
                return Ok(p);
            }
            return Err(self.err(
                field,
                format!(
                    "plugin {name:?} ({}) is not a {noun}",
                    p.plugin().type_name()
                ),
            ));
        }
        if name != builtin {
            return Err(self.err(
                field,
                format!("no plugin named {name:?} is declared (built-in: {builtin:?})"),
            ));
        }
        let plugin = registry
            .build(&PluginSpec::new(builtin))
            .map_err(|e| self.err(field, format!("the built-in {noun} {builtin:?}: {e}")))?;
        if !kind.fits(plugin.as_ref()) {
            return Err(self.err(field, format!("the registry's {builtin:?} is not a {noun}")));
        }
        Ok(PluginRef::new(plugin))
    }
}

/// A Go duration (`60s`, `1m30s`, `1.5h`, `500ms`, `0`); `None` when
/// `text` is not one or is negative.
pub fn duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = t;
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if !number.chars().any(|c| c.is_ascii_digit()) || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        rest = &rest[digits..];
        let (unit, seconds) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("\u{b5}s", 1e-6),
            ("\u{3bc}s", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))?;
        total += value * seconds;
        rest = &rest[unit.len()..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Reads a Kubernetes resource quantity: a non-negative number with an
/// optional binary (`Ki`…`Ei`), decimal (`k`, `M`…`E`, `m`) or exponent
/// (`e3`) suffix, rounded up to a whole number.
fn quantity(v: &serde_yaml_ng::Value) -> Result<u64, String> {
    let text = match v {
        serde_yaml_ng::Value::Number(n) => {
            return match n.as_f64() {
                Some(f) if f >= 0.0 && f.is_finite() => Ok(whole(f)),
                _ => Err(format!("{n} must be a non-negative quantity")),
            };
        }
        serde_yaml_ng::Value::String(s) => s.trim(),
        other => return Err(format!("{other:?} is not a quantity such as 1Gi or 500")),
    };
    let bad = || format!("{text:?} is not a quantity such as 1Gi, 500M or 1000");
    let digits = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number_ok = !number.is_empty()
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    if !number_ok {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        other => {
            let exp = other.strip_prefix(['e', 'E']).ok_or_else(bad)?;
            let exp = exp.strip_prefix('+').unwrap_or(exp);
            let (neg, digits) = match exp.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, exp),
            };
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            let e: i32 = digits.parse().map_err(|_| bad())?;
            10f64.powi(if neg { -e } else { e })
        }
    };
    let total = value * factor;
    if total.is_finite() {
        Ok(whole(total))
    } else {
        Err(bad())
    }
}

/// A non-negative quantity rounded up, saturating at `u64::MAX`.
fn whole(f: f64) -> u64 {
    let up = f.ceil();
    if up >= u64::MAX as f64 {
        u64::MAX
    } else {
        up as u64
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{duration, quantity};

    #[test]
    fn durations() {
        for (ok, want) in [
            ("60s", 60.0),
            ("1m30s", 90.0),
            ("500ms", 0.5),
            ("1.5h", 5400.0),
            ("0", 0.0),
            ("0s", 0.0),
            ("2h45m", 9900.0),
        ] {
            assert_eq!(duration(ok), Some(Duration::from_secs_f64(want)), "{ok}");
        }
        for bad in ["", "60", "1d", "s", "1..5s", "ten s", "-1s"] {
            assert_eq!(duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn quantities() {
        let s = |t: &str| quantity(&serde_yaml_ng::Value::String(t.into()));
        assert_eq!(s("1Gi"), Ok(1 << 30));
        assert_eq!(s("500M"), Ok(500_000_000));
        assert_eq!(s("1000"), Ok(1000));
        assert_eq!(s("1.5Gi"), Ok(3 << 29));
        assert_eq!(s("5k"), Ok(5000));
        assert_eq!(s("1e3"), Ok(1000));
        assert_eq!(s("0"), Ok(0));
        assert_eq!(quantity(&serde_yaml_ng::Value::Number(5.into())), Ok(5));
        for bad in ["", "Gi", "1GB", "-1", "1..2", "ten", "1e"] {
            assert!(s(bad).is_err(), "{bad}");
        }
        assert!(quantity(&serde_yaml_ng::Value::Number((-3).into())).is_err());
    }
}
