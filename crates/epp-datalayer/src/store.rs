//! The endpoint set: updated by discovery sources, read lock-free per request.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::Arc,
};

use arc_swap::ArcSwap;
use epp_core::{
    Endpoint, EndpointId, EndpointMetrics, EndpointSnapshot, EndpointSource, InflightSample,
};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::Error;

/// An endpoint as a discovery source describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSpec {
    /// Address requests go to.
    pub addr: SocketAddr,
    /// Labels (engine type, role, ...).
    pub labels: BTreeMap<String, String>,
    /// What the source calls it (a pod, `<pod>-rank-<i>`); `None`: its
    /// address names it.
    pub name: Option<Arc<str>>,
}

impl EndpointSpec {
    /// An endpoint without labels.
    #[must_use]
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            labels: BTreeMap::new(),
            name: None,
        }
    }
}

/// Parses `ip:port` items (as given to `--endpoints`), ignoring empty ones.
///
/// # Errors
/// The first item that is not `ip:port`.
pub fn parse_endpoint_list<S: AsRef<str>>(items: &[S]) -> Result<Vec<EndpointSpec>, Error> {
    items
        .iter()
        .map(|s| s.as_ref().trim())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<SocketAddr>()
                .map(EndpointSpec::new)
                .map_err(|_| Error::BadEndpoint(format!("{s:?} is not ip:port")))
        })
        .collect()
}

#[derive(Debug, Default)]
struct Writer {
    /// Endpoints per discovery source.
    sources: BTreeMap<String, Vec<EndpointSpec>>,
    /// Ids ever given, by address: an address keeps its id, and an id never
    /// names another address.
    ids: HashMap<SocketAddr, EndpointId>,
    next_id: u32,
    /// Why a source has no endpoints, when it knows (by source).
    empty_reasons: BTreeMap<String, String>,
}

/// The set of endpoints. Discovery sources replace their own part; readers
/// get an immutable snapshot without locking.
#[derive(Debug)]
pub struct EndpointStore {
    current: ArcSwap<EndpointSnapshot>,
    writer: Mutex<Writer>,
    /// Bumped after every change, so the scrapers follow without polling.
    generation: watch::Sender<u64>,
}

impl Default for EndpointStore {
    fn default() -> Self {
        Self {
            current: ArcSwap::default(),
            writer: Mutex::default(),
            generation: watch::Sender::new(0),
        }
    }
}

impl EndpointStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A receiver that sees a new value after every change of the set.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Adds (or relabels) one endpoint of `source`.
    pub fn upsert(&self, source: &str, endpoint: EndpointSpec) {
        let mut w = self.writer.lock();
        let list = w.sources.entry(source.to_owned()).or_default();
        match list.iter_mut().find(|s| s.addr == endpoint.addr) {
            Some(s) => *s = endpoint,
            None => list.push(endpoint),
        }
        self.publish(&mut w);
    }

    /// Removes one endpoint of `source` (it stays if another source has it).
    pub fn remove(&self, source: &str, addr: SocketAddr) {
        let mut w = self.writer.lock();
        if let Some(list) = w.sources.get_mut(source) {
            list.retain(|s| s.addr != addr);
            if list.is_empty() {
                w.sources.remove(source);
            }
        }
        self.publish(&mut w);
    }

    /// Replaces the endpoints contributed by `source` (other sources' stay).
    /// Endpoints that stay keep their identity and metrics; a changed label
    /// set keeps the id and metrics too.
    pub fn replace_source(&self, source: &str, endpoints: Vec<EndpointSpec>) {
        let mut w = self.writer.lock();
        if endpoints.is_empty() {
            w.sources.remove(source);
        } else {
            w.sources.insert(source.to_owned(), endpoints);
        }
        self.publish(&mut w);
    }

    /// Says why `source` has no endpoints (a deleted pool, a selector that
    /// matches no Ready pod), or clears it with `None`. When the whole set is
    /// empty, the snapshot carries every source's reason, so a refused
    /// request can tell the client why rather than only that nothing is there.
    pub fn set_empty_reason(&self, source: &str, reason: Option<String>) {
        let mut w = self.writer.lock();
        let changed = match reason {
            Some(r) => w.empty_reasons.insert(source.to_owned(), r.clone()) != Some(r),
            None => w.empty_reasons.remove(source).is_some(),
        };
        if changed {
            self.publish(&mut w);
        }
    }

    /// Rebuilds the snapshot from every source's endpoints (writer lock held).
    fn publish(&self, w: &mut Writer) {
        let old = self.current.load_full();
        type Merged = (BTreeMap<String, String>, Option<Arc<str>>);
        let mut merged: BTreeMap<SocketAddr, Merged> = BTreeMap::new();
        for spec in w.sources.values().flatten() {
            let (labels, name) = merged.entry(spec.addr).or_default();
            labels.extend(spec.labels.clone());
            // The first source (by name) that names the address names it.
            if name.is_none() {
                name.clone_from(&spec.name);
            }
        }
        let mut next = Vec::with_capacity(merged.len());
        for (addr, (labels, name)) in merged {
            let existing = old.by_addr(addr);
            match existing {
                Some(e) if *e.labels() == labels && e.given_name() == name.as_ref() => {
                    next.push(Arc::clone(e));
                }
                _ => {
                    let id = match w.ids.get(&addr) {
                        Some(&id) => id,
                        None => {
                            let id = EndpointId(w.next_id);
                            w.next_id += 1;
                            w.ids.insert(addr, id);
                            id
                        }
                    };
                    let e = Arc::new(Endpoint::with_labels(id, addr, labels).with_name(name));
                    if let Some(old) = existing {
                        // The new object's in-flight counters start at zero,
                        // so the old ones' scrape-time counts do not apply.
                        e.set_metrics(EndpointMetrics {
                            inflight_at_scrape: InflightSample::default(),
                            ..(*old.metrics()).clone()
                        });
                    }
                    next.push(e);
                }
            }
        }
        let reason = (next.is_empty() && !w.empty_reasons.is_empty()).then(|| {
            let all: Vec<&str> = w.empty_reasons.values().map(String::as_str).collect();
            Arc::<str>::from(all.join("; "))
        });
        self.current.store(Arc::new(
            EndpointSnapshot::new(next).with_empty_reason(reason),
        ));
        self.generation.send_modify(|g| *g += 1);
    }
}

