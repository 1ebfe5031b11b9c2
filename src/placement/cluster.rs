//! Cluster state: free CPU, memory and per-GPU capacity of every node, plus interned
//! "state classes" so that policies can cache their verdict per (node state, demand).
//!
//! Two nodes in the same [`NodeClass`] (same model, same free CPU/memory, same multiset of
//! free GPU capacity) are interchangeable for every policy that only looks at free
//! capacity, so a policy scores a class once and reuses the score until the node changes.

use std::collections::HashMap;

use super::error::{Error, Result};
use super::hash::FxBuild;
use super::types::{Demand, DemandId, GpuDemand, GpuFree, NodeSpec, Placement, Request, MILLI};

/// Interned id of a [`NodeClass`]; stable for the cluster's lifetime.
pub type ClassId = u32;

/// Model index meaning "no GPU model" (CPU-only node).
pub const NO_MODEL: u8 = u8::MAX;
/// At most this many distinct GPU models (the model set is a `u64` bit set).
pub const MAX_MODELS: usize = 64;

/// The free capacity of a node, independent of its name and of GPU order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeClass {
    pub model: u8,
    pub mig: bool,
    pub cpu_left: u32,
    pub mem_left: u64,
    /// Free capacity per GPU, sorted in decreasing order.
    pub gpus: Vec<GpuFree>,
}

impl NodeClass {
    /// Total free GPU compute, in milli.
    pub fn gpu_milli_left(&self) -> u32 {
        self.gpus.iter().map(|g| u32::from(g.milli)).sum()
    }

    /// Number of completely unused GPUs.
    pub fn free_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.milli == MILLI).count()
    }

    /// Whether the demand fits on a node in this state (CPU, memory, model, GPUs).
    pub fn fits(&self, d: &Demand) -> bool {
        if self.cpu_left < d.cpu_milli || self.mem_left < d.memory_mib {
            return false;
        }
        if d.gpu_count == 0 {
            return true;
        }
        if !model_allowed(self.model, d.models) || (d.mig && !self.mig) {
            return false;
        }
        let ok = self
            .gpus
            .iter()
            .filter(|g| g.milli >= d.gpu_milli && g.memory_mib >= d.gpu_memory_mib)
            .count();
        ok >= usize::from(d.gpu_count)
    }
}

/// Whether a node of `model` may serve a demand restricted to `models`.
pub fn model_allowed(model: u8, models: Option<u64>) -> bool {
    match models {
        None => model != NO_MODEL,
        Some(mask) => model != NO_MODEL && (mask >> model) & 1 == 1,
    }
}

/// Mutable state of one node.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub cpu_left: u32,
    pub mem_left: u64,
    /// Free capacity per GPU, in device-index order.
    pub gpus: Vec<GpuFree>,
    /// Current class id.
    pub class: ClassId,
    /// Count of placed pods per GPU-affinity tag (used by GPU clustering).
    pub tags: Vec<(u32, u32)>,
}

/// All nodes of a cluster with their free capacity.
#[derive(Debug, Clone)]
pub struct Cluster {
    specs: Vec<NodeSpec>,
    models: Vec<String>,
    node_model: Vec<u8>,
    nodes: Vec<NodeState>,
    class_ids: HashMap<NodeClass, ClassId, FxBuild>,
    classes: Vec<NodeClass>,
    demand_ids: HashMap<Demand, DemandId, FxBuild>,
    total_gpu_milli: u64,
    allocated_gpu_milli: u64,
}

