//! DRA claim objects (ResourceClaims, ResourceClaimTemplates) of queued namespaces,
//! kept between passes with which pods and Jobs name each, so that a claim changing
//! re-reads only the workloads it is counted for instead of deciding from scratch.
//!
//! A workload counts a claim by its spec alone (`claims.rs`), so a change that leaves
//! the spec as it was (the scheduler allocating, the kubelet reserving: status only)
//! changes nothing. A claim or template created, deleted or respecified re-reads the
//! workloads whose pods (or Job template) name it, and only those: a claim generated
//! from a template for a pod is named by no spec, so its life costs a lookup.

use super::super::cache::{Changes, Key, Store};
use super::super::claims::{named_by, ClaimIndex, ClaimObjects, ClaimSource};
use super::key_of;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A claim object named by some spec: (namespace, template or claim, name).
pub(super) type ClaimName = (String, ClaimSource, String);

/// An object that names claims: a pod, or a Job (its pod template).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum ClaimUser {
    Pod(Key),
    Job(Key),
}

#[derive(Clone, Debug, Default)]
pub(super) struct KeptClaims {
    templates: ClaimObjects,
    claims: ClaimObjects,
    /// Which pods and Jobs name each claim object, and what each names.
    users: BTreeMap<ClaimName, BTreeSet<ClaimUser>>,
    names: HashMap<ClaimUser, Vec<ClaimName>>,
}

/// The claim objects `spec` (a pod spec) names, in `namespace`.
fn names_in(namespace: &str, spec: &Value) -> Vec<ClaimName> {
    let entries = spec["resourceClaims"].as_array().into_iter().flatten();
    let mut out: Vec<ClaimName> = entries
        .filter_map(named_by)
        .map(|(source, name)| (namespace.to_string(), source, name.to_string()))
        .collect();
    out.sort();
    out.dedup();
    out
}

impl KeptClaims {
    /// The claim objects of the queued namespaces, and the pods and Jobs a pass read.
    pub(super) fn new(
        templates: Vec<Value>,
        claims: Vec<Value>,
        pods: &[Value],
        jobs: &[Value],
    ) -> Self {
        let mut kept = KeptClaims {
            templates: templates.into_iter().map(|v| (key_of(&v), v)).collect(),
            claims: claims.into_iter().map(|v| (key_of(&v), v)).collect(),
            ..KeptClaims::default()
        };
        for pod in pods {
            kept.note(ClaimUser::Pod(key_of(pod)), Some(pod));
        }
        for job in jobs {
            kept.note(ClaimUser::Job(key_of(job)), Some(job));
        }
        kept
    }

    /// The index a workload's claims are counted with.
    pub(super) fn index<'a>(&'a self, resources: &'a BTreeMap<String, String>) -> ClaimIndex<'a> {
        ClaimIndex::kept(&self.templates, &self.claims, resources)
    }

    /// Notes what `user` names now (`object`: the pod or Job as read, `None`: gone).
    pub(super) fn note(&mut self, user: ClaimUser, object: Option<&Value>) {
        let now = match (&user, object) {
            (ClaimUser::Pod((ns, _)), Some(pod)) => names_in(ns, &pod["spec"]),
            (ClaimUser::Job((ns, _)), Some(job)) => names_in(ns, &job["spec"]["template"]["spec"]),
            (_, None) => Vec::new(),
        };
        let before = match now.is_empty() {
            true => self.names.remove(&user).unwrap_or_default(),
            false => self
                .names
                .insert(user.clone(), now.clone())
                .unwrap_or_default(),
        };
        if before == now {
            return;
        }
        for name in &before {
            if let Some(users) = self.users.get_mut(name) {
                users.remove(&user);
                if users.is_empty() {
                    self.users.remove(name);
                }
            }
        }
        for name in now {
            self.users.entry(name).or_default().insert(user.clone());
        }
    }

