//! The placement engine `tessera simulate` measures, over the extender's books: prioritize
//! scores nodes by the engine's verdicts and bind takes the GPUs the engine picks.
//!
//! ```text
//! books (per GPU: memory, cores, slots) + CPU/memory use ─► Cluster (GPU milli, CPU, MiB)
//! pod (vGPU request + CPU/memory) ─► Request ─► Demand (against each node's GPU memory)
//! policy (Tessera's; binpack/spread by annotation).verdict(node) ─► rank ─► 0..=10
//!                                                               └─► bind's GPUs
//! ```
//!
//! The engine's view is one [`Cluster`] of every vGPU node (so Tessera's host pressure is
//! measured over the whole fleet, as in the simulator), rebuilt when the nodes change;
//! each call first copies the candidates' current state from the books into it, so the
//! verdicts the policies memoise per node state stay valid. The fragmentation measure
//! is taken against a workload: the pods the extender was recently asked about
//! ([`WorkloadSource::Learned`]), or a fixed list (a replay of a known pod list, which is how
//! `tessera simulate` takes its whole pod list). The vGPU-to-milli mapping is
//! [`crate::vgpu::share`]'s.
//!
//! Pure: no I/O, no clock.

use super::wire::MAX_EXTENDER_PRIORITY;
use crate::placement::{
    Cluster, Demand, GpuFree, NodeSpec, Policy as Placer, PolicyContext, PolicyKind, TieBreak,
};
use crate::vgpu::request::{PodRequest, Policy};
use crate::vgpu::share::{engine_request, gpu_free, HostRequest};
use crate::vgpu::NodeBooks;
use std::collections::{HashMap, HashSet, VecDeque};

/// FGD's target workload: the popular shapes covering this share of the pods (as
/// `tessera simulate`).
const COVERAGE: f64 = 0.95;

/// The pods [`WorkloadSource::Learned`] remembers by default.
pub const DEFAULT_LEARNED_PODS: usize = 10_000;

/// What the engine's fragmentation measure is taken against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadSource {
    /// The last this many pods the extender was asked to prioritize (one entry per pod).
    Learned(usize),
    /// A fixed list, set with [`Engine::set_workload`].
    Fixed,
}

/// One pod of the workload: its vGPUs (none for a CPU-only pod) and its CPU and memory.
pub type PodShape = (Option<PodRequest>, HostRequest);

/// One node as the engine reads it: its books and its CPU and memory.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    /// The node's books.
    pub books: &'a NodeBooks,
    /// What the node offers pods (`None`: plentiful).
    pub allocatable: Option<HostRequest>,
    /// What its pods take.
    pub used: HostRequest,
}

/// The engine over the books.
pub struct Engine {
    workload: WorkloadSource,
    /// The workload's pods, oldest first.
    shapes: VecDeque<PodShape>,
    /// UIDs of the learned pods (each counted once).
    seen: HashSet<String>,
    order: VecDeque<String>,
    /// The workload changed since the policies were built.
    stale: bool,
    view: Option<View>,
}

/// The nodes as one cluster, and the policies built on it.
struct View {
    cluster: Cluster,
    index: HashMap<String, usize>,
    specs: Vec<NodeSpec>,
    /// Per node: the GPU memory a pod's shares are taken against (its first GPU's).
    gpu_memory: Vec<u64>,
    context: PolicyContext,
    policies: Vec<Box<dyn Placer>>,
}

impl Engine {
    /// An engine with no nodes yet.
    pub fn new(workload: WorkloadSource) -> Engine {
        Engine {
            workload,
            shapes: VecDeque::new(),
            seen: HashSet::new(),
            order: VecDeque::new(),
            stale: true,
            view: None,
        }
    }

    /// Fixes the workload to `pods` (with [`WorkloadSource::Fixed`]; ignored otherwise).
    pub fn set_workload(&mut self, pods: Vec<PodShape>) {
        if self.workload == WorkloadSource::Fixed {
            self.shapes = pods.into();
            self.rebuild_policies();
        }
    }

