//! GetPreferredAllocation, as a pure function.
//!
//! - Whole GPUs: the set with the most NVLink links among its members, then the fewest
//!   NUMA nodes (greedy growth from every seed, best set wins; exact for the usual 8-GPU
//!   boards' symmetric topologies and cheap: O(n²·size)).
//! - Replicas and vGPU slices: `packed` takes shares from the GPUs with the fewest free
//!   shares first (keeps whole GPUs free for big jobs); `distributed` spreads over the
//!   GPUs with the most free shares. With `distinctGpus`, at most one share per GPU.
//! - MIG devices: grouped on the NUMA node of the devices that must be included.

use std::collections::{BTreeMap, BTreeSet};

use crate::partition::config::ReplicaStrategy;
use crate::partition::layout::{Device, Share};

use super::snapshot::Snapshot;
use super::topology::Topology;
use super::{Error, Result};

/// Choose `size` devices from `available`, including all of `must_include`.
pub fn preferred(
    snapshot: &Snapshot,
    resource: &str,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Result<Vec<String>> {
    let res = snapshot
        .resource(resource)
        .ok_or_else(|| Error::UnknownResource {
            resource: resource.to_string(),
        })?;
    let by_id: BTreeMap<&str, &Device> = res.devices.iter().map(|d| (d.id.as_str(), d)).collect();
    let lookup = |id: &String| {
        by_id
            .get(id.as_str())
            .copied()
            .ok_or_else(|| Error::UnknownDevice {
                resource: resource.to_string(),
                id: id.clone(),
            })
    };
    let must: Vec<&Device> = must_include.iter().map(lookup).collect::<Result<_>>()?;
    let mut avail: Vec<&Device> = Vec::with_capacity(available.len());
    for id in available {
        let d = lookup(id)?;
        if !must.iter().any(|m| m.id == d.id) && !avail.iter().any(|a| a.id == d.id) {
            avail.push(d);
        }
    }
    if size < must.len() || size > must.len() + avail.len() {
        return Err(Error::InvalidRequest(format!(
            "resource {resource}: cannot choose {size} devices from {} available with {} required",
            avail.len() + must.len(),
            must.len()
        )));
    }
    let shared = res.devices.iter().any(|d| {
        matches!(
            d.share,
            Share::Replica { .. } | Share::Vgpu { .. } | Share::Slot { .. }
        )
    });
    let chosen = if shared {
        pick_shares(snapshot, &must, &avail, size)
    } else {
        pick_exclusive(&snapshot.topology, &must, &avail, size)
    };
    Ok(chosen.into_iter().map(|d| d.id.clone()).collect())
}

fn pick_exclusive<'a>(
    topology: &Topology,
    must: &[&'a Device],
    avail: &[&'a Device],
    size: usize,
) -> Vec<&'a Device> {
    let pair_score = |a: &Device, b: &Device| -> i64 {
        let links = i64::from(topology.links(&a.gpu_uuid, &b.gpu_uuid));
        let same_numa = i64::from(a.numa_node.is_some() && a.numa_node == b.numa_node);
        let same_gpu = i64::from(a.gpu_uuid == b.gpu_uuid);
        links * 100 + same_gpu * 50 + same_numa * 10
    };
    let grow = |mut set: Vec<&'a Device>| -> (i64, Vec<&'a Device>) {
        while set.len() < size {
            let best = avail
                .iter()
                .filter(|d| !set.iter().any(|s| s.id == d.id))
                .map(|d| (set.iter().map(|s| pair_score(s, d)).sum::<i64>(), *d))
                // Highest score; ties go to the earliest device (stable, predictable).
                .fold(None::<(i64, &Device)>, |acc, (score, d)| match acc {
                    Some((best, _)) if best >= score => acc,
                    _ => Some((score, d)),
                });
            match best {
                Some((_, d)) => set.push(d),
                None => break,
            }
        }
        let total = set
            .iter()
            .enumerate()
            .flat_map(|(i, a)| set[i + 1..].iter().map(move |b| (*a, *b)))
            .map(|(a, b)| pair_score(a, b))
            .sum();
        (total, set)
    };
    if !must.is_empty() || size == 0 {
        return grow(must.to_vec()).1;
    }
    let mut best: Option<(i64, Vec<&Device>)> = None;
    for seed in avail {
        let (score, set) = grow(vec![*seed]);
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, set));
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}

