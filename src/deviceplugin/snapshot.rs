//! The state every resource server reads: what the node advertises, and which GPUs are
//! unhealthy. Published through a `tokio::sync::watch` channel; a new value wakes every
//! ListAndWatch stream, which sends only if its own resource's list changed.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::partition::config::AllocationPolicy;
use crate::partition::layout::{Advertisement, Device, Resource};
use crate::proto::deviceplugin as pb;

use super::topology::Topology;
use super::{HEALTHY, UNHEALTHY};

/// One consistent view of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Bumped on every change (config reload, health flip).
    pub generation: u64,
    pub advertisement: Advertisement,
    /// GPU UUID → reason, for GPUs currently unhealthy.
    pub unhealthy: BTreeMap<String, String>,
    pub allocation: AllocationPolicy,
    /// NVLink links between GPUs, for preferred allocations.
    pub topology: Topology,
}

pub type SharedSnapshot = Arc<Snapshot>;

impl Snapshot {
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.advertisement.resource(name)
    }

    /// Why a device is unhealthy, if it is.
    pub fn unhealthy_reason(&self, device: &Device) -> Option<&str> {
        self.unhealthy.get(&device.gpu_uuid).map(String::as_str)
    }

    /// The ListAndWatch list for one resource (empty if it is gone).
    pub fn device_list(&self, resource: &str) -> Vec<pb::Device> {
        let Some(res) = self.resource(resource) else {
            return Vec::new();
        };
        res.devices
            .iter()
            .map(|d| pb::Device {
                id: d.id.clone(),
                health: if self.unhealthy_reason(d).is_some() {
                    UNHEALTHY.to_string()
                } else {
                    HEALTHY.to_string()
                },
                topology: d.numa_node.map(|n| pb::TopologyInfo {
                    nodes: vec![pb::NumaNode { id: i64::from(n) }],
                }),
            })
            .collect()
    }

    /// Resource names, sorted.
    pub fn resource_names(&self) -> Vec<String> {
        self.advertisement
            .resources
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }
}
