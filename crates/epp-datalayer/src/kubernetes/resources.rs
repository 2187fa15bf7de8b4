//! InferenceObjective and InferenceModelRewrite resources of a pool, from
//! both API groups that define them (`inference.networking.x-k8s.io` and
//! `llm-d.ai`, version `v1alpha2`), filtered by their `spec.poolRef`.
//!
//! Each change hands the whole current set to a callback, which combines it
//! with the config file's objectives and rules.

use std::{collections::BTreeMap, fmt, sync::Arc};

use epp_core::config::RewriteRuleDecl;
use futures::StreamExt;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams},
    core::{ApiResource, GroupVersionKind},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    },
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{PoolGroup, check_access, watch::RetryBackoff};
use crate::{Error, Result};

/// The API groups serving both kinds.
pub const RESOURCE_GROUPS: [&str; 2] = ["inference.networking.x-k8s.io", "llm-d.ai"];

/// An InferenceObjective: requests naming it get its priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterObjective {
    /// `metadata.name`, what clients send in `x-gateway-inference-objective`.
    pub name: String,
    /// `spec.priority` (0 when absent).
    pub priority: i32,
}

/// An InferenceModelRewrite's rules.
#[derive(Debug, Clone)]
pub struct ClusterRewrite {
    /// `<group>/<name>`, for logs.
    pub name: String,
    /// `metadata.creationTimestamp` (RFC 3339): on conflicts the oldest wins.
    pub created: String,
    /// `spec.rules`.
    pub rules: Vec<RewriteRuleDecl>,
}

/// Everything the pool's resources currently say.
#[derive(Debug, Clone, Default)]
pub struct ClusterResources {
    /// Objectives, sorted by name (an objective in both groups: the
    /// `inference.networking.x-k8s.io` one first).
    pub objectives: Vec<ClusterObjective>,
    /// Rewrites, oldest first.
    pub rewrites: Vec<ClusterRewrite>,
}

/// Called with the whole set after every change.
pub type OnResources = Arc<dyn Fn(&ClusterResources) + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Objective,
    Rewrite,
}

impl Kind {
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::Objective => ("InferenceObjective", "inferenceobjectives"),
            Self::Rewrite => ("InferenceModelRewrite", "inferencemodelrewrites"),
        }
    }
}

/// Key of one object: kind, group index, name.
type Key = (Kind, usize, String);

/// Follows the objectives and rewrites that reference one pool.
pub struct PoolResources {
    client: Client,
    namespace: String,
    pool: String,
    pool_group: PoolGroup,
}

impl fmt::Debug for PoolResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolResources")
            .field("namespace", &self.namespace)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl PoolResources {
    /// For the pool `pool` of `pool_group` in `namespace`.
    #[must_use]
    pub fn new(client: Client, namespace: &str, pool: &str, pool_group: PoolGroup) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            pool: pool.to_owned(),
            pool_group,
        }
    }

    /// Checks access, then follows every served (group, kind) until `stop`,
    /// calling `on_change` with the whole set after each change. A group
    /// whose CRD is not installed is skipped (logged).
    ///
    /// # Errors
    /// [`Error::Forbidden`] when a served kind may not be listed or watched;
    /// [`Error::Kubernetes`] when the API server cannot be asked.
    pub async fn start(&self, on_change: OnResources, stop: CancellationToken) -> Result<()> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Key, Option<Value>, bool)>();
        let mut feeds = 0;
        for (gi, group) in RESOURCE_GROUPS.iter().enumerate() {
            for kind in [Kind::Objective, Kind::Rewrite] {
                let (kind_name, plural) = kind.names();
                let gvk = GroupVersionKind::gvk(group, "v1alpha2", kind_name);
                let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), &self.namespace, &ar);
                match api.list(&ListParams::default().limit(1)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        tracing::info!(
                            group,
                            kind = kind_name,
                            "not served by this cluster; skipped"
                        );
                        continue;
                    }
                    Err(kube::Error::Api(s)) if s.code == 403 => {
                        check_access(
                            &self.client,
                            &self.namespace,
                            group,
                            plural,
                            &["list", "watch"],
                        )
                        .await?;
                        return Err(Error::Forbidden {
                            verbs: "list".into(),
                            resource: format!("{plural}.{group}"),
                            namespace: self.namespace.clone(),
                        });
                    }
                    Err(e) => {
                        return Err(Error::Kubernetes(format!(
                            "cannot list {plural}.{group}: {e}"
                        )));
                    }
                }
                check_access(&self.client, &self.namespace, group, plural, &["watch"]).await?;
                feeds += 1;
                let tx = tx.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut events = std::pin::pin!(
                        watcher::watcher(api, watcher::Config::default())
                            .backoff(RetryBackoff::default())
                    );
                    loop {
                        let item = tokio::select! {
                            () = stop.cancelled() => return,
                            item = events.next() => item,
                        };
                        let Some(item) = item else { return };
                        let sent = match item {
                            Ok(Event::Init) => tx.send(((kind, gi, String::new()), None, true)),
                            Ok(Event::InitApply(obj) | Event::Apply(obj)) => {
                                let name = obj.metadata.name.clone().unwrap_or_default();
                                tx.send(((kind, gi, name), Some(object_value(&obj)), false))
                            }
                            Ok(Event::Delete(obj)) => {
                                let name = obj.metadata.name.clone().unwrap_or_default();
                                tx.send(((kind, gi, name), None, false))
                            }
                            Ok(Event::InitDone) => Ok(()),
                            Err(e) => {
                                tracing::warn!(group = RESOURCE_GROUPS[gi], kind = kind.names().0, error = %e, "cannot follow; keeping the last objectives and rewrites");
                                Ok(())
                            }
                        };
                        if sent.is_err() {
                            return;
                        }
                    }
                });
            }
        }
        drop(tx);
        if feeds == 0 {
            tracing::info!("no InferenceObjective or InferenceModelRewrite resources served");
            return Ok(());
        }
        let pool = self.pool.clone();
        let pool_group = self.pool_group.group();
        tokio::spawn(async move {
            let mut objects: BTreeMap<Key, Value> = BTreeMap::new();
            while let Some((key, value, reset)) = rx.recv().await {
                if reset {
                    // A re-list of this (kind, group) follows: forget what it had.
                    objects.retain(|k, _| (k.0, k.1) != (key.0, key.1));
                    continue;
                }
                match value {
                    Some(v) => objects.insert(key, v),
                    None => objects.remove(&key),
                };
                // Apply a burst of changes at once.
                while let Ok((key, value, reset)) = rx.try_recv() {
                    if reset {
                        objects.retain(|k, _| (k.0, k.1) != (key.0, key.1));
                    } else if let Some(v) = value {
                        objects.insert(key, v);
                    } else {
                        objects.remove(&key);
                    }
                }
                on_change(&collect(&objects, &pool, pool_group));
            }
        });
        Ok(())
    }
}

