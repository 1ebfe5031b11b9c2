//! Reading a pass's snapshot from the API server: the queue objects, the pods and Jobs
//! that name a queue (LIST by label), the owners of serving replicas and the DRA claims
//! they refer to (only in namespaces with a LocalQueue) — by LIST ([`snapshot`]) or from
//! the watch-fed [`Cache`] ([`snapshot_cached`], no request at all).

use super::cache::Cache;
use super::config::Config;
use super::error::{Error, Result};
use super::model::Snapshot;
use super::resources::{crd_resource, dra_resource, QUEUE_KINDS};
use super::time::Millis;
use super::workload_record::{record_name, recorded_admission, recorded_place};
use crate::quota::api::{ClusterQueue, LocalQueue, ResourceFlavor, WorkloadPriorityClass};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

async fn list_values(client: &kube::Client, ar: &ApiResource) -> Result<Vec<Value>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(Error::api(format!("list {}", ar.plural)))?;
    list.items
        .into_iter()
        .map(|o| {
            serde_json::to_value(o).map_err(|source| Error::Json {
                what: format!("encode {}", ar.plural),
                source,
            })
        })
        .collect()
}

/// The `Workload` records of every namespace (none while the kind is not installed).
async fn list_records(client: &kube::Client) -> Result<Vec<Value>> {
    match list_values(client, &crd_resource("Workload", "workloads")).await {
        Err(Error::Api {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Ok(Vec::new()),
        other => other,
    }
}

/// Converts listed objects to engine types one by one: a bad object is reported and
/// skipped, never fatal to the pass.
fn typed<T: serde::de::DeserializeOwned>(
    values: Vec<Value>,
    kind: &str,
    problems: &mut Vec<String>,
) -> Vec<T> {
    values
        .into_iter()
        .filter_map(|v| {
            let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
            match serde_path_to_error::deserialize(v) {
                Ok(t) => Some(t),
                Err(e) => {
                    problems.push(format!(
                        "{kind} {name:?}: field {}: {}",
                        e.path(),
                        e.inner()
                    ));
                    None
                }
            }
        })
        .collect()
}

/// The WorkloadPriorityClasses on the API server (also used by the webhook).
pub async fn list_priority_classes(client: &kube::Client) -> Result<Vec<WorkloadPriorityClass>> {
    let values = list_values(
        client,
        &crd_resource("WorkloadPriorityClass", "workloadpriorityclasses"),
    )
    .await?;
    Ok(typed(values, "WorkloadPriorityClass", &mut Vec::new()))
}

/// Label selectors of the objects that name a queue (one LIST each: a selector cannot
/// say "this label or that one").
/// Namespaces with a LocalQueue (a LocalQueue without a namespace counts as `default`):
/// only objects there can name a queue.
pub(super) fn queued_namespaces(local_queues: &[LocalQueue]) -> BTreeSet<String> {
    local_queues
        .iter()
        .map(|q| {
            q.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into())
        })
        .collect()
}

fn queue_selectors(cfg: &Config) -> Vec<String> {
    cfg.queue_labels().iter().map(|l| l.to_string()).collect()
}

/// Lists `ar` once per label selector (cluster-wide), without duplicates.
async fn list_selected(
    client: &kube::Client,
    ar: &ApiResource,
    selectors: &[String],
) -> Result<Vec<Value>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for selector in selectors {
        let list = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(Error::api(format!("list {} -l {selector}", ar.plural)))?;
        for o in list.items {
            let key = (o.metadata.namespace.clone(), o.metadata.name.clone());
            if seen.insert(key) {
                out.push(serde_json::to_value(o).map_err(|source| Error::Json {
                    what: format!("encode {}", ar.plural),
                    source,
                })?);
            }
        }
    }
    Ok(out)
}

/// Lists `ar` in each of `namespaces` (a kind the cluster may not serve reads as none
/// when `optional`).
async fn list_in(
    client: &kube::Client,
    ar: &ApiResource,
    namespaces: &BTreeSet<String>,
    optional: bool,
) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for ns in namespaces {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(s)) if optional && s.code == 404 => return Ok(Vec::new()),
            Err(e) => return Err(Error::api(format!("list {} in {ns}", ar.plural))(e)),
        };
        for o in list.items {
            out.push(serde_json::to_value(o).map_err(|source| Error::Json {
                what: format!("encode {}", ar.plural),
                source,
            })?);
        }
    }
    Ok(out)
}

/// The serving owners a cached pass reads: ReplicaSets (only when some pod is owned by
/// one: `replica_owned`), Deployments and StatefulSets of the queued namespaces.
pub(super) fn serving_objects(
    cache: &Cache,
    queued_ns: &BTreeSet<String>,
    replica_owned: bool,
) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let none = BTreeSet::new();
    (
        in_namespaces(
            &cache.replica_sets,
            if replica_owned { queued_ns } else { &none },
        ),
        in_namespaces(&cache.deployments, queued_ns),
        in_namespaces(&cache.stateful_sets, queued_ns),
    )
}

