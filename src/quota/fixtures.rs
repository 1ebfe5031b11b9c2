//! Builders for queue objects, used by tests, benchmarks and examples:
//! `cluster_queue("team-a").cohort("ml").quota("h100", "nvidia.com/gpu", 8).build()`.

use super::api::{
    ClusterQueue, ClusterQueueSpec, FlavorQuotas, LabelSelector, LocalQueue, LocalQueueSpec,
    ObjectMeta, ResourceFlavor, ResourceGroup, ResourceQuota,
};
use super::quantity::Quantity;

/// A ResourceFlavor with no node labels or taints.
pub fn flavor(name: &str) -> ResourceFlavor {
    ResourceFlavor {
        metadata: ObjectMeta {
            name: name.to_string(),
            ..Default::default()
        },
        spec: Default::default(),
    }
}

/// A LocalQueue `namespace/name` pointing at `cq`.
pub fn local_queue(namespace: &str, name: &str, cq: &str) -> LocalQueue {
    LocalQueue {
        metadata: ObjectMeta {
            name: name.to_string(),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        spec: LocalQueueSpec {
            cluster_queue: cq.to_string(),
        },
    }
}

/// Starts a ClusterQueue that admits every namespace.
pub fn cluster_queue(name: &str) -> ClusterQueueBuilder {
    ClusterQueueBuilder(ClusterQueue {
        metadata: ObjectMeta {
            name: name.to_string(),
            ..Default::default()
        },
        spec: ClusterQueueSpec {
            namespace_selector: Some(LabelSelector::default()),
            ..Default::default()
        },
    })
}

/// Builder of a [`ClusterQueue`].
pub struct ClusterQueueBuilder(pub ClusterQueue);

impl ClusterQueueBuilder {
    pub fn cohort(mut self, cohort: &str) -> Self {
        self.0.spec.cohort_name = Some(cohort.to_string());
        self
    }

    /// Adds `nominal` whole units of `resource` in `flavor` (one resource group per
    /// resource; flavors in call order).
    pub fn quota(self, flavor: &str, resource: &str, nominal: i64) -> Self {
        self.quota_with(flavor, resource, nominal, None, None)
    }

    /// Like [`Self::quota`] with borrowing and lending limits.
    pub fn quota_with(
        mut self,
        flavor: &str,
        resource: &str,
        nominal: i64,
        borrowing: Option<i64>,
        lending: Option<i64>,
    ) -> Self {
        let rq = ResourceQuota {
            name: resource.to_string(),
            nominal_quota: Quantity::units(nominal),
            borrowing_limit: borrowing.map(Quantity::units),
            lending_limit: lending.map(Quantity::units),
        };
        let groups = &mut self.0.spec.resource_groups;
        let group = match groups
            .iter_mut()
            .position(|g| g.covered_resources == [resource.to_string()])
        {
            Some(i) => &mut groups[i],
            None => {
                groups.push(ResourceGroup {
                    covered_resources: vec![resource.to_string()],
                    flavors: Vec::new(),
                });
                let n = groups.len() - 1;
                &mut groups[n]
            }
        };
        group.flavors.push(FlavorQuotas {
            name: flavor.to_string(),
            resources: vec![rq],
        });
        self
    }

    pub fn preemption(mut self, yaml: &str) -> Self {
        if let Ok(p) = serde_saphyr::from_str(yaml) {
            self.0.spec.preemption = p;
        }
        self
    }

    pub fn strict_fifo(mut self) -> Self {
        self.0.spec.queueing_strategy = super::api::QueueingStrategy::StrictFIFO;
        self
    }

    pub fn build(self) -> ClusterQueue {
        self.0
    }
}
