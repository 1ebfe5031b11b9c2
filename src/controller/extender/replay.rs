//! A pod list replayed through the extender's decision path under `tessera simulate`'s
//! protocol: the same arrival (seeded draws up to 130% of the GPU capacity), each pod
//! sent through [`Books::filter`], [`Books::prioritize`] and [`Books::reserve`] as
//! kube-scheduler calls `/filter`, `/prioritize` and `/bind` (no HTTP), so the live path
//! can be measured against the simulator on the same trace and cluster.
//!
//! The scheduler's own part is played here: its CPU and memory filter
//! (`NodeResourcesFit`, from its own tally of the pods it bound), and the choice of the
//! highest prioritize score, the first candidate among equals (the extender's score is
//! the only score; the simulator breaks ties the same way).
//!
//! The trace in the extender's terms (docs/hami.md, "How prioritize scores"):
//!
//! - every node publishes its GPUs as vGPU records of [`MIB_PER_MILLI`] × 1000 MiB each,
//!   with 1000 slots (a trace pod takes at least 1 milli, so slots never run out, as in
//!   the simulator, which has none) and its CPU and memory as allocatable;
//! - a pod of `gpu_milli` m < 1000 asks `nvidia.com/gpu: 1` and `nvidia.com/gpumem`
//!   m × [`MIB_PER_MILLI`] (an exact share of m milli); a pod of n whole GPUs asks
//!   `nvidia.com/gpu: n` and no memory (HAMi's default: the whole GPU's); its CPU and
//!   memory are container requests; its GPU models, `nvidia.com/use-gputype`;
//! - the engine's workload is the whole pod list, fixed before the run, as the
//!   simulator's is.
//!
//! Pure: no I/O.

use super::engine::WorkloadSource;
use super::records::NodeState;
use super::state::{Books, BooksConfig};
use crate::placement::{frag_milli, Demand, PolicyKind, MILLI};
use crate::sim::protocol::{run_with, Placer, Prepared, RunResult};
use crate::vgpu::request::{Policy, GPU_POLICY, NODE_POLICY, USE_GPUTYPE};
use crate::vgpu::share::{gpu_free, HostRequest};
use crate::vgpu::GpuRecord;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use std::collections::BTreeMap;

/// GPU memory per milli of a trace pod: a GPU has 1000 × this MiB.
pub const MIB_PER_MILLI: u64 = 16;

/// vGPU slots per GPU: more than any trace GPU holds.
const SLOTS: u32 = 1000;

/// Why a pod list cannot be replayed exactly.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A pod's GPU models cannot be written as `use-gputype` (which matches
    /// substrings) without also allowing others.
    #[error("pod {pod}: its GPU models {models:?} cannot be asked for exactly by use-gputype")]
    Models { pod: usize, models: Vec<String> },
    /// A pod or node made here does not read back (a bug in the replay).
    #[error("pod {pod}: {why}")]
    Pod { pod: usize, why: String },
}

/// Runs the protocol's arrival for `seed` through the extender's path, with the pods
/// asking for `policy` by annotation (`None`: Tessera's, the default).
pub fn run(p: &Prepared, policy: Option<Policy>, seed: u64) -> Result<RunResult, ReplayError> {
    let mut replay = Replay::new(p, policy)?;
    let kind = match policy {
        None => PolicyKind::Tessera,
        Some(Policy::Binpack) => PolicyKind::Binpack,
        Some(Policy::Spread) => PolicyKind::Spread,
    };
    Ok(run_with(p, kind, seed, &mut replay))
}

/// The extender's books for the prepared cluster and the scheduler's own tally.
struct Replay<'a> {
    p: &'a Prepared,
    books: Books,
    /// Per pod of the list, the pod as the extender receives it.
    pods: Vec<Pod>,
    names: Vec<String>,
    allocatable: Vec<HostRequest>,
    /// The scheduler's tally of the CPU and memory its bound pods take, per node.
    used: Vec<HostRequest>,
    arrivals: u64,
    now: Timestamp,
}

