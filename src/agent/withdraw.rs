//! Moving a GPU off the DRA driver in two phases, so that a claim the scheduler allocates
//! on it in the moment before the slices without it reach the scheduler is served, not
//! stranded on a device that is gone.
//!
//! ```text
//! reload: the split gives GPU g to the device plugin
//!   phase 1  split in force (NodePrepareResources refuses new claims on g)
//!            slices without g published; the device plugin does NOT list g yet and
//!            applies no MIG layout to it: no path advertises g
//!   phase 2  the API server's slices name no device of g (for `move_settle`)
//!            ─▶ one LIST of ResourceClaims allocated on this node
//!               ├ none on g ─▶ g goes to the device plugin (the move is done)
//!               └ claim c on g ─▶ roll back: g is the DRA driver's again (republished,
//!                                 prepare admits c), GpuMoveBlocked names c; g moves
//!                                 once c is gone, like any blocked move
//! ```
//!
//! The LIST of phase 2 sees every claim allocated from the old slices: the scheduler only
//! allocates from slices it has seen, and the old ones are gone from the API server before
//! the LIST starts (a scheduler whose watch lags more than `move_settle` behind the API
//! server is the one window left). When the last GPU leaves a driver in `--dra=auto`, the
//! driver keeps serving through phase 2 and withdraws from the kubelet only after it.
//!
//! The decisions are pure ([`published_gpus`], [`settle`]); the agent does the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::dra::prepare::{parse_device_name, DeviceKind};
use crate::dra::slices::DRIVER;
use crate::gpu::Inventory;

/// UUIDs of the GPUs of `inventory` that a device of `slices` (this driver's, this node's)
/// lives on. Pure.
pub fn published_gpus(slices: &[ResourceSlice], inventory: &Inventory) -> BTreeSet<String> {
    slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| match parse_device_name(&d.name)? {
            DeviceKind::Whole { gpu } | DeviceKind::Vgpu { gpu } | DeviceKind::Mig { gpu, .. } => {
                Some(gpu)
            }
        })
        .filter_map(|index| inventory.gpus.iter().find(|g| g.index == index))
        .map(|g| g.uuid.clone())
        .collect()
}

/// Phase 2 for the GPUs `withdrawing`, given the claims allocated on this node (GPU UUID →
/// claims, [`super::usage::allocated_holders`]): the GPUs whose move is done, and those
/// to take back with the claims that hold them. Pure.
pub fn settle(
    withdrawing: &BTreeSet<String>,
    allocated: &BTreeMap<String, Vec<String>>,
) -> (BTreeSet<String>, BTreeMap<String, Vec<String>>) {
    let mut done = BTreeSet::new();
    let mut back = BTreeMap::new();
    for uuid in withdrawing {
        match allocated.get(uuid).filter(|who| !who.is_empty()) {
            Some(who) => {
                back.insert(uuid.clone(), who.clone());
            }
            None => {
                done.insert(uuid.clone());
            }
        }
    }
    (done, back)
}

/// [`published_gpus`] of this node's stored slices (one LIST with a field selector,
/// bounded by `timeout`).
pub async fn list_published(
    client: kube::Client,
    node: &str,
    inventory: &Inventory,
    timeout: Duration,
) -> Result<BTreeSet<String>, String> {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client);
    let params = kube::api::ListParams::default()
        .fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
    let list = tokio::time::timeout(timeout, api.list(&params))
        .await
        .map_err(|_| format!("listing ResourceSlices timed out after {timeout:?}"))?
        .map_err(|e| format!("cannot list ResourceSlices: {e}"))?;
    Ok(published_gpus(&list.items, inventory))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;

    fn inv() -> Inventory {
        FakeBackend::from_spec("4xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap()
    }

    fn slice(driver: &str, devices: &[&str]) -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "spec": {"driver": driver, "nodeName": "n",
                     "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices.iter().map(|d| serde_json::json!({"name": d})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn published_gpus_by_device_kind_and_driver() {
        let inv = inv();
        let cases: &[(&[ResourceSlice], &[usize])] = &[
            (&[], &[]),
            (&[slice(DRIVER, &[])], &[]),
            (&[slice(DRIVER, &["gpu-0", "gpu-2-vgpu"])], &[0, 2]),
            (
                &[
                    slice(DRIVER, &["gpu-3-mig-3g-40gb-4"]),
                    slice(DRIVER, &["gpu-1"]),
                ],
                &[1, 3],
            ),
            // Another driver's devices, names that are not ours, GPUs not on the node.
            (&[slice("other.example.com", &["gpu-0"])], &[]),
            (&[slice(DRIVER, &["bogus", "gpu-9"])], &[]),
        ];
        for (slices, want) in cases {
            let want: BTreeSet<String> = want.iter().map(|i| inv.gpus[*i].uuid.clone()).collect();
            assert_eq!(published_gpus(slices, &inv), want, "{want:?}");
        }
    }

    #[test]
    fn settle_hands_over_free_gpus_and_takes_back_claimed_ones() {
        let w: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let allocated: BTreeMap<String, Vec<String>> = [
            (
                "b".to_string(),
                vec!["claim ml/x (uid u, allocated)".to_string()],
            ),
            ("c".to_string(), vec![]),
            (
                "z".to_string(),
                vec!["claim ml/y (uid v, allocated)".to_string()],
            ),
        ]
        .into_iter()
        .collect();
        let (done, back) = settle(&w, &allocated);
        assert_eq!(done, ["a", "c"].iter().map(|s| s.to_string()).collect());
        assert_eq!(back.len(), 1);
        assert_eq!(back["b"], vec!["claim ml/x (uid u, allocated)"]);
        let (done, back) = settle(&BTreeSet::new(), &allocated);
        assert!(done.is_empty() && back.is_empty());
    }
}
