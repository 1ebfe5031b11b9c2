//! Publishing this node's ResourceSlices and keeping them published.
//!
//! ```text
//! desired slices ──▶ LIST ours (fieldSelector spec.nodeName, spec.driver)
//!                    ──▶ diff (pure): create / replace / delete
//!                    ──▶ write, then compare what the API server stored with what was sent:
//!                        a field it dropped means a feature gate is off ──▶ delete those
//!                        slices (their devices would be mis-allocated) and report the gate
//! WATCH ours ──▶ any change not made by us (a kubelet wiping slices at start, an admin
//!               edit, drift) ──▶ publish again
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Client;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::retry::Backoff;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("cannot encode a ResourceSlice: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(
        "the API server dropped {field} from ResourceSlice {slice}: enable the feature gate \
         {gate} (on the API server and scheduler) or use a layout without it; those slices \
         were withdrawn rather than advertise devices that would be mis-allocated"
    )]
    FieldDropped {
        slice: String,
        field: String,
        gate: &'static str,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to do to reach the desired slices.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub create: Vec<ResourceSlice>,
    /// Desired slices whose stored copy differs; carry the stored resourceVersion.
    pub replace: Vec<ResourceSlice>,
    pub delete: Vec<String>,
}

/// Diff desired against existing slices, by name. Pure.
pub fn diff(desired: &[ResourceSlice], existing: &[ResourceSlice]) -> Plan {
    let by_name: BTreeMap<&str, &ResourceSlice> = existing
        .iter()
        .filter_map(|s| s.metadata.name.as_deref().map(|n| (n, s)))
        .collect();
    let mut plan = Plan::default();
    for d in desired {
        let name = d.metadata.name.as_deref().unwrap_or_default();
        match by_name.get(name) {
            None => plan.create.push(d.clone()),
            Some(e) if e.spec != d.spec => {
                let mut r = d.clone();
                r.metadata.resource_version = e.metadata.resource_version.clone();
                plan.replace.push(r);
            }
            Some(_) => {}
        }
    }
    for name in by_name.keys() {
        if !desired
            .iter()
            .any(|d| d.metadata.name.as_deref() == Some(*name))
        {
            plan.delete.push(name.to_string());
        }
    }
    plan
}

/// Give `desired` the pool generation to write: the stored one when nothing changes (an
/// agent restart rewrites nothing), otherwise one above everything stored or written
/// before (`floor`), so the scheduler never mixes slices of two generations. Pure.
pub fn with_generation(
    desired: &[ResourceSlice],
    existing: &[ResourceSlice],
    floor: i64,
) -> Vec<ResourceSlice> {
    let stored = existing.iter().map(|s| s.spec.pool.generation).max();
    let same = |d: &ResourceSlice, e: &ResourceSlice| {
        let mut d = d.spec.clone();
        d.pool.generation = e.spec.pool.generation;
        d == e.spec
    };
    let unchanged = existing.len() == desired.len()
        && desired.iter().all(|d| {
            existing
                .iter()
                .any(|e| e.metadata.name == d.metadata.name && same(d, e))
        });
    let highest = stored.unwrap_or(0).max(floor);
    let generation = match stored {
        Some(g) if unchanged && g >= floor => g,
        _ => (highest + 1).max(
            desired
                .iter()
                .map(|d| d.spec.pool.generation)
                .max()
                .unwrap_or(1),
        ),
    };
    desired
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.spec.pool.generation = generation;
            d
        })
        .collect()
}

/// The feature gate behind a ResourceSlice field path (dotted, list indices as `*`).
fn gate_for(path: &str) -> &'static str {
    if path.contains("sharedCounters") || path.contains("consumesCounters") {
        "DRAPartitionableDevices"
    } else if path.contains("allowMultipleAllocations") || path.contains("requestPolicy") {
        "DRAConsumableCapacity"
    } else if path.contains("taints") {
        "DRADeviceTaints"
    } else if path.contains("bindingConditions") || path.contains("bindsToNode") {
        "DRADeviceBindingConditions"
    } else {
        "an alpha DRA feature"
    }
}

