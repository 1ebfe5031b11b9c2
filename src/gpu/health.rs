//! Health classification: a pure state machine from raw [`HealthEvent`]s to per-GPU
//! [`Health`]. Unlike NVIDIA's device plugin, health *recovers*: a GPU marked unhealthy
//! by an XID becomes healthy again when the backend reports [`HealthEvent::Recovered`].

use std::collections::{BTreeMap, BTreeSet};

use super::HealthEvent;

/// XIDs that are application errors (bad pointer, illegal instruction, user-triggered
/// reset...), not hardware faults. NVIDIA's device plugin ignores the same set.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Health of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy { reason: String },
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// What to do with raw events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    pub ignored_xids: BTreeSet<u64>,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
        }
    }
}

/// Per-GPU health, updated event by event.
#[derive(Debug, Default)]
pub struct HealthTracker {
    policy: HealthPolicy,
    unhealthy: BTreeMap<String, String>,
}

impl HealthTracker {
    pub fn new(policy: HealthPolicy) -> Self {
        Self {
            policy,
            unhealthy: BTreeMap::new(),
        }
    }

    /// Replace the policy (config reload). Current states are kept.
    pub fn set_policy(&mut self, policy: HealthPolicy) {
        self.policy = policy;
    }

    pub fn health(&self, gpu_uuid: &str) -> Health {
        match self.unhealthy.get(gpu_uuid) {
            Some(reason) => Health::Unhealthy {
                reason: reason.clone(),
            },
            None => Health::Healthy,
        }
    }

    /// Apply one event; returns the GPU's new health if it changed.
    pub fn apply(&mut self, event: &HealthEvent) -> Option<Health> {
        let uuid = event.gpu_uuid().to_string();
        let was_healthy = !self.unhealthy.contains_key(&uuid);
        match event {
            HealthEvent::Xid { xid, .. } if self.policy.ignored_xids.contains(xid) => None,
            HealthEvent::Xid { xid, .. } => {
                self.unhealthy.insert(uuid.clone(), format!("XID {xid}"));
                was_healthy.then(|| self.health(&uuid))
            }
            HealthEvent::EccUncorrectable { count, .. } => {
                self.unhealthy
                    .insert(uuid.clone(), format!("{count} uncorrectable ECC errors"));
                was_healthy.then(|| self.health(&uuid))
            }
            HealthEvent::Recovered { .. } => {
                self.unhealthy.remove(&uuid);
                (!was_healthy).then_some(Health::Healthy)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(xid: u64) -> HealthEvent {
        HealthEvent::Xid {
            gpu_uuid: "GPU-a".into(),
            xid,
        }
    }

    #[test]
    fn application_xids_are_ignored() {
        let mut t = HealthTracker::default();
        for code in DEFAULT_IGNORED_XIDS {
            assert_eq!(t.apply(&xid(code)), None, "xid {code}");
        }
        assert!(t.health("GPU-a").is_healthy());
    }

    #[test]
    fn hardware_xid_marks_unhealthy_and_recovery_clears_it() {
        let mut t = HealthTracker::default();
        assert_eq!(
            t.apply(&xid(79)),
            Some(Health::Unhealthy {
                reason: "XID 79".into()
            })
        );
        // A second fault while unhealthy is not a change.
        assert_eq!(t.apply(&xid(48)), None);
        let back = HealthEvent::Recovered {
            gpu_uuid: "GPU-a".into(),
        };
        assert_eq!(t.apply(&back), Some(Health::Healthy));
        assert_eq!(t.apply(&back), None);
        assert!(t.health("GPU-a").is_healthy());
        assert!(t.health("GPU-other").is_healthy());
    }

    #[test]
    fn ignored_set_is_configurable() {
        let mut t = HealthTracker::new(HealthPolicy {
            ignored_xids: [79].into_iter().collect(),
        });
        assert_eq!(t.apply(&xid(79)), None);
        assert!(t.apply(&xid(13)).is_some(), "13 is no longer ignored");
    }
}