    /// Remembers a pod the extender was asked about (with [`WorkloadSource::Learned`]); the
    /// policies see it once rebuilt at the next [`Engine::sync`].
    pub fn observe(&mut self, uid: &str, vgpus: Option<&PodRequest>, host: HostRequest) {
        let WorkloadSource::Learned(limit) = self.workload else {
            return;
        };
        if limit == 0 || !self.seen.insert(uid.to_string()) {
            return;
        }
        self.shapes.push_back((vgpus.cloned(), host));
        self.order.push_back(uid.to_string());
        while self.shapes.len() > limit {
            self.shapes.pop_front();
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.stale = true;
    }

    /// Brings the view in line with `nodes` (every vGPU node with readable GPUs, by
    /// name): the cluster is rebuilt when a node comes, goes or changes its GPUs or
    /// allocatable CPU and memory, the policies when the cluster or the workload changed.
    pub fn sync<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'a str, NodeView<'a>)>,
    ) -> Result<(), String> {
        let mut names = Vec::new();
        let mut specs = Vec::new();
        let mut gpu_memory = Vec::new();
        for (name, view) in nodes {
            let (spec, memory) = spec_of(name, &view);
            names.push(name.to_string());
            specs.push(spec);
            gpu_memory.push(memory);
        }
        if self.view.as_ref().is_some_and(|v| v.specs == specs) {
            if self.stale {
                self.rebuild_policies();
            }
            return Ok(());
        }
        self.view = None;
        let cluster = Cluster::new(specs.clone()).map_err(|e| {
            format!("the placement engine cannot hold the vGPU nodes: {e}; nodes score 0")
        })?;
        let index = names.into_iter().enumerate().map(|(i, n)| (n, i)).collect();
        self.view = Some(View {
            cluster,
            index,
            specs,
            gpu_memory,
            context: PolicyContext::default(),
            policies: Vec::new(),
        });
        self.rebuild_policies();
        Ok(())
    }

    /// The policies anew, from the current workload.
    fn rebuild_policies(&mut self) {
        self.stale = false;
        let Some(view) = self.view.as_mut() else {
            return;
        };
        let reference = most_common(&view.gpu_memory);
        let models = view.cluster.models().to_vec();
        let demands: Vec<Demand> = self
            .shapes
            .iter()
            .filter_map(|(vgpus, host)| {
                let r = engine_request(vgpus.as_ref(), *host, reference, &models);
                view.cluster.demand(&r).ok()
            })
            .collect();
        view.context = PolicyContext::from_demands(&demands, COVERAGE, TieBreak::First);
        view.policies.clear();
    }

    /// The engine's verdict for the pod on each candidate (`None`: the engine cannot
    /// place it there), by `policy` (`None`: Tessera's).
    pub fn verdicts(
        &mut self,
        candidates: &[(&str, NodeView<'_>)],
        vgpus: Option<&PodRequest>,
        host: HostRequest,
        policy: Option<Policy>,
    ) -> Vec<Option<f64>> {
        let Some(view) = self.view.as_mut() else {
            return vec![None; candidates.len()];
        };
        let kind = kind_of(policy);
        let mut demands: HashMap<u64, Option<Demand>> = HashMap::new();
        let mut out = Vec::with_capacity(candidates.len());
        for (name, node) in candidates {
            let Some((i, d)) = view.prepare(name, node, vgpus, host, &mut demands) else {
                out.push(None);
                continue;
            };
            let policy = policy_of(&mut view.policies, &view.context, kind);
            out.push(policy.verdict(&view.cluster, i, &d).map(|v| v.score));
        }
        out
    }

    /// The GPUs (indices into the node's books) the engine takes for the pod on `node`,
    /// by `policy` (`None`: Tessera's); empty when it cannot place the pod there.
    pub fn gpus(
        &mut self,
        name: &str,
        node: NodeView<'_>,
        vgpus: Option<&PodRequest>,
        host: HostRequest,
        policy: Option<Policy>,
    ) -> Vec<usize> {
        let Some(view) = self.view.as_mut() else {
            return Vec::new();
        };
        let Some((i, d)) = view.prepare(name, &node, vgpus, host, &mut HashMap::new()) else {
            return Vec::new();
        };
        let policy = policy_of(&mut view.policies, &view.context, kind_of(policy));
        policy
            .verdict(&view.cluster, i, &d)
            .and_then(|v| v.placement(&view.cluster, i, &d))
            .map(|p| p.gpus.into_iter().map(usize::from).collect())
            .unwrap_or_default()
    }
}

impl View {
    /// Copies the node's state from its books into the cluster and returns its index
    /// and the pod's demand against its GPUs (`demands` caches them by GPU memory).
    fn prepare(
        &mut self,
        name: &str,
        node: &NodeView<'_>,
        vgpus: Option<&PodRequest>,
        host: HostRequest,
        demands: &mut HashMap<u64, Option<Demand>>,
    ) -> Option<(usize, Demand)> {
        let i = *self.index.get(name)?;
        let spec = &self.specs[i];
        let free: Vec<GpuFree> = node
            .books
            .gpus()
            .take(usize::from(spec.gpu_count))
            .map(|(gpu, used)| gpu_free(gpu, used))
            .collect();
        let (cpu_left, mem_left) = match node.allocatable {
            Some(a) => {
                let left = a.minus(node.used);
                (left.cpu_milli, left.memory_mib)
            }
            None => (spec.cpu_milli, spec.memory_mib),
        };
        self.cluster
            .set_free(
                i,
                cpu_left.min(spec.cpu_milli),
                mem_left.min(spec.memory_mib),
                &free,
            )
            .ok()?;
        let memory = self.gpu_memory[i];
        let cluster = &mut self.cluster;
        let d = demands
            .entry(memory)
            .or_insert_with(|| {
                let r = engine_request(vgpus, host, memory, cluster.models());
                cluster.demand(&r).ok()
            })
            .clone()?;
        Some((i, d))
    }
}

/// The policy of `kind` among `policies`, built from `context` on first use.
fn policy_of<'a>(
    policies: &'a mut Vec<Box<dyn Placer>>,
    context: &PolicyContext,
    kind: PolicyKind,
) -> &'a mut dyn Placer {
    let at = match policies.iter().position(|p| p.kind() == kind) {
        Some(at) => at,
        None => {
            policies.push(kind.build(context));
            policies.len() - 1
        }
    };
    policies[at].as_mut()
}