impl<'a> Replay<'a> {
    fn new(p: &'a Prepared, policy: Option<Policy>) -> Result<Self, ReplayError> {
        let now = Timestamp::UNIX_EPOCH;
        let c = &p.cluster;
        let names: Vec<String> = (0..c.len()).map(|i| c.spec(i).name.clone()).collect();
        let allocatable: Vec<HostRequest> = (0..c.len())
            .map(|i| HostRequest {
                cpu_milli: c.spec(i).cpu_milli,
                memory_mib: c.spec(i).memory_mib,
            })
            .collect();
        let states = (0..c.len())
            .map(|i| {
                let spec = c.spec(i);
                let model = spec.gpu_model.clone().unwrap_or_default();
                let gpus = (0..spec.gpu_count)
                    .map(|g| {
                        let uuid = format!("{}-gpu{g}", spec.name);
                        let memory = u64::from(MILLI) * MIB_PER_MILLI;
                        GpuRecord::new(&uuid, &model, memory).with_slots(SLOTS)
                    })
                    .collect();
                NodeState {
                    name: spec.name.clone(),
                    gpus: Ok(gpus),
                    heartbeat: Ok(now),
                    allocatable: Some(allocatable[i]),
                }
            })
            .collect();
        let pods = p
            .demands
            .iter()
            .enumerate()
            .map(|(i, d)| pod_of(i, d, c.models(), policy))
            .collect::<Result<Vec<_>, _>>()?;
        let books = Books::new(BooksConfig {
            workload: WorkloadSource::Fixed,
            ..BooksConfig::default()
        });
        books.set_workload(&pods);
        books.sync(states, Vec::new(), &BTreeMap::new(), now);
        Ok(Replay {
            p,
            books,
            pods,
            used: vec![HostRequest::default(); names.len()],
            names,
            allocatable,
            arrivals: 0,
            now,
        })
    }
}