fn pick_shares<'a>(
    snapshot: &Snapshot,
    must: &[&'a Device],
    avail: &[&'a Device],
    size: usize,
) -> Vec<&'a Device> {
    let policy = &snapshot.allocation;
    // Free shares per unit (GPU or MIG device), in device order.
    let mut free: BTreeMap<&str, Vec<&'a Device>> = BTreeMap::new();
    for d in avail {
        free.entry(d.unit()).or_default().push(d);
    }
    let mut chosen: Vec<&'a Device> = must.to_vec();
    let mut used_units: BTreeSet<&str> = must.iter().map(|d| d.unit()).collect();
    let mut order: Vec<&str> = free.keys().copied().collect();
    // Stable sort keeps unit (UUID) order among equals.
    match policy.replica_strategy {
        ReplicaStrategy::Packed => order.sort_by_key(|u| free[u].len()),
        ReplicaStrategy::Distributed => order.sort_by_key(|u| std::cmp::Reverse(free[u].len())),
    }
    if policy.distinct_gpus || policy.replica_strategy == ReplicaStrategy::Distributed {
        // One share per unit per round; distinct: a single round, fresh units first.
        let rounds = if policy.distinct_gpus { 1 } else { usize::MAX };
        let mut round = 0;
        while chosen.len() < size && round < rounds {
            let before = chosen.len();
            for u in &order {
                if chosen.len() == size {
                    break;
                }
                if policy.distinct_gpus && used_units.contains(u) {
                    continue;
                }
                if let Some(d) = free
                    .get_mut(u)
                    .and_then(|v| (!v.is_empty()).then(|| v.remove(0)))
                {
                    chosen.push(d);
                    used_units.insert(u);
                }
            }
            if chosen.len() == before {
                break;
            }
            round += 1;
        }
        // Not enough distinct units: fill from what is left so the kubelet still gets a
        // full answer (Allocate will refuse the duplicate with a clear error).
        for u in &order {
            while chosen.len() < size {
                match free
                    .get_mut(u)
                    .and_then(|v| (!v.is_empty()).then(|| v.remove(0)))
                {
                    Some(d) => chosen.push(d),
                    None => break,
                }
            }
        }
    } else {
        // Packed: the units the must-include devices are on first, then fullest first.
        order.sort_by_key(|u| !used_units.contains(u));
        for u in &order {
            for d in free[u].iter() {
                if chosen.len() == size {
                    break;
                }
                chosen.push(d);
            }
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{fake::FakeBackend, GpuBackend, Inventory};
    use crate::partition::{config, layout};

    fn setup(inv: &Inventory, yaml: &str) -> (Snapshot, ()) {
        let cfg = config::parse_config("t", yaml).unwrap();
        let plan = layout::plan(inv, &cfg).unwrap();
        let snap = Snapshot {
            generation: 1,
            advertisement: layout::advertise(inv, &cfg, &plan).unwrap(),
            unhealthy: Default::default(),
            allocation: cfg.allocation.clone(),
            topology: Topology::from_inventory(inv),
        };
        (snap, ())
    }

    fn all_ids(s: &Snapshot, r: &str) -> Vec<String> {
        s.resource(r)
            .unwrap()
            .devices
            .iter()
            .map(|d| d.id.clone())
            .collect()
    }

    /// Two NVLink islands (0-1, 2-3) on two NUMA nodes, PCIe between them.
    fn islands() -> Inventory {
        FakeBackend::from_yaml(
            "gpus:\n\
             - { model: A100-80GB, numa: 0, nvlink: [1] }\n\
             - { model: A100-80GB, numa: 0, nvlink: [0] }\n\
             - { model: A100-80GB, numa: 1, nvlink: [3] }\n\
             - { model: A100-80GB, numa: 1, nvlink: [2] }\n",
        )
        .unwrap()
        .inventory()
        .unwrap()
    }

    #[test]
    fn whole_gpus_prefer_nvlink_pairs() {
        let inv = islands();
        let (s, _) = setup(&inv, "version: v1");
        let ids = all_ids(&s, "nvidia.com/gpu");
        // 0 and 3 taken: no pair is left; {1,2} is the only choice.
        let avail = vec![ids[1].clone(), ids[2].clone()];
        assert_eq!(
            preferred(&s, "nvidia.com/gpu", &avail, &[], 2)
                .unwrap()
                .len(),
            2
        );
        // GPU 2 is required: its NVLink peer 3 is preferred over 0 and 1.
        let got = preferred(&s, "nvidia.com/gpu", &ids, &[ids[2].clone()], 2).unwrap();
        assert_eq!(got, vec![ids[2].clone(), ids[3].clone()]);
        // Free choice of 2 from {0, 2, 3}: the linked pair {2, 3}.
        let avail = vec![ids[0].clone(), ids[2].clone(), ids[3].clone()];
        let mut got = preferred(&s, "nvidia.com/gpu", &avail, &[], 2).unwrap();
        got.sort();
        let mut want = vec![ids[2].clone(), ids[3].clone()];
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn replicas_packed_vs_distributed_vs_distinct() {
        let inv = FakeBackend::from_spec("2xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap();
        let ts =
            "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 4 } ] } }";
        let gpu_of = |s: &Snapshot, id: &str| {
            s.resource("nvidia.com/gpu")
                .unwrap()
                .devices
                .iter()
                .find(|d| d.id == id)
                .unwrap()
                .gpu_index
        };

        let (s, _) = setup(&inv, ts);
        let ids = all_ids(&s, "nvidia.com/gpu");
        // GPU 1 already has 2 replicas in use: packing fills it first.
        let avail: Vec<String> = ids[..4].iter().chain(&ids[6..]).cloned().collect();
        let got = preferred(&s, "nvidia.com/gpu", &avail, &[], 2).unwrap();
        assert!(got.iter().all(|id| gpu_of(&s, id) == 1), "{got:?}");

        let (s, _) = setup(
            &inv,
            &format!("{ts}\ntessera: {{ allocation: {{ replicaStrategy: distributed }} }}"),
        );
        let got = preferred(&s, "nvidia.com/gpu", &ids, &[], 2).unwrap();
        let gpus: BTreeSet<u32> = got.iter().map(|id| gpu_of(&s, id)).collect();
        assert_eq!(gpus.len(), 2, "spread over both GPUs: {got:?}");

        let (s, _) = setup(
            &inv,
            &format!("{ts}\ntessera: {{ allocation: {{ distinctGpus: true }} }}"),
        );
        let got = preferred(&s, "nvidia.com/gpu", &ids, &[ids[0].clone()], 2).unwrap();
        assert_eq!(
            gpu_of(&s, &got[1]),
            1,
            "second replica on the other GPU: {got:?}"
        );
    }

    #[test]
    fn bad_requests_are_errors() {
        let inv = FakeBackend::from_spec("2xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap();
        let (s, _) = setup(&inv, "version: v1");
        let ids = all_ids(&s, "nvidia.com/gpu");
        assert!(preferred(&s, "nvidia.com/gpu", &ids, &[], 3).is_err());
        assert!(preferred(&s, "nvidia.com/gpu", &["nope".into()], &[], 1).is_err());
        assert!(preferred(&s, "nvidia.com/x", &ids, &[], 1).is_err());
    }
}
