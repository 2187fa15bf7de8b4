//! Validation of llm-d's flow-control keys that refer to plugins or carry
//! quantities. Flow control itself (queueing) is not implemented yet: these
//! keys are checked so a config means what it says, and have no effect.

use super::{
    EndpointPickerConfig, find_plugin,
    raw::{FlowControlConfig, PriorityBandDecl},
};
use crate::{PluginRef, config::ConfigError};

/// Policies llm-d provides without a declaration (its defaults).
const BUILTIN_USAGE_LIMIT_POLICY: &str = "static-usage-limit-policy";
const BUILTIN_FAIRNESS_POLICY: &str = "global-strict-fairness-policy";
const BUILTIN_ORDERING_POLICY: &str = "fcfs-ordering-policy";

impl EndpointPickerConfig {
    pub(super) fn check_flow_control(
        &self,
        fc: &FlowControlConfig,
        plugins: &[(String, PluginRef)],
    ) -> Result<(), ConfigError> {
        if let Some(r) = &fc.usage_limit_policy_plugin_ref {
            self.check_policy_ref(
                "flowControl.usageLimitPolicyPluginRef",
                r,
                BUILTIN_USAGE_LIMIT_POLICY,
                "usage-limit policy",
                plugins,
            )?;
        }
        for (key, v) in [
            ("maxBytes", &fc.max_bytes),
            ("maxRequests", &fc.max_requests),
        ] {
            if let Some(v) = v
                && let Err(why) = quantity(v)
            {
                return Err(self.err(format!("flowControl.{key}"), why));
            }
        }
        for (key, v) in [
            ("defaultRequestTTL", &fc.default_request_ttl),
            ("noEndpointRequestTTL", &fc.no_endpoint_request_ttl),
        ] {
            if let Some(v) = v
                && !is_duration(v)
            {
                return Err(self.err(
                    format!("flowControl.{key}"),
                    format!("{v:?} is not a duration such as 60s, 1m30s or 500ms"),
                ));
            }
        }
        if let Some(band) = &fc.default_priority_band {
            self.check_band("flowControl.defaultPriorityBand", band, plugins)?;
        }
        if let Some(band) = &fc.default_negative_priority_band {
            self.check_band("flowControl.defaultNegativePriorityBand", band, plugins)?;
        }
        for (i, band) in fc.priority_bands.iter().enumerate() {
            let at = format!("flowControl.priorityBands[{i}]");
            self.check_band(&at, band, plugins)?;
            let priority = band.priority.unwrap_or(0);
            if fc.priority_bands[..i]
                .iter()
                .any(|b| b.priority.unwrap_or(0) == priority)
            {
                return Err(self.err(
                    format!("{at}.priority"),
                    format!("duplicate priority level {priority}"),
                ));
            }
        }
        Ok(())
    }

    fn check_band(
        &self,
        at: &str,
        band: &PriorityBandDecl,
        plugins: &[(String, PluginRef)],
    ) -> Result<(), ConfigError> {
        for (key, v) in [
            ("maxBytes", &band.max_bytes),
            ("maxRequests", &band.max_requests),
        ] {
            if let Some(v) = v
                && let Err(why) = quantity(v)
            {
                return Err(self.err(format!("{at}.{key}"), why));
            }
        }
        if let Some(r) = &band.fairness_policy_ref {
            self.check_policy_ref(
                &format!("{at}.fairnessPolicyRef"),
                r,
                BUILTIN_FAIRNESS_POLICY,
                "fairness policy",
                plugins,
            )?;
        }
        if let Some(r) = &band.ordering_policy_ref {
            self.check_policy_ref(
                &format!("{at}.orderingPolicyRef"),
                r,
                BUILTIN_ORDERING_POLICY,
                "ordering policy",
                plugins,
            )?;
        }
        Ok(())
    }

    /// `name` must be llm-d's built-in policy or a declared plugin of that
    /// kind; no policy plugin type exists here yet, so a declared plugin is
    /// always the wrong kind.
    fn check_policy_ref(
        &self,
        field: &str,
        name: &str,
        builtin: &str,
        kind: &str,
        plugins: &[(String, PluginRef)],
    ) -> Result<(), ConfigError> {
        if name == builtin {
            return Ok(());
        }
        match find_plugin(plugins, name) {
            None => Err(self.err(
                field,
                format!("no plugin named {name:?} is declared (built-in: {builtin:?})"),
            )),
            Some(p) => Err(self.err(
                field,
                format!(
                    "plugin {name:?} ({}) is not a {kind}; the only {kind} available is the \
                     built-in {builtin:?}",
                    p.plugin().type_name()
                ),
            )),
        }
    }
}

/// Whether `text` is a Go duration (`60s`, `1m30s`, `1.5h`, `500ms`, `0`).
fn is_duration(text: &str) -> bool {
    let t = text.trim();
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    if t == "0" {
        return true;
    }
    let mut rest = t;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if !number.chars().any(|c| c.is_ascii_digit()) || number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .find(|u| rest.starts_with(u))
        else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}

/// Checks a Kubernetes resource quantity: a non-negative number with an
/// optional binary (`Ki`…`Ei`), decimal (`k`, `M`…`E`, `m`) or exponent
/// (`e3`) suffix.
fn quantity(v: &serde_yaml_ng::Value) -> Result<(), String> {
    let text = match v {
        serde_yaml_ng::Value::Number(n) => {
            return match n.as_f64() {
                Some(f) if f >= 0.0 && f.is_finite() => Ok(()),
                _ => Err(format!("{n} must be a non-negative quantity")),
            };
        }
        serde_yaml_ng::Value::String(s) => s.trim(),
        other => return Err(format!("{other:?} is not a quantity such as 1Gi or 500")),
    };
    let digits = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number_ok = !number.is_empty()
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .and_then(|e| e.strip_prefix(['+', '-']).or(Some(e)))
        .is_some_and(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit()));
    if number_ok && suffix_ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a quantity such as 1Gi, 500M or 1000"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn durations() {
        for ok in ["60s", "1m30s", "500ms", "1.5h", "0", "0s", "2h45m"] {
            assert!(super::is_duration(ok), "{ok}");
        }
        for bad in ["", "60", "1d", "s", "1..5s", "ten s"] {
            assert!(!super::is_duration(bad), "{bad}");
        }
    }

    #[test]
    fn quantities() {
        for ok in ["1Gi", "500M", "1000", "1.5Gi", "1k", "1e3", "0"] {
            let v = serde_yaml_ng::Value::String(ok.into());
            assert!(quantity(&v).is_ok(), "{ok}");
        }
        assert!(quantity(&serde_yaml_ng::Value::Number(5.into())).is_ok());
        for bad in ["", "Gi", "1GB", "-1", "1..2", "ten"] {
            let v = serde_yaml_ng::Value::String(bad.into());
            assert!(quantity(&v).is_err(), "{bad}");
        }
        assert!(quantity(&serde_yaml_ng::Value::Number((-3).into())).is_err());
    }
}