impl EndpointSource for EndpointStore {
    fn snapshot(&self) -> Arc<EndpointSnapshot> {
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> EndpointSpec {
        EndpointSpec::new(s.parse().unwrap())
    }

    #[test]
    fn sources_merge_and_ids_are_stable() {
        let store = EndpointStore::new();
        store.replace_source("a", vec![spec("10.0.0.1:80"), spec("10.0.0.2:80")]);
        store.replace_source("b", vec![spec("10.0.0.3:80")]);
        let snap = store.snapshot();
        assert_eq!(snap.len(), 3);
        let e1 = Arc::clone(snap.by_addr("10.0.0.1:80".parse().unwrap()).unwrap());
        e1.set_metrics(epp_core::EndpointMetrics {
            waiting: 7,
            ..Default::default()
        });

        store.replace_source("a", vec![spec("10.0.0.1:80")]);
        let snap = store.snapshot();
        assert_eq!(snap.len(), 2);
        let again = snap.by_addr("10.0.0.1:80".parse().unwrap()).unwrap();
        assert!(
            Arc::ptr_eq(&e1, again),
            "unchanged endpoints keep their identity"
        );

        let mut labelled = spec("10.0.0.1:80");
        labelled
            .labels
            .insert("llm-d.ai/role".into(), "decode".into());
        store.replace_source("a", vec![labelled, spec("10.0.0.2:80")]);
        let snap = store.snapshot();
        let relabelled = snap.by_addr("10.0.0.1:80".parse().unwrap()).unwrap();
        assert_eq!(relabelled.id(), e1.id());
        assert_eq!(
            relabelled.metrics().waiting,
            7,
            "metrics survive a label change"
        );
        assert_eq!(relabelled.label("llm-d.ai/role"), Some("decode"));
        let ids: Vec<u32> = snap.endpoints().iter().map(|e| e.id().0).collect();
        assert_eq!(ids, vec![0, 1, 2], "10.0.0.2 came back with its old id");
    }

    #[test]
    fn names_are_carried_and_a_new_name_keeps_the_id() {
        let store = EndpointStore::new();
        store.replace_source("a", vec![spec("10.0.0.1:80")]);
        let unnamed = Arc::clone(&store.snapshot().endpoints()[0]);
        assert_eq!(unnamed.name(), "10.0.0.1:80", "unnamed: the address");
        let mut named = spec("10.0.0.1:80");
        named.name = Some("pod-rank-0".into());
        store.replace_source("a", vec![named]);
        let e = Arc::clone(&store.snapshot().endpoints()[0]);
        assert_eq!(e.name(), "pod-rank-0");
        assert_eq!(e.id(), unnamed.id());
    }

    #[test]
    fn an_empty_set_carries_the_sources_reasons() {
        let store = EndpointStore::new();
        store.set_empty_reason("k8s", Some("InferencePool ns/p was deleted".into()));
        assert_eq!(
            store.snapshot().empty_reason(),
            Some("InferencePool ns/p was deleted")
        );
        // Another source's endpoints: nothing to explain.
        store.replace_source("file", vec![spec("10.0.0.1:80")]);
        assert_eq!(store.snapshot().empty_reason(), None);
        store.replace_source("file", Vec::new());
        store.set_empty_reason("file", Some("endpoints file is empty".into()));
        assert_eq!(
            store.snapshot().empty_reason(),
            Some("endpoints file is empty; InferencePool ns/p was deleted")
        );
        store.set_empty_reason("k8s", None);
        store.set_empty_reason("file", None);
        assert_eq!(store.snapshot().empty_reason(), None);
    }

    #[test]
    fn endpoint_lists_are_validated() {
        assert_eq!(
            parse_endpoint_list(&["1.2.3.4:5", " ", "[::1]:8"])
                .unwrap()
                .len(),
            2
        );
        let e = parse_endpoint_list(&["1.2.3.4"]).unwrap_err();
        assert!(e.to_string().contains("\"1.2.3.4\" is not ip:port"), "{e}");
    }

    #[test]
    fn upsert_remove_and_change_notifications() {
        let store = EndpointStore::new();
        let mut changes = store.subscribe();
        store.upsert("k8s", spec("10.0.0.1:80"));
        store.upsert("k8s", spec("10.0.0.2:80"));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let mut relabelled = spec("10.0.0.1:80");
        relabelled.labels.insert("a".into(), "b".into());
        store.upsert("k8s", relabelled);
        assert_eq!(store.snapshot().len(), 2);
        assert_eq!(
            store
                .snapshot()
                .by_addr("10.0.0.1:80".parse().unwrap())
                .unwrap()
                .label("a"),
            Some("b")
        );
        store.upsert("file", spec("10.0.0.2:80"));
        store.remove("k8s", "10.0.0.2:80".parse().unwrap());
        assert_eq!(store.snapshot().len(), 2, "still listed by the file source");
        store.remove("file", "10.0.0.2:80".parse().unwrap());
        assert_eq!(store.snapshot().len(), 1);
        assert!(changes.has_changed().unwrap());
    }
}