impl Cluster {
    /// An empty (nothing placed) cluster of these nodes.
    pub fn new(specs: Vec<NodeSpec>) -> Result<Self> {
        let mut models: Vec<String> = Vec::new();
        let mut node_model = Vec::with_capacity(specs.len());
        let mut nodes = Vec::with_capacity(specs.len());
        let mut total = 0u64;
        for s in &specs {
            let model = match &s.gpu_model {
                Some(m) if s.gpu_count > 0 => match models.iter().position(|x| x == m) {
                    Some(i) => i as u8,
                    None => {
                        if models.len() >= MAX_MODELS {
                            return Err(Error::TooManyModels { max: MAX_MODELS });
                        }
                        models.push(m.clone());
                        (models.len() - 1) as u8
                    }
                },
                Some(_) => NO_MODEL,
                None if s.gpu_count > 0 => {
                    return Err(Error::InvalidNode {
                        node: s.name.clone(),
                        reason: "has GPUs but no GPU model".into(),
                    })
                }
                None => NO_MODEL,
            };
            let mem = if s.gpu_memory_mib == 0 {
                u32::MAX
            } else {
                s.gpu_memory_mib
            };
            let gpus = vec![
                GpuFree {
                    milli: MILLI,
                    memory_mib: mem
                };
                usize::from(s.gpu_count)
            ];
            total += u64::from(s.gpu_count) * u64::from(MILLI);
            node_model.push(model);
            nodes.push(NodeState {
                cpu_left: s.cpu_milli,
                mem_left: s.memory_mib,
                gpus,
                class: 0,
                tags: Vec::new(),
            });
        }
        let mut c = Self {
            specs,
            models,
            node_model,
            nodes,
            class_ids: HashMap::default(),
            classes: Vec::new(),
            demand_ids: HashMap::default(),
            total_gpu_milli: total,
            allocated_gpu_milli: 0,
        };
        for i in 0..c.nodes.len() {
            c.reclass(i);
        }
        Ok(c)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the cluster has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The configured spec of node `i`.
    pub fn spec(&self, i: usize) -> &NodeSpec {
        &self.specs[i]
    }

    /// Current state of node `i`.
    pub fn node(&self, i: usize) -> &NodeState {
        &self.nodes[i]
    }

    /// Current class id of node `i`.
    pub fn class_id(&self, i: usize) -> ClassId {
        self.nodes[i].class
    }

    /// The class behind an id.
    pub fn class(&self, id: ClassId) -> &NodeClass {
        &self.classes[id as usize]
    }

    /// Number of classes interned so far (ids are `0..class_count()`).
    pub fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// GPU model names, indexed by the model ids used in classes.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// Total GPU capacity in milli.
    pub fn total_gpu_milli(&self) -> u64 {
        self.total_gpu_milli
    }

    /// GPU milli currently allocated.
    pub fn allocated_gpu_milli(&self) -> u64 {
        self.allocated_gpu_milli
    }

    /// Normalises a request against this cluster (model names to a bit set, MIG to milli).
    pub fn demand(&mut self, r: &Request) -> Result<Demand> {
        let (gpu_count, gpu_milli, gpu_memory_mib, mig) = match &r.gpu {
            GpuDemand::None => (0, 0, 0, false),
            GpuDemand::Shared { milli, memory_mib } => {
                if *milli == 0 || *milli > MILLI {
                    return Err(Error::InvalidRequest {
                        field: "gpu_milli",
                        reason: format!("{milli} is outside 1..=1000"),
                    });
                }
                (1, *milli, *memory_mib, false)
            }
            GpuDemand::Whole { count } => {
                if *count == 0 {
                    return Err(Error::InvalidRequest {
                        field: "num_gpu",
                        reason: "whole-GPU request for 0 GPUs".into(),
                    });
                }
                (*count, MILLI, 0, false)
            }
            GpuDemand::Split {
                count,
                milli,
                memory_mib,
            } => {
                if *count == 0 || *milli == 0 || *milli > MILLI {
                    return Err(Error::InvalidRequest {
                        field: "gpu_milli",
                        reason: format!("{count} × {milli}: need 1 or more of 1..=1000"),
                    });
                }
                (*count, *milli, *memory_mib, false)
            }
            GpuDemand::Mig(p) => (1, p.milli(), p.memory_gb.saturating_mul(1024), true),
        };
        let models = if r.gpu_models.is_empty() || gpu_count == 0 {
            None
        } else {
            let mut mask = 0u64;
            for m in &r.gpu_models {
                if let Some(i) = self.models.iter().position(|x| x == m) {
                    mask |= 1 << i;
                }
            }
            Some(mask)
        };
        let mut d = Demand {
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            gpu_count,
            gpu_milli,
            gpu_memory_mib,
            mig,
            models,
            id: 0,
        };
        let next = self.demand_ids.len() as DemandId;
        d.id = *self.demand_ids.entry(d.clone()).or_insert(next);
        Ok(d)
    }

    /// Whether `d` fits on node `i` now.
    pub fn fits(&self, i: usize, d: &Demand) -> bool {
        self.classes[self.nodes[i].class as usize].fits(d)
    }

    /// The GPUs the default allocator uses on node `i`: the tightest-fitting GPU for one
    /// GPU, the lowest-index fitting GPUs for several. `None` when it does not fit.
    pub fn default_gpus(&self, i: usize, d: &Demand) -> Option<Vec<u8>> {
        if d.gpu_count == 0 {
            return Some(Vec::new());
        }
        let gpus = &self.nodes[i].gpus;
        let ok = |g: &GpuFree| g.milli >= d.gpu_milli && g.memory_mib >= d.gpu_memory_mib;
        if d.gpu_count == 1 {
            let mut best: Option<(u16, usize)> = None;
            for (idx, g) in gpus.iter().enumerate() {
                if ok(g) && best.is_none_or(|(m, _)| g.milli < m) {
                    best = Some((g.milli, idx));
                }
            }
            return best.map(|(_, idx)| vec![idx as u8]);
        }
        let picked: Vec<u8> = gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| ok(g))
            .map(|(i, _)| i as u8)
            .take(usize::from(d.gpu_count))
            .collect();
        (picked.len() == usize::from(d.gpu_count)).then_some(picked)
    }