/// The first field present in `sent` but missing from `stored` (objects and arrays are
/// walked; metadata is ignored). Pure.
pub fn dropped_field(sent: &Value, stored: &Value) -> Option<String> {
    fn walk(sent: &Value, stored: &Value, path: &str) -> Option<String> {
        match (sent, stored) {
            (Value::Object(a), Value::Object(b)) => a.iter().find_map(|(k, v)| {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match b.get(k) {
                    None if !v.is_null() => Some(p),
                    None => None,
                    Some(w) => walk(v, w, &p),
                }
            }),
            (Value::Array(a), Value::Array(b)) => a
                .iter()
                .zip(b.iter())
                .find_map(|(v, w)| walk(v, w, &format!("{path}.*"))),
            _ => None,
        }
    }
    walk(&sent["spec"], &stored["spec"], "spec")
}

fn check_stored(sent: &ResourceSlice, stored: &ResourceSlice) -> Result<()> {
    let (a, b) = (serde_json::to_value(sent)?, serde_json::to_value(stored)?);
    match dropped_field(&a, &b) {
        Some(field) => Err(Error::FieldDropped {
            slice: sent.metadata.name.clone().unwrap_or_default(),
            gate: gate_for(&field),
            field,
        }),
        None => Ok(()),
    }
}

/// Publishes one node's pool.
pub struct Publisher {
    api: Api<ResourceSlice>,
    selector: String,
}

impl Publisher {
    pub fn new(client: Client, node: &str, driver: &str) -> Self {
        Self {
            api: Api::all(client),
            selector: format!("spec.nodeName={node},spec.driver={driver}"),
        }
    }

    async fn existing(&self) -> Result<Vec<ResourceSlice>> {
        Ok(self
            .api
            .list(&ListParams::default().fields(&self.selector))
            .await?
            .items)
    }

    /// Make the stored slices exactly `desired`. On a dropped field, every slice written
    /// in this round that lost a field is deleted and the first such error returned.
    pub async fn publish(&self, desired: &[ResourceSlice]) -> Result<()> {
        self.publish_from(desired, 0).await.map(|_| ())
    }

    /// [`Self::publish`] with the pool generation chosen by [`with_generation`]; returns
    /// the slices as written.
    pub async fn publish_from(
        &self,
        desired: &[ResourceSlice],
        floor: i64,
    ) -> Result<Vec<ResourceSlice>> {
        let existing = self.existing().await?;
        let desired = with_generation(desired, &existing, floor);
        self.write(&desired, &existing).await?;
        Ok(desired)
    }

