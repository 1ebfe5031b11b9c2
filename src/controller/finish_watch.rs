//! Follows the cache's pods and Jobs for workloads that finished and gives the `Finished`
//! updates of their records ([`super::finished`]), as Kueue's workload controller does
//! beside its scheduler: after each pass, only the pods and Jobs that changed since the
//! last look are read (all of them on the first look and after a LIST replaced a
//! store), so a restarted controller marks what finished while it was away.
//!
//! ```text
//! changed pods ─► done? ─► workload key ─► its pods in the namespace all done? ─┐
//! changed Jobs ─► Complete / Failed ─────────────────────────────────────────────┴─► record in the cache lacks Finished ─► Update
//! ```

use super::cache::{Cache, Changes, Key, Store};
use super::finished::{self, Outcome};
use super::workload_record::{record_name, Update};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What was seen of the pods' and Jobs' stores at the last look.
#[derive(Clone, Debug, Default)]
pub struct FinishWatch {
    /// Each store's generation (pods' stores, then Jobs'); `None` before the first look.
    seen: Option<Vec<u64>>,
}

impl FinishWatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// The updates of the records of workloads finished among the objects changed since
    /// the last look (their records in `cache`, not yet marked). Cost: the changed pods
    /// and Jobs, and for each finished pod the pods of its namespace.
    pub fn updates(&mut self, cache: &Cache) -> Vec<Update> {
        let stores: Vec<&Store> = cache.pods.iter().chain(&cache.jobs).collect();
        let now: Vec<u64> = stores.iter().map(|s| s.generation()).collect();
        let seen = self.seen.replace(now);
        let since = |i: usize| seen.as_ref().and_then(|g| g.get(i).copied());
        let n_pods = cache.pods.len();
        let mut groups: BTreeSet<String> = BTreeSet::new();
        for (i, s) in stores.iter().enumerate().take(n_pods) {
            groups.extend(changed(s, since(i), finished::done_pod_key));
        }
        let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
        for key in groups {
            let Some((ns, _)) = key.split_once('/') else {
                continue;
            };
            if let Some(o) = finished::pods_outcome(&pods_of(cache, ns, &key)) {
                outcomes.insert(key, o);
            }
        }
        for (i, s) in stores.iter().enumerate().skip(n_pods) {
            outcomes.extend(changed(s, since(i), finished::job_outcome));
        }
        outcomes
            .into_iter()
            .filter(|(key, _)| {
                let ns = key.split_once('/').map_or("", |(ns, _)| ns);
                let record = cache.records.get(&(ns.to_string(), record_name(key)));
                finished::needs_finished(record.as_ref(), key)
            })
            .map(|(key, o)| finished::update(&key, &o))
            .collect()
    }
}

/// `f` of each object of `s` changed after generation `since` (of every object without
/// one, or when a LIST replaced the store since), without copying them.
fn changed<T>(s: &Store, since: Option<u64>, f: impl Fn(&Value) -> Option<T>) -> Vec<T> {
    match since.map(|g| s.changes_since(g)) {
        Some(Changes::Keys(keys)) => keys
            .iter()
            .filter_map(|k| s.read_with(k, &f).flatten())
            .collect(),
        _ => s.filter_map(f),
    }
}

/// The pods in namespace `ns` that carry workload key `key` (each once, from whichever
/// label's store holds it).
fn pods_of(cache: &Cache, ns: &str, key: &str) -> Vec<Value> {
    let mut seen: BTreeSet<Key> = BTreeSet::new();
    let mut out = Vec::new();
    for s in &cache.pods {
        for p in s.in_namespace(ns) {
            let k = (
                ns.to_string(),
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
            );
            if super::workloads::pod_key(&p).as_deref() == Some(key) && seen.insert(k) {
                out.push(p);
            }
        }
    }
    out
}
