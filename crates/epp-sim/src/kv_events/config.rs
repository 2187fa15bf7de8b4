//! `--kv-events-config`: vLLM's `KVEventsConfig`, as JSON, with vLLM's field
//! names and defaults.

use serde::Deserialize;

/// vLLM's `KVEventsConfig`. Unknown keys are an error, except the ones vLLM
/// has that mean nothing here (`hwm`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Publish at all (vLLM's default: false).
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"` (off). Unset: `"zmq"` when enabled.
    #[serde(default)]
    pub publisher: Option<String>,
    /// Where the PUB socket binds; `tcp://*:PORT` is every interface.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// Where the ROUTER socket for replay binds (none: no replay).
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Messages kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// ZeroMQ high-water mark (accepted; the PUB socket drops for slow
    /// subscribers on its own).
    #[serde(default)]
    pub hwm: Option<serde_json::Value>,
    /// Batches waiting to be sent; more are dropped (and counted).
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// The first frame of every message.
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".to_owned()
}

fn default_buffer_steps() -> usize {
    10_000
}

fn default_max_queue_size() -> usize {
    100_000
}

impl KvEventsConfig {
    /// Parses and checks the flag's JSON (clap's value parser).
    ///
    /// # Errors
    /// Bad JSON, an unknown key, an unknown publisher, a non-TCP endpoint or
    /// a zero `max_queue_size`, each said in words.
    pub fn parse(json: &str) -> Result<Self, String> {
        let cfg: Self =
            serde_json::from_str(json).map_err(|e| format!("not a KVEventsConfig: {e}"))?;
        match cfg.publisher.as_deref() {
            None | Some("zmq" | "null") => {}
            Some(other) => {
                return Err(format!(
                    "publisher {other:?} is not supported (\"zmq\" or \"null\")"
                ));
            }
        }
        for (field, ep) in [
            ("endpoint", Some(&cfg.endpoint)),
            ("replay_endpoint", cfg.replay_endpoint.as_ref()),
        ] {
            if let Some(ep) = ep {
                bind_address(ep).map_err(|reason| format!("{field} {ep:?}: {reason}"))?;
            }
        }
        if cfg.max_queue_size == 0 {
            return Err("max_queue_size 0: must be at least 1".to_owned());
        }
        Ok(cfg)
    }

    /// Whether events are published: enabled and the publisher is not
    /// `"null"`.
    #[must_use]
    pub fn is_on(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref() != Some("null")
    }
}

/// The address the `zeromq` crate binds for a ZeroMQ `tcp://` endpoint:
/// libzmq's `*` (every interface) becomes `0.0.0.0`.
///
/// # Errors
/// When it is not `tcp://HOST:PORT`.
pub fn bind_address(endpoint: &str) -> Result<String, String> {
    let rest = endpoint
        .strip_prefix("tcp://")
        .ok_or("only tcp:// endpoints are supported")?;
    let (host, port) = rest.rsplit_once(':').ok_or("no :PORT")?;
    port.parse::<u16>()
        .map_err(|_| format!("port {port:?} is not a number in 0..=65535"))?;
    if host.is_empty() {
        return Err("no host (use * for every interface)".to_owned());
    }
    let host = if host == "*" { "0.0.0.0" } else { host };
    Ok(format!("tcp://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_vllms() {
        let c = KvEventsConfig::parse("{}").unwrap();
        assert!(!c.is_on(), "vLLM's default: off");
        assert_eq!(c.endpoint, "tcp://*:5557");
        assert_eq!((c.replay_endpoint, c.buffer_steps), (None, 10_000));
        assert_eq!(c.topic, "");
    }

    #[test]
    fn the_vllm_example_parses_and_null_is_off() {
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
                "replay_endpoint": "tcp://*:5558", "buffer_steps": 10000, "topic": "kv@10.0.0.1@model",
                "hwm": 100000, "max_queue_size": 100000}"#,
        )
        .unwrap();
        assert!(c.is_on());
        assert_eq!(c.replay_endpoint.as_deref(), Some("tcp://*:5558"));
        assert_eq!(c.topic, "kv@10.0.0.1@model");
        let off = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#);
        assert!(!off.unwrap().is_on());
        assert!(
            KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#)
                .unwrap()
                .is_on()
        );
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let e =
            KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "nope": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `nope`"), "{e}");
        let e = KvEventsConfig::parse(r#"{"publisher": "kafka"}"#).unwrap_err();
        assert!(e.contains("kafka"), "{e}");
        let e = KvEventsConfig::parse(r#"{"endpoint": "ipc:///tmp/x"}"#).unwrap_err();
        assert!(e.contains("only tcp://"), "{e}");
        let e = KvEventsConfig::parse(r#"{"endpoint": "tcp://*:99999"}"#).unwrap_err();
        assert!(e.contains("99999"), "{e}");
        assert!(
            KvEventsConfig::parse("{")
                .unwrap_err()
                .contains("not a KVEventsConfig")
        );
    }

    #[test]
    fn star_binds_every_interface() {
        assert_eq!(bind_address("tcp://*:5557").unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(
            bind_address("tcp://127.0.0.1:0").unwrap(),
            "tcp://127.0.0.1:0"
        );
    }
}
