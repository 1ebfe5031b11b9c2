//! Serving workloads: replica pods of a Deployment (through its ReplicaSet), a bare
//! ReplicaSet or a StatefulSet. Each replica is a workload of its own in the engine (as
//! `tessera plan` models serving: one workload per replica), named after its owner, so
//! the replicas of one owner are admitted one by one up to quota and a scale-down (the
//! ReplicaSet deleting pods) returns their quota to the cohort. The owner gets the
//! annotation `tessera.io/admitted-replicas: "<admitted>/<desired>"`.
//!
//! ```text
//! Pod ─ownerRef─► ReplicaSet ─ownerRef─► Deployment     owner = Deployment ns/name
//! Pod ─ownerRef─► ReplicaSet (no owner)                 owner = ReplicaSet ns/name
//! Pod ─ownerRef─► StatefulSet                           owner = StatefulSet ns/name
//! ```

use super::time::{millis, rfc3339, Millis};
use serde_json::Value;
use std::collections::BTreeMap;

/// Annotation on a serving owner: `"<admitted>/<desired>"` replicas.
pub const ADMITTED_REPLICAS_ANNOTATION: &str = "tessera.io/admitted-replicas";

/// Kind of a serving owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServingKind {
    Deployment,
    ReplicaSet,
    StatefulSet,
}

impl ServingKind {
    /// The Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            ServingKind::Deployment => "Deployment",
            ServingKind::ReplicaSet => "ReplicaSet",
            ServingKind::StatefulSet => "StatefulSet",
        }
    }

    /// Prefix of the replicas' workload names (`deployment-web.<pod>`).
    fn prefix(self) -> &'static str {
        match self {
            ServingKind::Deployment => "deployment",
            ServingKind::ReplicaSet => "replicaset",
            ServingKind::StatefulSet => "statefulset",
        }
    }
}

/// The object whose replicas a pod is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    pub kind: ServingKind,
    pub namespace: String,
    pub name: String,
}

impl Owner {
    /// Engine name of the replica `pod` of this owner.
    pub fn replica_name(&self, pod: &str) -> String {
        format!("{}-{}.{pod}", self.kind.prefix(), self.name)
    }

    /// `Deployment team/web`.
    pub fn describe(&self) -> String {
        format!("{} {}/{}", self.kind.kind(), self.namespace, self.name)
    }
}

/// The `apps/v1` controller owner reference of `kind` on `object`, if any.
fn controller_ref<'a>(object: &'a Value, kinds: &[&str]) -> Option<(&'a str, &'a str)> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .filter(|r| r["apiVersion"] == "apps/v1")
        .filter(|r| r["controller"].as_bool().unwrap_or(true))
        .find_map(|r| {
            let kind = r["kind"].as_str()?;
            let name = r["name"].as_str()?;
            kinds.contains(&kind).then_some((kind, name))
        })
}

/// Serving objects of a snapshot, by `(namespace, name)`.
#[derive(Clone, Debug, Default)]
pub struct ServingIndex<'a> {
    replica_sets: BTreeMap<(String, String), &'a Value>,
    owners: BTreeMap<Owner, &'a Value>,
}