/// The engine's policy for a pod's policy annotation.
fn kind_of(policy: Option<Policy>) -> PolicyKind {
    match policy {
        None => PolicyKind::Tessera,
        Some(Policy::Binpack) => PolicyKind::Binpack,
        Some(Policy::Spread) => PolicyKind::Spread,
    }
}

/// A node's spec for the engine, and the GPU memory its pods' shares are taken against.
fn spec_of(name: &str, view: &NodeView<'_>) -> (NodeSpec, u64) {
    let gpus: Vec<_> = view.books.gpus().map(|(g, _)| g).collect();
    let count = u8::try_from(gpus.len()).unwrap_or(u8::MAX);
    let first = gpus.first();
    let memory = first.map_or(0, |g| g.memory_mib);
    let (cpu_milli, memory_mib) = view
        .allocatable
        .map_or((u32::MAX, u64::MAX), |a| (a.cpu_milli, a.memory_mib));
    let spec = NodeSpec {
        name: name.to_string(),
        cpu_milli,
        memory_mib,
        gpu_count: count,
        gpu_model: first.map(|g| g.model.clone()),
        gpu_memory_mib: u32::try_from(memory).unwrap_or(u32::MAX),
        mig_capable: false,
    };
    (spec, memory)
}

/// The most common value (the smallest among equally common ones); 0 when empty.
fn most_common(values: &[u64]) -> u64 {
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for v in values {
        *counts.entry(*v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(v, n)| (n, std::cmp::Reverse(v)))
        .map_or(0, |(v, _)| v)
}

/// The extender's scores (0..=[`MAX_SCORE`]) from the engine's verdicts: the best
/// verdict gets the most, the next best distinct verdict one less, and so on, so the
/// node the engine would choose always scores highest and equal verdicts score equal.
/// Nodes below the tenth distinct verdict, and those without one, get 0.
pub fn extender_scores(verdicts: &[Option<f64>]) -> Vec<u8> {
    let mut distinct: Vec<f64> = verdicts.iter().flatten().copied().collect();
    distinct.sort_by(|a, b| b.total_cmp(a));
    distinct.dedup();
    verdicts
        .iter()
        .map(|v| {
            v.map_or(0, |v| {
                // `distinct` falls: the verdict's rank is the count of better ones.
                let rank = distinct.partition_point(|d| *d > v);
                u8::try_from(rank).map_or(0, |r| MAX_SCORE.saturating_sub(r))
            })
        })
        .collect()
}

/// The highest score, the extender protocol's `MaxExtenderPriority`.
pub const MAX_SCORE: u8 = MAX_EXTENDER_PRIORITY as u8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Placement, Request, SplitMix64};
    use crate::vgpu::request::{ContainerKind, ContainerRequest, MemoryRequest, Selectors};
    use crate::vgpu::GpuRecord;

    /// MiB per milli: GPUs of 16,000 MiB, so a share of m milli is 16·m MiB exactly.
    const MIB: u64 = 16;
    const CPU: u32 = 64_000;

    fn vgpu(milli: u64) -> PodRequest {
        PodRequest {
            containers: vec![ContainerRequest {
                name: "main".into(),
                kind: ContainerKind::App,
                count: 1,
                memory: MemoryRequest::Mib(milli * MIB),
                cores: 0,
            }],
            selectors: Selectors::default(),
            gpu_policy: None,
            node_policy: None,
        }
    }

    fn host() -> HostRequest {
        HostRequest {
            cpu_milli: 1000,
            memory_mib: 1024,
        }
    }

    /// A node of 16,000 MiB GPUs with a pod of `milli` booked on each GPU (0: none).
    fn node(name: &str, booked: &[u64]) -> NodeBooks {
        let gpus = (0..booked.len())
            .map(|g| GpuRecord::new(&format!("{name}-{g}"), "A100", 1000 * MIB))
            .collect();
        let mut books = NodeBooks::new(name, gpus);
        for (g, &milli) in booked.iter().enumerate().filter(|(_, m)| **m > 0) {
            let mut request = vgpu(milli);
            request.selectors.use_uuids = vec![format!("{name}-{g}")];
            let a = books.fit(&format!("filler-{g}"), &request).expect("fits");
            books.reserve(books.version(), a).expect("reserves");
        }
        books
    }

    fn view(books: &NodeBooks) -> NodeView<'_> {
        NodeView {
            books,
            allocatable: Some(HostRequest {
                cpu_milli: CPU,
                memory_mib: 1 << 20,
            }),
            used: HostRequest::default(),
        }
    }

    /// The workload of `tessera_keeps_gpus_on_the_packing_plan`: its cutting-stock plan
    /// packs 550 + 230 + 220 and 650 + 320 on one GPU each.
    const SIZES: [u64; 5] = [550, 230, 220, 650, 320];

    fn engine(nodes: &[(&str, &NodeBooks)]) -> Engine {
        let mut e = Engine::new(WorkloadSource::Fixed);
        e.set_workload(SIZES.iter().map(|&m| (Some(vgpu(m)), host())).collect());
        e.sync(nodes.iter().map(|(n, b)| (*n, view(b))))
            .expect("a cluster");
        e
    }

    /// The same nodes as the simulator's cluster, and its choice for a pod of `milli`.
    fn simulator_choice(nodes: &[(&str, &[u64])], kind: PolicyKind, milli: u16) -> Placement {
        let specs = nodes
            .iter()
            .map(|(n, b)| NodeSpec::new(n, CPU, 1 << 20, b.len() as u8, "A100"))
            .collect();
        let mut c = Cluster::new(specs).expect("a cluster");
        for (i, (_, booked)) in nodes.iter().enumerate() {
            for (g, &m) in booked.iter().enumerate().filter(|(_, m)| **m > 0) {
                let d = c.demand(&Request::shared(0, 0, m as u16)).expect("valid");
                let at = Placement {
                    node: i,
                    gpus: vec![g as u8],
                };
                c.apply(&d, &at).expect("fits");
            }
        }
        let shapes: Vec<Demand> = SIZES
            .iter()
            .map(|&m| {
                c.demand(&Request::shared(1000, 1024, m as u16))
                    .expect("valid")
            })
            .collect();
        let ctx = PolicyContext::from_demands(&shapes, COVERAGE, TieBreak::First);
        let d = c
            .demand(&Request::shared(1000, 1024, milli))
            .expect("valid");
        kind.build(&ctx)
            .place(&c, &d, &mut SplitMix64::new(1))
            .expect("a placement")
    }

    #[test]
    fn verdicts_rank_nodes_as_the_simulators_engine_places() {
        // x holds a 650 (350 free), y a 550 (450 free), z nothing. A 230 on x leaves
        // 120, which no planned combination passes through; on y it leaves 220, which
        // waits for a 220; on z 770. Tessera: y; binpack: x (fullest); spread: z.
        let booked: [(&str, &[u64]); 3] = [("x", &[650]), ("y", &[550]), ("z", &[0])];
        let books: Vec<NodeBooks> = booked.iter().map(|(n, b)| node(n, b)).collect();
        let named: Vec<(&str, &NodeBooks)> = booked.iter().map(|(n, _)| *n).zip(&books).collect();
        let mut e = engine(&named);
        let candidates: Vec<(&str, NodeView<'_>)> =
            named.iter().map(|(n, b)| (*n, view(b))).collect();
        let cases = [
            (None, PolicyKind::Tessera, "y", [8, 10, 9]),
            (Some(Policy::Binpack), PolicyKind::Binpack, "x", [10, 9, 8]),
            (Some(Policy::Spread), PolicyKind::Spread, "z", [8, 9, 10]),
        ];
        for (policy, kind, want, scores) in cases {
            let verdicts = e.verdicts(&candidates, Some(&vgpu(230)), host(), policy);
            assert_eq!(extender_scores(&verdicts), scores, "{kind}");
            let best = verdicts
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.map(|v| (i, v)))
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
                .map(|(i, _)| booked[i].0);
            assert_eq!(best, Some(want), "{kind}");
            let sim = simulator_choice(&booked, kind, 230);
            assert_eq!(booked[sim.node].0, want, "{kind}: the simulator agrees");
        }
    }

    #[test]
    fn bind_takes_the_gpus_the_engine_picks() {
        // One node: GPU 0 holds a 650, GPU 1 a 550, GPU 2 nothing. Tessera keeps to the
        // plan (GPU 1: 220 left); binpack takes the fullest that fits, spread the emptiest.
        let booked: &[u64] = &[650, 550, 0];
        let books = node("w", booked);
        let mut e = engine(&[("w", &books)]);
        let cases = [
            (None, PolicyKind::Tessera, 1),
            (Some(Policy::Binpack), PolicyKind::Binpack, 0),
            (Some(Policy::Spread), PolicyKind::Spread, 2),
        ];
        for (policy, kind, want) in cases {
            let gpus = e.gpus("w", view(&books), Some(&vgpu(230)), host(), policy);
            assert_eq!(gpus, [want], "{kind}");
            let sim = simulator_choice(&[("w", booked)], kind, 230);
            assert_eq!(sim.gpus, [want as u8], "{kind}: the simulator agrees");
        }
        // A node the engine does not know, or a pod that fits nowhere: no preference.
        let other = node("v", &[0]);
        assert!(e
            .gpus("v", view(&other), Some(&vgpu(230)), host(), None)
            .is_empty());
        assert!(e
            .gpus("w", view(&books), Some(&vgpu(1500)), host(), None)
            .is_empty());
    }

    #[test]
    fn scores_are_ranks_of_the_verdicts() {
        let cases: [(&[Option<f64>], &[u8]); 5] = [
            (&[], &[]),
            (&[None, None], &[0, 0]),
            (&[Some(-3.0), Some(7.5), None, Some(7.5)], &[9, 10, 0, 10]),
            (&[Some(-10_000.0), Some(0.0), Some(-0.0)], &[9, 10, 10]),
            (
                &[
                    Some(0.0),
                    Some(1.0),
                    Some(2.0),
                    Some(3.0),
                    Some(4.0),
                    Some(5.0),
                    Some(6.0),
                    Some(7.0),
                    Some(8.0),
                    Some(9.0),
                    Some(10.0),
                    Some(11.0),
                ],
                &[0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            ),
        ];
        for (verdicts, want) in cases {
            assert_eq!(extender_scores(verdicts), want, "{verdicts:?}");
        }
    }

    #[test]
    fn a_learned_workload_keeps_each_pod_once_and_the_latest_ones() {
        let mut e = Engine::new(WorkloadSource::Learned(2));
        for uid in ["a", "a", "b", "c"] {
            e.observe(uid, Some(&vgpu(100)), host());
        }
        assert_eq!(e.shapes.len(), 2);
        assert_eq!(e.order, ["b", "c"]);
        assert!(!e.seen.contains("a") && e.stale);
        // A fixed workload ignores what it is asked about, a learned one a fixed list.
        e.set_workload(vec![(None, host())]);
        assert_eq!(e.shapes.len(), 2);
        let mut fixed = Engine::new(WorkloadSource::Fixed);
        fixed.observe("a", None, host());
        assert!(fixed.shapes.is_empty());
    }

    #[test]
    fn nodes_changing_rebuild_the_view_and_unknown_nodes_have_no_verdict() {
        let a = node("a", &[0]);
        let mut e = engine(&[("a", &a)]);
        let b = node("b", &[0, 0]);
        let verdicts = e.verdicts(&[("b", view(&b))], Some(&vgpu(100)), host(), None);
        assert_eq!(verdicts, [None]);
        e.sync([("a", view(&a)), ("b", view(&b))])
            .expect("a cluster");
        let verdicts = e.verdicts(&[("b", view(&b))], Some(&vgpu(100)), host(), None);
        assert!(verdicts[0].is_some());
    }
}