impl Placer for Replay<'_> {
    fn place(&mut self, pod: usize) -> bool {
        // Each arrival is its own pod (the list is drawn from with replacement).
        self.arrivals += 1;
        let mut arrival = self.pods[pod].clone();
        let uid = format!("arrival-{}", self.arrivals);
        arrival.metadata.name = Some(uid.clone());
        arrival.metadata.uid = Some(uid);
        let d = &self.p.demands[pod];
        let ask = HostRequest {
            cpu_milli: d.cpu_milli,
            memory_mib: d.memory_mib,
        };
        // The scheduler's own filter: CPU and memory.
        let candidates: Vec<String> = (0..self.names.len())
            .filter(|&i| {
                let left = self.allocatable[i].minus(self.used[i]);
                left.cpu_milli >= ask.cpu_milli && left.memory_mib >= ask.memory_mib
            })
            .map(|i| self.names[i].clone())
            .collect();
        let passed = self.books.filter(&arrival, &candidates, self.now).fits;
        if passed.is_empty() {
            return false;
        }
        let scores = self.books.prioritize(&arrival, &passed, self.now);
        let mut best: Option<(&str, u8)> = None;
        for (name, score) in &scores {
            if best.is_none_or(|(_, s)| *score > s) {
                best = Some((name, *score));
            }
        }
        let Some((node, _)) = best else {
            return false;
        };
        if self.books.reserve(&arrival, node, self.now).is_err() {
            return false;
        }
        if let Some(i) = self.names.iter().position(|n| n == node) {
            self.used[i] = self.used[i].plus(ask);
        }
        true
    }

    /// From the books: the memory booked on every GPU, in milli.
    fn allocated_milli(&mut self) -> u64 {
        self.names
            .iter()
            .filter_map(|n| self.books.node_books(n))
            .flat_map(|b| {
                b.gpus()
                    .map(|(_, used)| used.memory_mib / MIB_PER_MILLI)
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// From the books: each GPU's free part as the engine counts it, and the CPU the
    /// books count as taken.
    fn frag_milli(&mut self) -> f64 {
        let c = &self.p.cluster;
        let mut total = 0.0;
        for (i, name) in self.names.iter().enumerate() {
            let (Some(books), Some(used)) =
                (self.books.node_books(name), self.books.host_used(name))
            else {
                continue;
            };
            let gpus: Vec<_> = books.gpus().map(|(g, u)| gpu_free(g, u)).collect();
            let cpu_left = self.allocatable[i].minus(used).cpu_milli;
            let model = c.class(c.class_id(i)).model;
            total += frag_milli(model, cpu_left, &gpus, &self.p.workload);
        }
        total
    }
}

/// Pod `index` of the list as the extender receives it.
fn pod_of(
    index: usize,
    d: &Demand,
    models: &[String],
    policy: Option<Policy>,
) -> Result<Pod, ReplayError> {
    let mut limits = serde_json::Map::new();
    if d.gpu_count > 0 {
        limits.insert("nvidia.com/gpu".into(), json!(d.gpu_count.to_string()));
        if d.gpu_milli < MILLI {
            let mib = u64::from(d.gpu_milli) * MIB_PER_MILLI;
            limits.insert("nvidia.com/gpumem".into(), json!(mib.to_string()));
        }
    }
    let mut annotations = serde_json::Map::new();
    if let (Some(mask), true) = (d.models, d.gpu_count > 0) {
        let allowed: Vec<String> = models
            .iter()
            .enumerate()
            .filter(|(i, _)| (mask >> i) & 1 == 1)
            .map(|(_, m)| m.clone())
            .collect();
        // use-gputype matches substrings: exact only if no allowed name is part of
        // another model's name.
        let exact = !allowed.is_empty()
            && allowed.iter().all(|a| {
                models
                    .iter()
                    .filter(|m| m.to_uppercase().contains(&a.to_uppercase()))
                    .all(|m| allowed.contains(m))
            });
        if !exact {
            return Err(ReplayError::Models {
                pod: index,
                models: allowed,
            });
        }
        annotations.insert(USE_GPUTYPE.into(), json!(allowed.join(",")));
    }
    if let Some(policy) = policy {
        annotations.insert(GPU_POLICY.into(), json!(policy.to_string()));
        annotations.insert(NODE_POLICY.into(), json!(policy.to_string()));
    }
    let pod = json!({
        "metadata": {"name": format!("pod-{index}"), "namespace": "replay",
                     "uid": format!("pod-{index}"), "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {
            "requests": {"cpu": format!("{}m", d.cpu_milli),
                         "memory": format!("{}Mi", d.memory_mib)},
            "limits": limits}}]}
    });
    serde_json::from_value(pod).map_err(|e| ReplayError::Pod {
        pod: index,
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{NodeSpec, Request, TieBreak};
    use crate::sim::protocol::run_one;
    use crate::sim::trace::TracePod;

    fn prepared(nodes: Vec<NodeSpec>, reqs: &[Request]) -> Prepared {
        let pods: Vec<TracePod> = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| TracePod {
                name: format!("p{i}"),
                request: r.clone(),
            })
            .collect();
        Prepared::new(nodes, &pods, 1.3, 0.95, TieBreak::First).expect("prepared")
    }

    #[test]
    fn a_small_mixed_cluster_replays_as_the_simulator_runs_it() {
        let nodes: Vec<NodeSpec> = (0..6)
            .map(|i| {
                let model = if i % 3 == 0 { "T4" } else { "V100" };
                let cpu = 16_000 + 8_000 * i as u32;
                NodeSpec::new(&format!("n{i}"), cpu, 1 << 16, 2 + i as u8 % 3, model)
            })
            .collect();
        let reqs = [
            Request::shared(2000, 4096, 300),
            Request::shared(4000, 4096, 470),
            Request::shared(1000, 1024, 650).on_models(&["V100"]),
            Request::whole(8000, 8192, 1),
            Request::whole(12_000, 8192, 2),
            Request::cpu(6000, 2048),
        ];
        let p = prepared(nodes, &reqs);
        for (policy, kind) in [
            (None, PolicyKind::Tessera),
            (Some(Policy::Binpack), PolicyKind::Binpack),
            (Some(Policy::Spread), PolicyKind::Spread),
        ] {
            for seed in [1, 2] {
                let sim = run_one(&p, kind, seed);
                let live = run(&p, policy, seed).expect("replays");
                assert_eq!(live.curve, sim.curve, "{kind} seed {seed}");
                assert_eq!(
                    (live.pods_arrived, live.pods_failed),
                    (sim.pods_arrived, sim.pods_failed)
                );
                assert!(sim.pods_failed > 0, "the cluster fills up: {kind}");
            }
        }
    }

    #[test]
    fn models_use_gputype_cannot_ask_for_exactly_are_refused() {
        let nodes = vec![
            NodeSpec::new("a", 8000, 1 << 16, 1, "A10"),
            NodeSpec::new("b", 8000, 1 << 16, 1, "A100"),
        ];
        let p = prepared(nodes, &[Request::shared(100, 1, 500).on_models(&["A10"])]);
        let err = run(&p, None, 1).expect_err("A10 is part of A100");
        assert!(
            err.to_string().contains("cannot be asked for exactly"),
            "{err}"
        );
    }
}