    async fn write(&self, desired: &[ResourceSlice], existing: &[ResourceSlice]) -> Result<()> {
        let plan = diff(desired, existing);
        let mut first_err = None;
        for name in &plan.delete {
            self.api.delete(name, &DeleteParams::default()).await?;
        }
        let mut written = Vec::new();
        for s in &plan.create {
            written.push((s, self.api.create(&PostParams::default(), s).await?));
        }
        for s in &plan.replace {
            let name = s.metadata.name.clone().unwrap_or_default();
            written.push((s, self.api.replace(&name, &PostParams::default(), s).await?));
        }
        for (sent, stored) in written {
            if let Err(e) = check_stored(sent, &stored) {
                warn!(error = %e, "withdrawing ResourceSlice");
                let name = sent.metadata.name.clone().unwrap_or_default();
                self.api.delete(&name, &DeleteParams::default()).await?;
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => {
                if plan != Plan::default() {
                    info!(
                        created = plan.create.len(),
                        replaced = plan.replace.len(),
                        deleted = plan.delete.len(),
                        "ResourceSlices published"
                    );
                }
                Ok(())
            }
        }
    }

    /// Keep `desired` published until `cancel`: publish, then watch our slices and publish
    /// again on any change (debounced 100 ms). Errors are reported on `status` and retried
    /// with backoff (1 s … 30 s).
    pub async fn run(
        self,
        mut desired: watch::Receiver<Vec<ResourceSlice>>,
        status: watch::Sender<Option<Arc<Error>>>,
        cancel: CancellationToken,
    ) {
        let mut backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(30));
        let mut floor = 0;
        loop {
            let wanted = desired.borrow_and_update().clone();
            let outcome = self.publish_from(&wanted, floor).await;
            let ok = outcome.is_ok();
            let slices = match outcome {
                Ok(written) => {
                    floor = written.first().map_or(floor, |s| s.spec.pool.generation);
                    status.send_replace(None);
                    written
                }
                Err(e) => {
                    status.send_replace(Some(Arc::new(e)));
                    wanted
                }
            };
            let retry_in = if ok {
                backoff.reset();
                None
            } else {
                Some(backoff.next_delay())
            };
            let wait = async {
                match retry_in {
                    None => self.wait_for_change(&slices).await,
                    Some(delay) => tokio::time::sleep(delay).await,
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = desired.changed() => if changed.is_err() { return },
                _ = wait => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Return when our stored slices differ from `desired`, now or after any change (or
    /// when the watch fails).
    async fn wait_for_change(&self, desired: &[ResourceSlice]) {
        let Ok(list) = self
            .api
            .list(&ListParams::default().fields(&self.selector))
            .await
        else {
            return tokio::time::sleep(Duration::from_secs(1)).await;
        };
        // Changed between our writes and this list: nothing to wait for.
        if diff(desired, &list.items) != Plan::default() {
            return;
        }
        let version = list.metadata.resource_version.unwrap_or_default();
        let wp = WatchParams::default().fields(&self.selector).timeout(290);
        let Ok(stream) = self.api.watch(&wp, &version).await else {
            return tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let mut stream = Box::pin(stream);
        while let Ok(Some(event)) = stream.try_next().await {
            match event {
                WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_) => return,
                WatchEvent::Error(_) => return,
                WatchEvent::Bookmark(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSliceSpec};
    use kube::api::ObjectMeta;
    use serde_json::json;

    fn slice(name: &str, generation: i64) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "gpu.tessera.io".into(),
                node_name: Some("n".into()),
                pool: ResourcePool {
                    name: "n".into(),
                    generation,
                    resource_slice_count: 1,
                },
                ..Default::default()
            },
        }
    }

    #[test]
    fn diff_creates_replaces_and_deletes() {
        let mut stale = slice("a", 1);
        stale.metadata.resource_version = Some("7".into());
        let existing = vec![stale, slice("b", 2), slice("old", 1)];
        let desired = vec![slice("a", 2), slice("b", 2), slice("c", 2)];
        let plan = diff(&desired, &existing);
        assert_eq!(plan.create.len(), 1);
        assert_eq!(plan.create[0].metadata.name.as_deref(), Some("c"));
        assert_eq!(plan.replace.len(), 1);
        assert_eq!(
            plan.replace[0].metadata.resource_version.as_deref(),
            Some("7")
        );
        assert_eq!(plan.delete, vec!["old".to_string()]);
        assert_eq!(
            diff(&desired, &desired),
            Plan::default(),
            "nothing to do when in sync"
        );
    }

    #[test]
    fn generation_is_kept_when_unchanged_and_bumped_otherwise() {
        let gens = |v: &[ResourceSlice]| -> Vec<i64> {
            v.iter().map(|s| s.spec.pool.generation).collect()
        };
        let stored = vec![slice("a", 4), slice("b", 4)];
        // Same devices (an agent restart builds generation 1): keep 4, write nothing.
        let same = with_generation(&[slice("a", 1), slice("b", 1)], &stored, 0);
        assert_eq!(gens(&same), vec![4, 4]);
        assert_eq!(diff(&same, &stored), Plan::default());
        // Changed (a slice fewer): one above the stored generation.
        assert_eq!(
            gens(&with_generation(&[slice("a", 1)], &stored, 0)),
            vec![5]
        );
        // Everything wiped (a kubelet restart): above what this process wrote before.
        assert_eq!(gens(&with_generation(&[slice("a", 1)], &[], 7)), vec![8]);
        assert_eq!(gens(&with_generation(&[slice("a", 1)], &[], 0)), vec![1]);
    }

    #[test]
    fn dropped_fields_name_the_gate() {
        let sent = json!({"spec": {"devices": [{"name": "a", "consumesCounters": [{"counterSet": "x"}]}], "sharedCounters": []}});
        let stored = json!({"spec": {"devices": [{"name": "a"}], "sharedCounters": []}});
        let f = dropped_field(&sent, &stored).unwrap();
        assert_eq!(f, "spec.devices.*.consumesCounters");
        assert_eq!(gate_for(&f), "DRAPartitionableDevices");
        let sent = json!({"spec": {"devices": [{"allowMultipleAllocations": true}]}});
        let stored = json!({"spec": {"devices": [{}]}});
        assert_eq!(
            gate_for(&dropped_field(&sent, &stored).unwrap()),
            "DRAConsumableCapacity"
        );
        assert_eq!(dropped_field(&sent, &sent), None);
    }
}