/// The objects of `store` in namespaces `ns`.
fn in_namespaces(store: &super::cache::Store, ns: &BTreeSet<String>) -> Vec<Value> {
    if ns.is_empty() {
        return Vec::new();
    }
    store.values_where(|v| {
        v["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| ns.contains(n))
    })
}

/// Whether `object` has an owner reference of `kind`.
pub(super) fn owned_by(object: &Value, kind: &str) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["kind"] == kind))
}

/// Whether any of `objects` refers to an owner of `kind` / has DRA claims at `claims`.
fn any_owned_by(objects: &[Value], kind: &str) -> bool {
    objects.iter().any(|o| owned_by(o, kind))
}

fn any_claims(objects: &[Value], spec: &str) -> bool {
    objects.iter().any(|o| {
        o.pointer(spec)
            .and_then(|c| c["resourceClaims"].as_array())
            .is_some_and(|c| !c.is_empty())
    })
}

/// Reads everything a pass needs. Unusable queue objects land in `problems`.
///
/// Pods and Jobs are listed by label (only those naming a queue); their owners
/// (ReplicaSets, Deployments, StatefulSets) and DRA claims only in namespaces that have
/// a LocalQueue, and only when some queued pod needs them.
pub async fn snapshot(
    client: &kube::Client,
    cfg: &Config,
    now: Millis,
    problems: &mut Vec<String>,
) -> Result<Snapshot> {
    let [rf, cq, lq, wpc] = QUEUE_KINDS.map(|(k, p)| crd_resource(k, p));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespaces = namespaces
        .list(&ListParams::default())
        .await
        .map_err(Error::api("list namespaces"))?
        .items
        .into_iter()
        .filter_map(|n| {
            let name = n.metadata.name?;
            let labels = n.metadata.labels.unwrap_or_default();
            Some((name, labels))
        })
        .collect();
    let local_queues = typed::<LocalQueue>(list_values(client, &lq).await?, "LocalQueue", problems);
    let queued_ns = queued_namespaces(&local_queues);
    let selectors = queue_selectors(cfg);
    let pods = list_selected(client, &ApiResource::erase::<Pod>(&()), &selectors).await?;
    let jobs = list_selected(client, &ApiResource::erase::<Job>(&()), &selectors).await?;
    let none = BTreeSet::new();
    let when = |needed: bool| if needed { &queued_ns } else { &none };
    let replica_owned = any_owned_by(&pods, "ReplicaSet");
    let claims_used = any_claims(&pods, "/spec") || any_claims(&jobs, "/spec/template/spec");
    // Read also without `waitForPodsReady`: the records hold the waiting workloads' places.
    let records = list_records(client).await?;
    Ok(Snapshot {
        now,
        flavors: typed::<ResourceFlavor>(
            list_values(client, &rf).await?,
            "ResourceFlavor",
            problems,
        ),
        cluster_queues: typed::<ClusterQueue>(
            list_values(client, &cq).await?,
            "ClusterQueue",
            problems,
        ),
        local_queues,
        priority_classes: typed::<WorkloadPriorityClass>(
            list_values(client, &wpc).await?,
            "WorkloadPriorityClass",
            problems,
        ),
        namespaces,
        replica_sets: list_in(
            client,
            &ApiResource::erase::<ReplicaSet>(&()),
            when(replica_owned),
            false,
        )
        .await?,
        // Also when no replica is left: an annotated Deployment scaled to zero is updated.
        deployments: list_in(
            client,
            &ApiResource::erase::<Deployment>(&()),
            &queued_ns,
            false,
        )
        .await?,
        stateful_sets: list_in(
            client,
            &ApiResource::erase::<StatefulSet>(&()),
            &queued_ns,
            false,
        )
        .await?,
        claim_templates: list_in(
            client,
            &dra_resource("ResourceClaimTemplate", "resourceclaimtemplates"),
            when(claims_used),
            true,
        )
        .await?,
        claims: list_in(
            client,
            &dra_resource("ResourceClaim", "resourceclaims"),
            when(claims_used),
            true,
        )
        .await?,
        record_places: record_places(&records),
        admitted_by: records.iter().filter_map(admission_entry).collect(),
        records: match cfg.pods_ready {
            Some(_) => records,
            None => Vec::new(),
        },
        pods,
        jobs,
        device_classes: cfg.device_classes.clone(),
        blocked: BTreeMap::new(),
        pods_ready: cfg.pods_ready.clone(),
    })
}

/// The places the `Workload` records show, by workload key.
fn record_places(records: &[Value]) -> BTreeMap<String, String> {
    records.iter().filter_map(place_entry).collect()
}

/// Record `v`'s workload key and the place it shows, owned.
fn place_entry(v: &Value) -> Option<(String, String)> {
    recorded_place(v).map(|(key, place)| (key.to_string(), place.to_string()))
}