fn object_value(obj: &DynamicObject) -> Value {
    serde_json::json!({
        "created": obj.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        "spec": obj.data.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// Whether `spec.poolRef` names our pool (group defaults to the v1 one).
fn references(spec: &Value, pool: &str, pool_group: &str) -> bool {
    let Some(r) = spec.get("poolRef") else {
        return false;
    };
    let group = r
        .get("group")
        .and_then(Value::as_str)
        .filter(|g| !g.is_empty())
        .unwrap_or("inference.networking.k8s.io");
    let kind = r
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("InferencePool");
    r.get("name").and_then(Value::as_str) == Some(pool)
        && group == pool_group
        && kind == "InferencePool"
}

fn collect(objects: &BTreeMap<Key, Value>, pool: &str, pool_group: &str) -> ClusterResources {
    let mut out = ClusterResources::default();
    for ((kind, gi, name), v) in objects {
        let spec = &v["spec"];
        if !references(spec, pool, pool_group) {
            continue;
        }
        match kind {
            Kind::Objective => {
                let priority = match spec.get("priority") {
                    None | Some(Value::Null) => 0,
                    Some(p) => match p.as_i64().and_then(|p| i32::try_from(p).ok()) {
                        Some(p) => p,
                        None => {
                            tracing::warn!(objective = %name, priority = %p, "InferenceObjective priority is not a 32-bit integer; ignored");
                            continue;
                        }
                    },
                };
                out.objectives.push(ClusterObjective {
                    name: name.clone(),
                    priority,
                });
            }
            Kind::Rewrite => {
                let rules = spec
                    .get("rules")
                    .cloned()
                    .unwrap_or(Value::Array(Vec::new()));
                match serde_json::from_value::<Vec<RewriteRuleDecl>>(rules) {
                    Ok(rules) => out.rewrites.push(ClusterRewrite {
                        name: format!("{}/{name}", RESOURCE_GROUPS[*gi]),
                        created: v["created"].as_str().unwrap_or_default().to_owned(),
                        rules,
                    }),
                    Err(e) => {
                        tracing::warn!(rewrite = %name, error = %e, "InferenceModelRewrite rules unreadable; ignored")
                    }
                }
            }
        }
    }
    out.objectives.sort_by(|a, b| a.name.cmp(&b.name));
    out.rewrites
        .sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_resources_of_the_pool_count() {
        let mut objects = BTreeMap::new();
        let obj = |pool: &str, group: Option<&str>, priority: Value| {
            let mut r = json!({"name": pool});
            if let Some(g) = group {
                r["group"] = json!(g);
            }
            json!({"created": "", "spec": {"poolRef": r, "priority": priority}})
        };
        objects.insert(
            (Kind::Objective, 0, "mine".into()),
            obj("p", None, json!(5)),
        );
        objects.insert(
            (Kind::Objective, 1, "default-prio".into()),
            obj("p", None, Value::Null),
        );
        objects.insert(
            (Kind::Objective, 0, "other-pool".into()),
            obj("q", None, json!(1)),
        );
        objects.insert(
            (Kind::Objective, 0, "other-group".into()),
            obj("p", Some("inference.networking.x-k8s.io"), json!(1)),
        );
        objects.insert(
            (Kind::Objective, 0, "huge".into()),
            obj("p", None, json!(1u64 << 40)),
        );
        objects.insert(
            (Kind::Rewrite, 1, "r".into()),
            json!({"created": "2026-01-01T00:00:00Z", "spec": {"poolRef": {"name": "p"}, "rules": [
                {"matches": [{"model": {"type": "Exact", "value": "a"}}], "targets": [{"modelRewrite": "b", "weight": 1}]}
            ]}}),
        );
        objects.insert(
            (Kind::Rewrite, 0, "bad".into()),
            json!({"created": "", "spec": {"poolRef": {"name": "p"}, "rules": [{"nope": 1}]}}),
        );
        let got = collect(&objects, "p", "inference.networking.k8s.io");
        let objectives: Vec<_> = got
            .objectives
            .iter()
            .map(|o| (o.name.as_str(), o.priority))
            .collect();
        assert_eq!(objectives, [("default-prio", 0), ("mine", 5)]);
        assert_eq!(got.rewrites.len(), 1);
        assert_eq!(got.rewrites[0].name, "llm-d.ai/r");
        assert_eq!(got.rewrites[0].rules[0].targets[0].model_rewrite, "b");
    }
}