fn ns_name(v: &Value) -> (String, String) {
    (
        v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
        v["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

impl<'a> ServingIndex<'a> {
    /// Indexes the listed ReplicaSets, Deployments and StatefulSets.
    pub fn new(replica_sets: &'a [Value], deployments: &'a [Value], stateful: &'a [Value]) -> Self {
        let mut index = ServingIndex::default();
        for rs in replica_sets {
            index.replica_sets.insert(ns_name(rs), rs);
            let (namespace, name) = ns_name(rs);
            if controller_ref(rs, &["Deployment"]).is_none() {
                let o = Owner {
                    kind: ServingKind::ReplicaSet,
                    namespace,
                    name,
                };
                index.owners.insert(o, rs);
            }
        }
        for (kind, list) in [
            (ServingKind::Deployment, deployments),
            (ServingKind::StatefulSet, stateful),
        ] {
            for v in list {
                let (namespace, name) = ns_name(v);
                index.owners.insert(
                    Owner {
                        kind,
                        namespace,
                        name,
                    },
                    v,
                );
            }
        }
        index
    }

    /// The serving owner of `pod`: its StatefulSet, or its ReplicaSet's Deployment (the
    /// ReplicaSet itself when it has none, or when it is not listed yet).
    pub fn owner_of(&self, pod: &Value) -> Option<Owner> {
        let (namespace, _) = ns_name(pod);
        let (kind, name) = controller_ref(pod, &["ReplicaSet", "StatefulSet"])?;
        if kind == "StatefulSet" {
            return Some(Owner {
                kind: ServingKind::StatefulSet,
                namespace,
                name: name.to_string(),
            });
        }
        let rs = self
            .replica_sets
            .get(&(namespace.clone(), name.to_string()));
        match rs.and_then(|rs| controller_ref(rs, &["Deployment"])) {
            Some((_, deployment)) => Some(Owner {
                kind: ServingKind::Deployment,
                namespace,
                name: deployment.to_string(),
            }),
            None => Some(Owner {
                kind: ServingKind::ReplicaSet,
                namespace,
                name: name.to_string(),
            }),
        }
    }

    /// The owner object as listed (`None` when it is not in the snapshot).
    pub fn object(&self, owner: &Owner) -> Option<&'a Value> {
        self.owners.get(owner).copied()
    }

    /// Every listed owner (ReplicaSets only when no Deployment owns them).
    pub fn owners(&self) -> impl Iterator<Item = (Owner, &'a Value)> + '_ {
        self.owners.iter().map(|(o, v)| (o.clone(), *v))
    }
}

/// The ReplicaSet controlling `pod` (namespace, name), where [`ServingIndex::owner_of`]
/// goes through one.
pub fn replica_set_of(pod: &Value) -> Option<(String, String)> {
    let (kind, name) = controller_ref(pod, &["ReplicaSet", "StatefulSet"])?;
    (kind == "ReplicaSet").then(|| (ns_name(pod).0, name.to_string()))
}

/// Each listed ReplicaSet's Deployment (its controller), by `(namespace, name)`: what
/// decides the owner, and so the workload key, of the ReplicaSet's pods.
pub fn replica_set_owners(replica_sets: &[Value]) -> BTreeMap<(String, String), Option<String>> {
    replica_sets
        .iter()
        .map(|rs| {
            let deployment = controller_ref(rs, &["Deployment"]).map(|(_, n)| n.to_string());
            (ns_name(rs), deployment)
        })
        .collect()
}

/// Desired replicas of an owner object (`spec.replicas`, 1 when unset, as the API
/// server defaults it).
pub fn desired_replicas(owner: &Value) -> u32 {
    owner["spec"]["replicas"]
        .as_u64()
        .map_or(1, |r| r.min(u32::MAX as u64) as u32)
}

/// On a serving owner an InferenceScaler scaled up: when (RFC 3339, the time of the
/// scale-up), written with [`PREEMPT_NOT_BEFORE_ANNOTATION`].
pub const SCALED_UP_AT_ANNOTATION: &str = "tessera.io/scaled-up-at";
/// Until when (RFC 3339) the replicas that scale-up added may not preempt: the scaler's
/// `preemption.persistSeconds` for demand to persist (absent: an urgent scale-up, at once).
pub const PREEMPT_NOT_BEFORE_ANNOTATION: &str = "tessera.io/preempt-not-before";

/// When a replica of `owner` created at `created` may first preempt: the window of the
/// owner's last scale-up, for the replicas created by it (at or after it); `None` for
/// replicas from before it, or when the owner records none.
pub fn preempt_not_before(owner: &Value, created: Millis) -> Option<Millis> {
    let annotations = &owner["metadata"]["annotations"];
    let at = annotations[SCALED_UP_AT_ANNOTATION]
        .as_str()
        .and_then(millis)?;
    let until = annotations[PREEMPT_NOT_BEFORE_ANNOTATION]
        .as_str()
        .and_then(millis)?;
    (created >= at).then_some(until)
}

/// On a serving owner an InferenceScaler scaled down coupled with quota: the capacity
/// its replicas freed, held from expensive borrowers (`quota/hold.rs`). JSON:
/// `{"replicas":4,"until":"2026-12-05T22:00:00Z","maxReworkSeconds":300}`: the
/// replicas before the scale-down (the peak, when holds overlap), when the hold ends
/// (RFC 3339) and the most work a borrower of the held capacity may lose when reclaimed.
pub const HOLD_FREED_ANNOTATION: &str = "tessera.io/hold-freed";

/// A [`HOLD_FREED_ANNOTATION`] as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldRecord {
    /// Replicas before the scale-down: their usage is held.
    pub replicas: u32,
    /// The hold ends then.
    pub until: Millis,
    pub max_rework: Millis,
}

/// The annotation's JSON form.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HoldJson {
    replicas: u32,
    until: String,
    max_rework_seconds: u64,
}

impl HoldRecord {
    /// The hold recorded on `owner`: `Ok(None)` without one, `Err` (what is wrong) when
    /// the annotation cannot be read.
    pub fn read(owner: &Value) -> Result<Option<HoldRecord>, String> {
        let Some(text) = owner["metadata"]["annotations"][HOLD_FREED_ANNOTATION].as_str() else {
            return Ok(None);
        };
        let bad = |why: String| format!("annotation {HOLD_FREED_ANNOTATION} {text:?}: {why}");
        let json: HoldJson = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let until = millis(&json.until)
            .ok_or_else(|| bad(format!("until {:?} is not an RFC 3339 time", json.until)))?;
        Ok(Some(HoldRecord {
            replicas: json.replicas,
            until,
            max_rework: json.max_rework_seconds.saturating_mul(1000),
        }))
    }

    /// The annotation's value (`max_rework` in whole seconds, rounded up).
    pub fn annotation(&self) -> String {
        let json = HoldJson {
            replicas: self.replicas,
            until: rfc3339(self.until),
            max_rework_seconds: self.max_rework.div_ceil(1000),
        };
        serde_json::to_string(&json).unwrap_or_default()
    }

    /// This hold and `earlier` (recorded before, if it still stands at `now`) as one:
    /// the peak replicas, the later end, the lower rework.
    pub fn merged(self, earlier: Option<HoldRecord>, now: Millis) -> HoldRecord {
        match earlier.filter(|e| e.until > now) {
            Some(e) => HoldRecord {
                replicas: self.replicas.max(e.replicas),
                until: self.until.max(e.until),
                max_rework: self.max_rework.min(e.max_rework),
            },
            None => self,
        }
    }
}

/// The `tessera.io/admitted-replicas` value last written on the owner.
pub fn recorded_replicas(owner: &Value) -> Option<&str> {
    owner["metadata"]["annotations"][ADMITTED_REPLICAS_ANNOTATION].as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_replicas_a_scale_up_created_wait_for_its_window() {
        let owner = json!({"metadata": {"annotations": {
            SCALED_UP_AT_ANNOTATION: "2026-12-05T21:00:00Z",
            PREEMPT_NOT_BEFORE_ANNOTATION: "2026-12-05T21:02:00Z"}}});
        let at = millis("2026-12-05T21:00:00Z").unwrap();
        let until = millis("2026-12-05T21:02:00Z").unwrap();
        assert_eq!(preempt_not_before(&owner, at), Some(until));
        assert_eq!(preempt_not_before(&owner, at + 500), Some(until));
        assert_eq!(preempt_not_before(&owner, at - 1), None, "an older replica");
        let urgent =
            json!({"metadata": {"annotations": {SCALED_UP_AT_ANNOTATION: "2026-12-05T21:00:00Z"}}});
        assert_eq!(preempt_not_before(&urgent, at), None);
        assert_eq!(preempt_not_before(&json!({}), at), None);
    }

    #[test]
    fn a_hold_is_read_back_as_written_and_merged_at_its_peak() {
        let at = millis("2026-12-05T21:00:00Z").unwrap();
        let hold = HoldRecord {
            replicas: 4,
            until: at + 3_600_000,
            max_rework: 300_000,
        };
        let text = hold.annotation();
        assert_eq!(
            text,
            r#"{"replicas":4,"until":"2026-12-05T22:00:00Z","maxReworkSeconds":300}"#
        );
        let owner = json!({"metadata": {"annotations": {HOLD_FREED_ANNOTATION: text}}});
        assert_eq!(HoldRecord::read(&owner), Ok(Some(hold)));
        assert_eq!(HoldRecord::read(&json!({})), Ok(None));
        for bad in [
            "4@2026-12-05T22:00:00Z",
            r#"{"replicas":4,"until":"tomorrow","maxReworkSeconds":300}"#,
            r#"{"replicas":-1,"until":"2026-12-05T22:00:00Z","maxReworkSeconds":300}"#,
            r#"{"replica":4,"until":"2026-12-05T22:00:00Z","maxReworkSeconds":300}"#,
        ] {
            let owner = json!({"metadata": {"annotations": {HOLD_FREED_ANNOTATION: bad}}});
            let err = HoldRecord::read(&owner).unwrap_err();
            assert!(err.contains(HOLD_FREED_ANNOTATION), "{err}");
        }
        // A second scale-down while the first hold stands: the peak and the later end.
        let second = HoldRecord {
            replicas: 2,
            until: at + 4_000_000,
            max_rework: 600_000,
        };
        let merged = second.merged(Some(hold), at + 400_000);
        assert_eq!((merged.replicas, merged.until), (4, at + 4_000_000));
        assert_eq!(merged.max_rework, 300_000);
        // After the first hold ended, only the second counts.
        assert_eq!(second.merged(Some(hold), at + 3_600_000), second);
    }

    fn owned(kind: &str, name: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "team",
               "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": name,
                                    "uid": "u", "controller": true}]}})
    }

    #[test]
    fn owners_are_resolved_through_replica_sets() {
        let rs_of_web = json!({"metadata": {"name": "web-6f9", "namespace": "team",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                 "uid": "d", "controller": true}]}});
        let bare_rs = json!({"metadata": {"name": "bare", "namespace": "team"}});
        let rss = [rs_of_web, bare_rs];
        let deployments = [json!({"metadata": {"name": "web", "namespace": "team"}})];
        let index = ServingIndex::new(&rss, &deployments, &[]);
        let owner = |kind, name: &str| {
            Some(Owner {
                kind,
                namespace: "team".into(),
                name: name.into(),
            })
        };
        let cases = [
            (
                "deployment",
                owned("ReplicaSet", "web-6f9"),
                owner(ServingKind::Deployment, "web"),
            ),
            (
                "bare replica set",
                owned("ReplicaSet", "bare"),
                owner(ServingKind::ReplicaSet, "bare"),
            ),
            (
                "replica set not listed yet",
                owned("ReplicaSet", "new-1"),
                owner(ServingKind::ReplicaSet, "new-1"),
            ),
            (
                "stateful set",
                owned("StatefulSet", "db"),
                owner(ServingKind::StatefulSet, "db"),
            ),
            ("job-owned", owned("Job", "train"), None),
            (
                "no owner",
                json!({"metadata": {"name": "p", "namespace": "team"}}),
                None,
            ),
        ];
        for (name, pod, want) in cases {
            assert_eq!(index.owner_of(&pod), want, "{name}");
        }
        let web = owner(ServingKind::Deployment, "web").unwrap();
        assert!(index.object(&web).is_some());
        assert_eq!(web.replica_name("web-6f9-x"), "deployment-web.web-6f9-x");
        assert_eq!(
            desired_replicas(&json!({"spec": {"replicas": 3}})),
            3,
            "spec.replicas"
        );
        assert_eq!(desired_replicas(&json!({"spec": {}})), 1, "defaulted");
    }
}