/// Record `v`'s workload key and the ClusterQueue its admission names, owned.
fn admission_entry(v: &Value) -> Option<(String, String)> {
    recorded_admission(v).map(|(key, cq)| (key.to_string(), cq.to_string()))
}

/// The field `read` finds (with the workload key it names) on workload `key`'s
/// `Workload` record in the cache.
fn cached_record_field(
    cache: &Cache,
    key: &str,
    read: fn(&Value) -> Option<(&str, &str)>,
) -> Option<String> {
    let ns = key.split_once('/').map_or("", |(ns, _)| ns);
    cache
        .records
        .read_with(&(ns.to_string(), record_name(key)), |v| {
            read(v)
                .filter(|(k, _)| *k == key)
                .map(|(_, field)| field.to_string())
        })
        .flatten()
}

/// The ClusterQueue workload `key`'s `Workload` record in the cache says admitted it.
pub(super) fn record_admission(cache: &Cache, key: &str) -> Option<String> {
    cached_record_field(cache, key, recorded_admission)
}

/// The places the cached `Workload` records show, by workload key, as they will be once
/// the writes under way land.
fn cached_places(cache: &Cache) -> BTreeMap<String, String> {
    let mut places = cache.records.filter_map(place_entry).into_iter().collect();
    cache.asked_places.overlay(&mut places);
    places
}

/// The place workload `key`'s `Workload` record shows in the cache (or is asked to show
/// by a write under way), if any.
pub(super) fn record_place(cache: &Cache, key: &str) -> Option<String> {
    if let Some(asked) = cache.asked_places.asked(key) {
        return asked;
    }
    cached_record_field(cache, key, recorded_place)
}

/// The same snapshot as [`snapshot`], read from the watch-fed stores (no request).
/// Owners and claims are kept only in namespaces with a LocalQueue, and only when some
/// queued pod needs them, as the LISTs do.
pub fn snapshot_cached(
    cache: &Cache,
    cfg: &Config,
    now: Millis,
    problems: &mut Vec<String>,
) -> Snapshot {
    let queues = queue_objects_cached(cache, problems);
    let queued_ns = queued_namespaces(&queues.local_queues);
    let union = |stores: &[super::cache::Store]| -> Vec<Value> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for s in stores {
            for v in s.values() {
                let key = (
                    v["metadata"]["namespace"].as_str().map(String::from),
                    v["metadata"]["name"].as_str().map(String::from),
                );
                if seen.insert(key) {
                    out.push(v);
                }
            }
        }
        out
    };
    let pods = union(&cache.pods);
    let jobs = union(&cache.jobs);
    let none = BTreeSet::new();
    let when = |needed: bool| if needed { &queued_ns } else { &none };
    let replica_owned = any_owned_by(&pods, "ReplicaSet");
    let (replica_sets, deployments, stateful_sets) =
        serving_objects(cache, &queued_ns, replica_owned);
    let claims_used = any_claims(&pods, "/spec") || any_claims(&jobs, "/spec/template/spec");
    Snapshot {
        now,
        replica_sets,
        deployments,
        stateful_sets,
        claim_templates: in_namespaces(&cache.claim_templates, when(claims_used)),
        claims: in_namespaces(&cache.claims, when(claims_used)),
        record_places: cached_places(cache),
        admitted_by: cache
            .records
            .filter_map(admission_entry)
            .into_iter()
            .collect(),
        // Only the records holding a requeue state: the only ones a pass reads.
        records: match cfg.pods_ready {
            Some(_) => cache
                .records
                .values_where(|r| r["status"]["requeueState"].is_object()),
            None => Vec::new(),
        },
        pods,
        jobs,
        device_classes: cfg.device_classes.clone(),
        blocked: BTreeMap::new(),
        pods_ready: cfg.pods_ready.clone(),
        ..queues
    }
}

/// The queue objects (ResourceFlavors, ClusterQueues, LocalQueues,
/// WorkloadPriorityClasses) and namespaces in the watch-fed stores, as a snapshot
/// holding nothing else; objects that cannot be read are reported in `problems`.
pub(super) fn queue_objects_cached(cache: &Cache, problems: &mut Vec<String>) -> Snapshot {
    let [rf, cq, lq, wpc] = &cache.queues;
    let namespaces = cache
        .namespaces
        .values()
        .into_iter()
        .filter_map(|n| {
            let name = n["metadata"]["name"].as_str()?.to_string();
            let labels = n["metadata"]["labels"]
                .as_object()
                .map(|l| {
                    l.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            Some((name, labels))
        })
        .collect();
    let local_queues = typed::<LocalQueue>(lq.values(), "LocalQueue", problems);
    Snapshot {
        flavors: typed::<ResourceFlavor>(rf.values(), "ResourceFlavor", problems),
        cluster_queues: typed::<ClusterQueue>(cq.values(), "ClusterQueue", problems),
        local_queues,
        priority_classes: typed::<WorkloadPriorityClass>(
            wpc.values(),
            "WorkloadPriorityClass",
            problems,
        ),
        namespaces,
        ..Snapshot::default()
    }
}
