//! The fleet's nodes as the placement engine sees them: the nodes of each GPU model in
//! `--gpu-models` order, the dedicated fleet's two pools, and Tessera's MIG nodes.
//!
//! MIG nodes (`--mig-nodes N`, Tessera's fleet only) are the last N nodes, each GPU laid
//! out by the named layout `--mig-layout` of its model's MIG catalog (what a node's
//! `mode: mig` config does). The device plugin advertises each instance as a device of
//! its profile's resource (`nvidia.com/mig-1g.10gb`, NVIDIA's mixed strategy) and the
//! node no `nvidia.com/gpu`, so the scheduler's resource filter sends a MIG pod only to
//! nodes with its profile and nothing else there. The simulation mirrors that with one
//! placement cluster per profile, whose "GPUs" are the instances: the placement engine
//! picks the node and the instance; this module only says which cluster a request's
//! resource names.
//!
//! Which training tasks ask for MIG ([`MigGroups::profile_for`]): a task asking for
//! part of one GPU runs as the smallest profile of the fleet's MIG layouts whose compute
//! share covers its share (a 0.22-GPU task: `2g.20gb`, 2/7), unless no profile smaller
//! than the whole GPU does (then it stays a vGPU share on the other nodes). Quota
//! charges it one `nvidia.com/mig-<profile>`, as the controller charges a pod that asks
//! for one; the training queue's nominal quota of each profile is the fleet's instances.

use std::collections::BTreeMap;

use crate::partition::catalog;
use crate::placement::{Cluster, NodeSpec};

use super::config::Knobs;

/// CPU and memory of a simulated node: large enough never to bind (GPUs are the
/// constraint).
const NODE_CPU_MILLI: u32 = 1_000_000;
const NODE_MEMORY_MIB: u64 = 1 << 30;

/// Node specs named `{prefix}-{i}`, one per model name.
pub fn specs<'a>(
    prefix: &str,
    models: impl Iterator<Item = &'a str>,
    gpus_per_node: u8,
) -> Vec<NodeSpec> {
    models
        .enumerate()
        .map(|(i, model)| {
            NodeSpec::new(
                &format!("{prefix}-{i}"),
                NODE_CPU_MILLI,
                NODE_MEMORY_MIB,
                gpus_per_node,
                model,
            )
        })
        .collect()
}

/// The MIG instances of one profile across the MIG nodes: one placement cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct MigGroup {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: &'static str,
    /// The quota resource a pod of this profile asks for.
    pub resource: String,
    /// Compute slices of one instance and of the whole GPU.
    pub slices: u8,
    pub gpu_slices: u8,
    /// Memory of one instance (MiB), to order profiles of equal compute.
    pub memory_mib: u64,
    /// Instances per GPU on each MIG node (0 where the node's layout has none).
    pub per_gpu: Vec<u8>,
    /// The fleet's models (bit `i`: `--gpu-models` entry `i`) with this profile.
    pub models: u64,
}

impl MigGroup {
    /// One instance's share of its GPU, in milli (what allocation counts it as).
    pub fn milli(&self) -> u64 {
        u64::from(self.slices) * 1000 / u64::from(self.gpu_slices.max(1))
    }

    /// Instances in the fleet.
    pub fn instances(&self, gpus_per_node: u8) -> u32 {
        self.per_gpu
            .iter()
            .map(|&n| u32::from(n) * u32::from(gpus_per_node))
            .sum()
    }
}

/// Tessera's MIG nodes, grouped by profile.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigGroups {
    pub groups: Vec<MigGroup>,
    pub gpus_per_node: u8,
}

