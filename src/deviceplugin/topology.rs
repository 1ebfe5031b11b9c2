//! NVLink links between a node's GPUs: what preferred allocations of whole GPUs group
//! by, kept in the [`Snapshot`](super::snapshot::Snapshot) every resource server reads.

use std::collections::BTreeMap;

/// NVLink link counts between GPUs (by UUID), symmetric.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    links: BTreeMap<(String, String), u32>,
}

impl Topology {
    pub fn from_inventory(inv: &crate::gpu::Inventory) -> Self {
        let mut links = BTreeMap::new();
        for a in &inv.gpus {
            for b in &inv.gpus {
                let n = a.nvlinks_to(b).max(b.nvlinks_to(a)) as u32;
                if a.uuid != b.uuid && n > 0 {
                    links.insert((a.uuid.clone(), b.uuid.clone()), n);
                }
            }
        }
        Self { links }
    }

    pub fn links(&self, a: &str, b: &str) -> u32 {
        self.links
            .get(&(a.to_string(), b.to_string()))
            .copied()
            .unwrap_or(0)
    }
}