    /// The lowest-index GPU on node `i` whose free capacity equals `value`.
    pub fn gpu_with(&self, i: usize, value: GpuFree) -> Option<u8> {
        self.nodes[i]
            .gpus
            .iter()
            .position(|g| *g == value)
            .map(|p| p as u8)
    }

    /// Commits a placement. Fails (and changes nothing) if it does not fit.
    pub fn apply(&mut self, d: &Demand, p: &Placement) -> Result<()> {
        let reject = |reason: String| Error::InvalidRequest {
            field: "placement",
            reason,
        };
        let node = self
            .nodes
            .get(p.node)
            .ok_or_else(|| reject(format!("node {} does not exist", p.node)))?;
        let class = &self.classes[node.class as usize];
        if !class.fits(d) || p.gpus.len() != usize::from(d.gpu_count) {
            return Err(reject(format!(
                "demand does not fit on node {}",
                self.specs[p.node].name
            )));
        }
        for (k, &g) in p.gpus.iter().enumerate() {
            let free = node
                .gpus
                .get(usize::from(g))
                .ok_or_else(|| reject(format!("GPU {g} does not exist")))?;
            if free.milli < d.gpu_milli
                || free.memory_mib < d.gpu_memory_mib
                || p.gpus[..k].contains(&g)
            {
                return Err(reject(format!(
                    "GPU {g} on node {} cannot take it",
                    self.specs[p.node].name
                )));
            }
        }
        let node = &mut self.nodes[p.node];
        node.cpu_left -= d.cpu_milli;
        node.mem_left -= d.memory_mib;
        for &g in &p.gpus {
            let free = &mut node.gpus[usize::from(g)];
            free.milli -= d.gpu_milli;
            if free.memory_mib != u32::MAX {
                free.memory_mib -= d.gpu_memory_mib;
            }
        }
        if d.gpu_count > 0 {
            let tag = affinity_tag(d);
            match node.tags.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, n)) => *n += 1,
                None => node.tags.push((tag, 1)),
            }
        }
        self.allocated_gpu_milli += d.total_milli();
        self.reclass(p.node);
        Ok(())
    }

    /// Sets node `i`'s free capacity as another book-keeper sees it (the scheduler
    /// extender's view of a live node): CPU and memory left, and each GPU's free part in
    /// device-index order. Fails, changing nothing, when it does not fit the node's spec.
    pub fn set_free(
        &mut self,
        i: usize,
        cpu_left: u32,
        mem_left: u64,
        gpus: &[GpuFree],
    ) -> Result<()> {
        let reject = |reason: String| Error::InvalidRequest {
            field: "free",
            reason,
        };
        let spec = self
            .specs
            .get(i)
            .ok_or_else(|| reject(format!("node {i} does not exist")))?;
        if cpu_left > spec.cpu_milli
            || mem_left > spec.memory_mib
            || gpus.len() != usize::from(spec.gpu_count)
            || gpus.iter().any(|g| g.milli > MILLI)
        {
            return Err(reject(format!(
                "node {}: {cpu_left} CPU milli, {mem_left} MiB and {} GPUs free exceed its spec",
                spec.name,
                gpus.len()
            )));
        }
        let node = &self.nodes[i];
        if node.cpu_left == cpu_left && node.mem_left == mem_left && node.gpus == gpus {
            return Ok(());
        }
        let used = |gs: &[GpuFree]| -> u64 { gs.iter().map(|g| u64::from(MILLI - g.milli)).sum() };
        self.allocated_gpu_milli = self.allocated_gpu_milli - used(&node.gpus) + used(gpus);
        let node = &mut self.nodes[i];
        node.cpu_left = cpu_left;
        node.mem_left = mem_left;
        node.gpus = gpus.to_vec();
        self.reclass(i);
        Ok(())
    }

    /// Undoes [`Cluster::apply`]: gives back what `d` took at `p` (a pod that ended or
    /// was evicted). Fails, changing nothing, when `p` does not hold `d`.
    pub fn release(&mut self, d: &Demand, p: &Placement) -> Result<()> {
        let reject = |reason: String| Error::InvalidRequest {
            field: "placement",
            reason,
        };
        let spec = self
            .specs
            .get(p.node)
            .ok_or_else(|| reject(format!("node {} does not exist", p.node)))?;
        let node = &self.nodes[p.node];
        let cap = MILLI;
        let holds = p.gpus.len() == usize::from(d.gpu_count)
            && p.gpus.iter().all(|&g| {
                node.gpus
                    .get(usize::from(g))
                    .is_some_and(|free| free.milli + d.gpu_milli <= cap)
            })
            && node
                .cpu_left
                .checked_add(d.cpu_milli)
                .is_some_and(|c| c <= spec.cpu_milli)
            && node
                .mem_left
                .checked_add(d.memory_mib)
                .is_some_and(|m| m <= spec.memory_mib);
        if !holds {
            return Err(reject(format!(
                "node {} does not hold this demand",
                spec.name
            )));
        }
        let node = &mut self.nodes[p.node];
        node.cpu_left += d.cpu_milli;
        node.mem_left += d.memory_mib;
        for &g in &p.gpus {
            let free = &mut node.gpus[usize::from(g)];
            free.milli += d.gpu_milli;
            if free.memory_mib != u32::MAX {
                free.memory_mib += d.gpu_memory_mib;
            }
        }
        if d.gpu_count > 0 {
            let tag = affinity_tag(d);
            if let Some(i) = node.tags.iter().position(|(t, _)| *t == tag) {
                node.tags[i].1 -= 1;
                if node.tags[i].1 == 0 {
                    node.tags.swap_remove(i);
                }
            }
        }
        self.allocated_gpu_milli -= d.total_milli();
        self.reclass(p.node);
        Ok(())
    }

    fn reclass(&mut self, i: usize) {
        let n = &self.nodes[i];
        let mut gpus = n.gpus.clone();
        gpus.sort_unstable_by(|a, b| b.cmp(a));
        let key = NodeClass {
            model: self.node_model[i],
            mig: self.specs[i].mig_capable,
            cpu_left: n.cpu_left,
            mem_left: n.mem_left,
            gpus,
        };
        let next = self.classes.len() as ClassId;
        let id = match self.class_ids.get(&key) {
            Some(&id) => id,
            None => {
                self.class_ids.insert(key.clone(), next);
                self.classes.push(key);
                next
            }
        };
        self.nodes[i].class = id;
    }
}