impl MigGroups {
    /// The MIG nodes of `knobs` (validated: every MIG node's model has a catalog and
    /// accepts the layout; a model that does not is skipped here).
    pub fn new(knobs: &Knobs) -> Self {
        let names = knobs.model_names();
        let total: usize = knobs.node_models().count();
        let mig_models: Vec<&str> = knobs
            .node_models()
            .skip(total.saturating_sub(knobs.mig_nodes as usize))
            .collect();
        let mut by_profile: BTreeMap<&'static str, MigGroup> = BTreeMap::new();
        for (j, model) in mig_models.iter().enumerate() {
            let Some(cat) = catalog::lookup(model, 0) else {
                continue;
            };
            let Ok(layout) = cat.named_layout(&knobs.mig_layout) else {
                continue;
            };
            let bit = names
                .iter()
                .position(|n| n == model)
                .map_or(0, |i| 1u64 << i);
            for name in &layout {
                let Some(p) = cat.profile(name) else { continue };
                let g = by_profile.entry(p.name).or_insert_with(|| MigGroup {
                    profile: p.name,
                    resource: format!("nvidia.com/mig-{}", p.name),
                    slices: p.compute_slices,
                    gpu_slices: cat.compute_slices,
                    memory_mib: p.memory_mib,
                    per_gpu: vec![0; mig_models.len()],
                    models: 0,
                });
                g.per_gpu[j] += 1;
                g.models |= bit;
            }
        }
        let mut groups: Vec<MigGroup> = by_profile.into_values().collect();
        groups.sort_by(|a, b| {
            (
                u64::from(a.slices) * u64::from(b.gpu_slices),
                a.memory_mib,
                a.profile,
            )
                .cmp(&(
                    u64::from(b.slices) * u64::from(a.gpu_slices),
                    b.memory_mib,
                    b.profile,
                ))
        });
        MigGroups {
            groups,
            gpus_per_node: knobs.gpus_per_node,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The group a training task of one GPU at `gpu_milli` asks for, allowed on
    /// `models` (`None`: any): the smallest profile whose compute share covers the
    /// task's, smaller than a whole GPU, on a model the task may use.
    pub fn profile_for(&self, num_gpu: u8, gpu_milli: u16, models: Option<u64>) -> Option<usize> {
        if num_gpu != 1 || gpu_milli >= 1000 {
            return None;
        }
        self.groups.iter().position(|g| {
            g.slices < g.gpu_slices
                && u64::from(gpu_milli) * u64::from(g.gpu_slices) <= u64::from(g.slices) * 1000
                && models.is_none_or(|m| m & g.models != 0)
        })
    }

    /// One node spec per MIG node for group `g`: the node's instances of the profile
    /// are its devices.
    pub fn specs(&self, g: usize, models: &[&str]) -> Vec<NodeSpec> {
        let group = &self.groups[g];
        group
            .per_gpu
            .iter()
            .zip(models)
            .enumerate()
            .map(|(j, (&per, model))| {
                NodeSpec::new(
                    &format!("mig-{}-{j}", group.profile),
                    NODE_CPU_MILLI,
                    NODE_MEMORY_MIB,
                    per.saturating_mul(self.gpus_per_node),
                    model,
                )
            })
            .collect()
    }

    /// Free instance compute (milli) on MIG GPUs that have some instance in use: the
    /// MIG side of "stranded on partly used GPUs". `clusters[g]` is group `g`'s cluster;
    /// instance `i` of a node is on its GPU `i / per_gpu`.
    pub fn stranded_milli(&self, clusters: &[Cluster]) -> u64 {
        let nodes = self.groups.first().map_or(0, |g| g.per_gpu.len());
        let mut stranded = 0;
        for j in 0..nodes {
            for gpu in 0..usize::from(self.gpus_per_node) {
                let (mut used, mut free) = (false, 0u64);
                for (g, c) in self.groups.iter().zip(clusters) {
                    let per = usize::from(g.per_gpu[j]);
                    let Some(devices) = (j < c.len()).then(|| &c.node(j).gpus) else {
                        continue;
                    };
                    for d in devices.iter().skip(gpu * per).take(per) {
                        if d.milli == 0 {
                            used = true;
                        } else {
                            free += g.milli();
                        }
                    }
                }
                if used {
                    stranded += free;
                }
            }
        }
        stranded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Placement, Request};
    use crate::sim::fleet::config::ModelNodes;

    fn knobs(models: &[(&str, u32)], mig: u32, layout: &str) -> Knobs {
        let nodes: u32 = models.iter().map(|m| m.1).sum();
        Knobs {
            gpus: nodes * 8,
            gpu_models: models
                .iter()
                .map(|&(model, nodes)| ModelNodes {
                    model: model.into(),
                    nodes,
                })
                .collect(),
            mig_nodes: mig,
            mig_layout: layout.into(),
            ..Knobs::default()
        }
    }

    #[test]
    fn balanced_h100_nodes_hold_the_catalogs_instances() {
        let k = knobs(&[("H100-80GB", 10)], 2, "balanced");
        k.validate().unwrap();
        let m = MigGroups::new(&k);
        let got: Vec<(&str, u32, u64)> = m
            .groups
            .iter()
            .map(|g| (g.profile, g.instances(8), g.milli()))
            .collect();
        // mig-parted's balanced H100-80GB GPU: 2 × 1g.10gb + 2g.20gb + 3g.40gb.
        assert_eq!(
            got,
            vec![
                ("1g.10gb", 32, 142),
                ("2g.20gb", 16, 285),
                ("3g.40gb", 16, 428)
            ]
        );
    }

    #[test]
    fn a_task_asks_for_the_smallest_profile_that_covers_its_share() {
        let m = MigGroups::new(&knobs(&[("H100-80GB", 10)], 2, "balanced"));
        let cases = [
            (1, 50, Some("1g.10gb")),
            (1, 142, Some("1g.10gb")),
            (1, 143, Some("2g.20gb")),
            (1, 220, Some("2g.20gb")),
            (1, 320, Some("3g.40gb")),
            (1, 430, None), // above 3/7: no profile of the layout covers it
            (1, 1000, None),
            (2, 1000, None),
        ];
        for (n, milli, want) in cases {
            let got = m.profile_for(n, milli, None).map(|g| m.groups[g].profile);
            assert_eq!(got, want, "{n} × {milli}");
        }
        // A task limited to a model without MIG nodes stays off MIG.
        assert_eq!(m.profile_for(1, 50, Some(0b10)), None);
        assert_eq!(
            m.profile_for(1, 50, Some(0b01))
                .map(|g| m.groups[g].profile),
            Some("1g.10gb")
        );
    }

    #[test]
    fn mixed_models_get_their_own_profiles_and_stranded_counts_partly_used_gpus() {
        let k = knobs(&[("H100-80GB", 4), ("A100-40GB", 2)], 3, "all-2g.20gb");
        // A100-40GB has no 2g.20gb: the layout is refused for it.
        let err = k.validate().unwrap_err().to_string();
        assert!(err.starts_with("--mig-layout"), "{err}");
        let k = knobs(&[("H100-80GB", 4), ("A100-40GB", 2)], 3, "balanced");
        k.validate().unwrap();
        let m = MigGroups::new(&k);
        let names: Vec<&str> = m.groups.iter().map(|g| g.profile).collect();
        assert_eq!(
            names,
            ["1g.5gb", "1g.10gb", "2g.10gb", "2g.20gb", "3g.20gb", "3g.40gb"]
        );
        // The one H100 MIG node (node 0 of the three) has 1g.10gb, the A100s 1g.5gb.
        let g10 = &m.groups[1];
        assert_eq!((g10.per_gpu.clone(), g10.models), (vec![2, 0, 0], 0b01));
        let models = ["H100-80GB", "A100-40GB", "A100-40GB"];
        let mut clusters: Vec<Cluster> = (0..m.groups.len())
            .map(|g| Cluster::new(m.specs(g, &models)).unwrap())
            .collect();
        assert_eq!(m.stranded_milli(&clusters), 0);
        // One 1g.10gb on the H100 node's GPU 0: its GPU's other instances are stranded.
        let d = clusters[1].demand(&Request::whole(0, 0, 1)).unwrap();
        clusters[1]
            .apply(
                &d,
                &Placement {
                    node: 0,
                    gpus: vec![0],
                },
            )
            .unwrap();
        assert_eq!(m.stranded_milli(&clusters), 142 + 285 + 428);
    }

    #[test]
    fn mig_nodes_must_be_of_a_model_with_profiles() {
        let k = knobs(&[("H100-80GB", 4), ("T4", 2)], 1, "balanced");
        let err = k.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("--mig-nodes") && err.contains("T4"),
            "{err}"
        );
        let k = knobs(&[("T4", 2), ("H100-80GB", 4)], 4, "balanced");
        k.validate().unwrap();
        assert_eq!(MigGroups::new(&k).groups.len(), 3);
        let k = knobs(&[("H100-80GB", 4)], 4, "balanced");
        assert!(k
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("--mig-nodes"));
    }
}
