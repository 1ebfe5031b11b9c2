//! ResourceClaim `status.devices`: what the driver reports about each device it prepared
//! (or failed to prepare) for a claim. Pure: the claim and the outcome in, the new
//! `status.devices` list out; [`super::node`] writes it through the `status` subresource.
//!
//! One entry per allocated device of ours (driver `gpu.tessera.io`, pool = this node),
//! keyed like the API server keys them (driver, pool, device, shareID). Each carries a
//! `Ready` condition (`True`/`Prepared` or `False`/`PrepareFailed` with the error) and,
//! when prepared, `data` with what a user cannot see elsewhere: the GPU or MIG UUID the
//! container got, a vGPU's limits, the time-slice. `networkData` is never set (GPUs are
//! not network interfaces). Other drivers' entries are kept untouched; ours are removed on
//! unprepare. `lastTransitionTime` only moves when the condition's status changes.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::names::DRIVER;

/// The condition type the driver maintains.
pub const READY: &str = "Ready";
/// Reasons (CamelCase, as the API requires).
pub const REASON_PREPARED: &str = "Prepared";
pub const REASON_FAILED: &str = "PrepareFailed";
/// The API limits a condition message to 32768 characters.
const MAX_MESSAGE: usize = 32_768;

/// The outcome for one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Prepared; per device name, the `data` to report (if any).
    Prepared(BTreeMap<String, serde_json::Value>),
    Failed(String),
}

fn ours(d: &AllocatedDeviceStatus, node: &str) -> bool {
    d.driver == DRIVER && d.pool == node
}

/// The claim's `status.devices` after reporting `outcome` for our devices on `node`.
/// Returns `None` when the claim has no device of ours (nothing to write).
pub fn report(
    claim: &ResourceClaim,
    node: &str,
    outcome: &Outcome,
    now: Time,
) -> Option<Vec<AllocatedDeviceStatus>> {
    let status = claim.status.as_ref();
    let results = status
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())?;
    let existing = status.and_then(|s| s.devices.clone()).unwrap_or_default();
    let mine: Vec<_> = results
        .iter()
        .filter(|r| r.driver == DRIVER && r.pool == node)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let (ready, reason, message) = match outcome {
        Outcome::Prepared(_) => ("True", REASON_PREPARED, format!("prepared on node {node}")),
        Outcome::Failed(e) => ("False", REASON_FAILED, truncate(e)),
    };
    let mut out: Vec<AllocatedDeviceStatus> = existing
        .iter()
        .filter(|d| !ours(d, node))
        .cloned()
        .collect();
    for r in mine {
        let previous = existing
            .iter()
            .find(|d| ours(d, node) && d.device == r.device && d.share_id == r.share_id);
        // Keep the transition time while the condition's status stays the same.
        let since = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == READY))
            .filter(|c| c.status == ready)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        let data = match outcome {
            Outcome::Prepared(data) => data.get(&r.device).cloned().map(RawExtension),
            Outcome::Failed(_) => None,
        };
        out.push(AllocatedDeviceStatus {
            driver: DRIVER.to_string(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            conditions: Some(vec![Condition {
                type_: READY.to_string(),
                status: ready.to_string(),
                reason: reason.to_string(),
                message: message.clone(),
                last_transition_time: since,
                observed_generation: claim.metadata.generation,
            }]),
            data,
            network_data: None,
        });
    }
    Some(out)
}

/// The claim's `status.devices` without our entries for `node`; `None` when there were
/// none (nothing to write).
pub fn clear(claim: &ResourceClaim, node: &str) -> Option<Vec<AllocatedDeviceStatus>> {
    let existing = claim.status.as_ref().and_then(|s| s.devices.as_ref())?;
    if !existing.iter().any(|d| ours(d, node)) {
        return None;
    }
    Some(
        existing
            .iter()
            .filter(|d| !ours(d, node))
            .cloned()
            .collect(),
    )
}

fn truncate(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn result(driver: &str, pool: &str, device: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            request: "gpu".into(),
            ..Default::default()
        }
    }

    fn other_entry() -> AllocatedDeviceStatus {
        AllocatedDeviceStatus {
            driver: "nic.example.com".into(),
            pool: "node-a".into(),
            device: "eth1".into(),
            ..Default::default()
        }
    }

    fn claim() -> ResourceClaim {
        ResourceClaim {
            metadata: Default::default(),
            spec: Default::default(),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![
                            result(DRIVER, "node-a", "gpu-0"),
                            result(DRIVER, "node-a", "gpu-1"),
                            result("nic.example.com", "node-a", "eth1"),
                        ]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                devices: Some(vec![other_entry()]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn prepared_devices_get_ready_entries_and_others_are_kept() {
        let data = [("gpu-0".to_string(), json!({"uuid": "GPU-a"}))].into();
        let devices = report(&claim(), "node-a", &Outcome::Prepared(data), t(100)).unwrap();
        assert_eq!(devices.len(), 3);
        assert_eq!(
            devices[0],
            other_entry(),
            "another driver's entry is untouched"
        );
        let gpu0 = &devices[1];
        assert_eq!(
            (gpu0.device.as_str(), gpu0.pool.as_str()),
            ("gpu-0", "node-a")
        );
        let c = &gpu0.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (READY, "True", REASON_PREPARED)
        );
        assert_eq!(gpu0.data.as_ref().unwrap().0, json!({"uuid": "GPU-a"}));
        assert!(devices[2].data.is_none());
        assert!(devices.iter().all(|d| d.network_data.is_none()));
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let mut c = claim();
        let ok = Outcome::Prepared(BTreeMap::new());
        let first = report(&c, "node-a", &ok, t(100)).unwrap();
        c.status.as_mut().unwrap().devices = Some(first);
        let again = report(&c, "node-a", &ok, t(200)).unwrap();
        let time = |d: &[AllocatedDeviceStatus]| {
            d[1].conditions.as_ref().unwrap()[0]
                .last_transition_time
                .clone()
        };
        assert_eq!(time(&again), t(100));
        c.status.as_mut().unwrap().devices = Some(again);
        let failed = report(&c, "node-a", &Outcome::Failed("x".repeat(40_000)), t(300)).unwrap();
        assert_eq!(time(&failed), t(300));
        let cond = &failed[1].conditions.as_ref().unwrap()[0];
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", REASON_FAILED)
        );
        assert!(cond.message.len() <= MAX_MESSAGE);
    }

    #[test]
    fn clear_removes_only_ours_and_other_nodes_are_not_ours() {
        let mut c = claim();
        assert_eq!(clear(&c, "node-a"), None, "nothing of ours yet");
        let written = report(&c, "node-a", &Outcome::Prepared(BTreeMap::new()), t(1)).unwrap();
        c.status.as_mut().unwrap().devices = Some(written);
        assert_eq!(clear(&c, "node-a"), Some(vec![other_entry()]));
        assert_eq!(
            report(&c, "node-b", &Outcome::Prepared(BTreeMap::new()), t(1)),
            None
        );
    }
}