    /// Takes the changes of `store` since generation `seen` in the `queued` namespaces
    /// (`source`: which kind it holds); returns the objects whose spec changed (created,
    /// deleted, respecified), or `None` when the store was listed again.
    pub(super) fn follow(
        &mut self,
        source: ClaimSource,
        store: &Store,
        seen: u64,
        queued: &BTreeSet<String>,
    ) -> Option<Vec<ClaimName>> {
        let Changes::Keys(keys) = store.changes_since(seen) else {
            return None;
        };
        let kept = match source {
            ClaimSource::Template => &mut self.templates,
            ClaimSource::Claim => &mut self.claims,
        };
        let mut respecified = Vec::new();
        for k in keys.into_iter().filter(|(ns, _)| queued.contains(ns)) {
            let now = store.get(&k);
            if now.as_ref().map(|v| &v["spec"]) != kept.get(&k).map(|v| &v["spec"]) {
                respecified.push((k.0.clone(), source, k.1.clone()));
            }
            match now {
                Some(v) => kept.insert(k, v),
                None => kept.remove(&k),
            };
        }
        Some(respecified)
    }

    /// The pods and Jobs that name any of `names`.
    pub(super) fn users_of<'a>(
        &'a self,
        names: &'a [ClaimName],
    ) -> impl Iterator<Item = &'a ClaimUser> + 'a {
        names.iter().filter_map(|n| self.users.get(n)).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::cache::Cache;
    use serde_json::json;

    fn pod(name: &str, claims: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "team"}, "spec": {"resourceClaims": claims}})
    }

    fn claim(name: &str, ns: &str, count: u32, allocated: bool) -> Value {
        let mut c = json!({"metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "count": count}}]}}});
        if allocated {
            c["status"] = json!({"allocation": {"devices": {"results": []}}});
        }
        c
    }

    fn users(kept: &KeptClaims, names: &[ClaimName]) -> Vec<ClaimUser> {
        kept.users_of(names).cloned().collect()
    }

    fn name(source: ClaimSource, n: &str) -> ClaimName {
        ("team".into(), source, n.into())
    }

    #[test]
    fn status_changes_are_not_changes_and_users_follow_their_pods() {
        let cache = Cache::new();
        let store = &cache.claims;
        store.replace(vec![claim("shared", "team", 1, false)]);
        let queued: BTreeSet<String> = ["team".to_string()].into();
        let pods = [
            pod("a", json!([{"name": "g", "resourceClaimName": "shared"}])),
            pod(
                "b",
                json!([{"name": "g", "resourceClaimTemplateName": "one"}]),
            ),
        ];
        let mut kept = KeptClaims::new(Vec::new(), store.values(), &pods, &[]);
        let seen = store.generation();
        // Allocated (status only), and a claim in a namespace without queues created.
        store.upsert(claim("shared", "team", 1, true));
        store.upsert(claim("shared", "other", 2, false));
        assert_eq!(
            kept.follow(ClaimSource::Claim, store, seen, &queued),
            Some(vec![])
        );
        // Respecified: its one user is re-read.
        let seen = store.generation();
        store.upsert(claim("shared", "team", 2, true));
        let moved = kept
            .follow(ClaimSource::Claim, store, seen, &queued)
            .unwrap_or_default();
        assert_eq!(moved, vec![name(ClaimSource::Claim, "shared")]);
        assert_eq!(
            users(&kept, &moved),
            vec![ClaimUser::Pod(("team".into(), "a".into()))]
        );
        let mapping = BTreeMap::new();
        let counted = kept.index(&mapping).devices("team", &pods[0]["spec"]);
        assert_eq!(counted, Ok([("gpu.tessera.io".to_string(), 2)].into()));
        // Deleted: the same user; the index no longer finds it.
        let seen = store.generation();
        store.remove(&("team".into(), "shared".into()));
        let moved = kept
            .follow(ClaimSource::Claim, store, seen, &queued)
            .unwrap_or_default();
        assert_eq!(users(&kept, &moved).len(), 1);
        let counted = kept.index(&mapping).devices("team", &pods[0]["spec"]);
        assert_eq!(
            counted.map_err(|e| e.0),
            Err("ResourceClaimNotFound".to_string())
        );
        // A pod gone names nothing; a Job naming the template is found by it.
        kept.note(ClaimUser::Pod(("team".into(), "b".into())), None);
        let job = json!({"metadata": {"name": "j", "namespace": "team"}, "spec": {"template": {"spec":
            {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "one"}]}}}});
        kept.note(ClaimUser::Job(("team".into(), "j".into())), Some(&job));
        assert_eq!(
            users(&kept, &[name(ClaimSource::Template, "one")]),
            vec![ClaimUser::Job(("team".into(), "j".into()))]
        );
        // Listed again: the caller decides from scratch.
        store.replace(Vec::new());
        assert_eq!(kept.follow(ClaimSource::Claim, store, seen, &queued), None);
    }
}