/// The GPU-affinity tag of a demand, as GPU clustering groups tasks: every GPU-sharing
/// task shares one tag; whole-GPU tasks are tagged by their GPU count.
pub fn affinity_tag(d: &Demand) -> u32 {
    if d.is_shared() {
        u32::MAX
    } else {
        u32::from(d.gpu_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> Cluster {
        let specs = vec![
            NodeSpec::new("a", 8000, 64_000, 2, "T4"),
            NodeSpec::new("b", 8000, 64_000, 2, "T4"),
        ];
        Cluster::new(specs).unwrap()
    }

    #[test]
    fn identical_nodes_share_a_class_until_one_changes() {
        let mut c = two_nodes();
        assert_eq!(c.class_id(0), c.class_id(1));
        let d = c.demand(&Request::shared(1000, 1000, 500)).unwrap();
        c.apply(
            &d,
            &Placement {
                node: 0,
                gpus: vec![1],
            },
        )
        .unwrap();
        assert_ne!(c.class_id(0), c.class_id(1));
        assert_eq!(c.node(0).gpus[1].milli, 500);
        assert_eq!(c.allocated_gpu_milli(), 500);
    }

    #[test]
    fn apply_rejects_what_does_not_fit_and_changes_nothing() {
        let mut c = two_nodes();
        let big = c.demand(&Request::whole(1000, 1000, 2)).unwrap();
        c.apply(
            &big,
            &Placement {
                node: 0,
                gpus: vec![0, 1],
            },
        )
        .unwrap();
        let one = c.demand(&Request::shared(1000, 1000, 100)).unwrap();
        assert!(c
            .apply(
                &one,
                &Placement {
                    node: 0,
                    gpus: vec![0]
                }
            )
            .is_err());
        assert!(c
            .apply(
                &big,
                &Placement {
                    node: 1,
                    gpus: vec![0, 0]
                }
            )
            .is_err());
        assert!(c
            .apply(
                &one,
                &Placement {
                    node: 7,
                    gpus: vec![0]
                }
            )
            .is_err());
        assert_eq!(c.allocated_gpu_milli(), 2000);
    }

    #[test]
    fn default_gpus_is_tightest_fit_for_one_and_first_fit_for_many() {
        let mut c = Cluster::new(vec![NodeSpec::new("a", 64_000, 64_000, 4, "G2")]).unwrap();
        let d600 = c.demand(&Request::shared(100, 10, 600)).unwrap();
        let d300 = c.demand(&Request::shared(100, 10, 300)).unwrap();
        c.apply(
            &d600,
            &Placement {
                node: 0,
                gpus: vec![2],
            },
        )
        .unwrap();
        assert_eq!(c.default_gpus(0, &d300), Some(vec![2]));
        let two = c.demand(&Request::whole(100, 10, 2)).unwrap();
        assert_eq!(c.default_gpus(0, &two), Some(vec![0, 1]));
        let four = c.demand(&Request::whole(100, 10, 4)).unwrap();
        assert_eq!(c.default_gpus(0, &four), None);
    }

    #[test]
    fn fits_checks_cpu_memory_model_mig_and_gpu_memory() {
        let specs = vec![
            NodeSpec::new("t4", 4000, 1000, 1, "T4").with_gpu_memory(15_000),
            NodeSpec::new("a100", 4000, 1000, 1, "A100").with_mig(),
            NodeSpec::new("cpu", 4000, 1000, 0, ""),
        ];
        let mut c = Cluster::new(specs).unwrap();
        let cases: Vec<(Request, [bool; 3])> = vec![
            (Request::cpu(4000, 1000), [true, true, true]),
            (Request::cpu(4001, 1000), [false, false, false]),
            (Request::cpu(100, 1001), [false, false, false]),
            (Request::shared(100, 10, 500), [true, true, false]),
            (
                Request::shared(100, 10, 500).on_models(&["A100"]),
                [false, true, false],
            ),
            (
                Request::shared(100, 10, 500).on_models(&["H100"]),
                [false, false, false],
            ),
            (
                Request {
                    gpu: GpuDemand::Shared {
                        milli: 300,
                        memory_mib: 16_000,
                    },
                    ..Request::cpu(100, 10)
                },
                [false, true, false],
            ),
            (
                Request {
                    gpu: GpuDemand::Mig(super::super::MigProfile::parse("1g.10gb").unwrap()),
                    ..Request::cpu(100, 10)
                },
                [false, true, false],
            ),
        ];
        for (r, want) in cases {
            let d = c.demand(&r).unwrap();
            let got = [c.fits(0, &d), c.fits(1, &d), c.fits(2, &d)];
            assert_eq!(got, want, "{r:?}");
        }
    }

    #[test]
    fn release_undoes_apply_and_refuses_what_is_not_held() {
        let mut c = two_nodes();
        let before = (
            c.node(0).clone().gpus,
            c.class_id(0),
            c.allocated_gpu_milli(),
        );
        let d = c.demand(&Request::shared(1000, 10, 300)).unwrap();
        let p = Placement {
            node: 0,
            gpus: vec![1],
        };
        assert!(c.release(&d, &p).is_err(), "nothing placed yet");
        c.apply(&d, &p).unwrap();
        assert_eq!(c.allocated_gpu_milli(), before.2 + 300);
        c.release(&d, &p).unwrap();
        assert_eq!(
            (
                c.node(0).clone().gpus,
                c.class_id(0),
                c.allocated_gpu_milli()
            ),
            before
        );
        assert!(c.node(0).tags.is_empty());
    }

    #[test]
    fn set_free_moves_the_node_to_its_class_and_refuses_more_than_the_spec() {
        let mut c = two_nodes();
        let half = GpuFree {
            milli: 500,
            memory_mib: 100,
        };
        let whole = c.node(0).gpus[0];
        c.set_free(0, 6000, 60_000, &[whole, half]).unwrap();
        assert_eq!(c.allocated_gpu_milli(), 500);
        assert_eq!(c.node(0).gpus, vec![whole, half]);
        // The same free capacity in another GPU order is the same class.
        c.set_free(1, 6000, 60_000, &[half, whole]).unwrap();
        assert_eq!(c.class_id(0), c.class_id(1));
        assert_eq!(c.allocated_gpu_milli(), 1000);
        let before = c.class_id(0);
        for (cpu, mem, gpus) in [
            (8001, 64_000, vec![whole, whole]),
            (8000, 64_001, vec![whole, whole]),
            (8000, 64_000, vec![whole]),
        ] {
            assert!(c.set_free(0, cpu, mem, &gpus).is_err());
        }
        assert!(c.set_free(2, 0, 0, &[]).is_err());
        assert_eq!((c.class_id(0), c.allocated_gpu_milli()), (before, 1000));
    }

    #[test]
    fn demand_rejects_bad_requests_and_interns_equal_ones() {
        let mut c = two_nodes();
        assert!(c.demand(&Request::shared(1, 1, 0)).is_err());
        assert!(c.demand(&Request::shared(1, 1, 1001)).is_err());
        assert!(c.demand(&Request::whole(1, 1, 0)).is_err());
        for (count, milli) in [(0, 100), (2, 0), (2, 1001)] {
            let split = Request {
                gpu: GpuDemand::Split {
                    count,
                    milli,
                    memory_mib: 0,
                },
                ..Request::cpu(1, 1)
            };
            assert!(c.demand(&split).is_err(), "{count} × {milli}");
        }
        let a = c.demand(&Request::shared(1, 1, 10)).unwrap();
        let b = c.demand(&Request::shared(1, 1, 10)).unwrap();
        let other = c.demand(&Request::shared(1, 1, 20)).unwrap();
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, other.id);
    }
}
