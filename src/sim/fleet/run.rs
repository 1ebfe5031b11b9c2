//! One fleet over simulated time: the quota engine, the placement engine and one
//! autoscaling engine per inference service, driven by the demand of the traces. This
//! module only feeds events in and carries decisions out; every decision (admission,
//! borrowing, reclaim, victims, minimum runtime, replicas, node and GPU) is the engines'.
//!
//! ```text
//! next instant = min(scaler poll, training arrival, demand change, engine timer, sample)
//!   engine.advance_to(t)            finishes, grace ends, wake-ups ─┐
//!   demand changes                   (trackers: demand vs serving)  │
//!   arrivals ─► engine.submit ─► engine.schedule                    ├─► engine events
//!   polls ─► Scaler::step(target, serving = placed replicas, demand) │     Admitted ─► Policy::place ─► Cluster::apply
//!          ─► Replicas::set ─► engine.schedule ──────────────────────┘     Preempted/Finished ─► Cluster::release
//! ```
//!
//! A workload the quota admits but no node can take (fragmentation) holds its quota
//! and waits for placement, retried whenever GPUs are released; a replica is serving
//! only once placed.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Instant;

use serde::Serialize;

use super::config::{FleetKind, Knobs};
use super::demand::{Job, Service};
use super::nodes::{self, MigGroups};
use crate::autoscale::engine::replicas_for;
use crate::autoscale::{Coupling, Observation, Reading, Scaler, ScalerSpec, Settings};
use crate::placement::{
    Cluster, Demand, Placement, Policy, PolicyContext, Request, SplitMix64, TieBreak, Workload,
};
use crate::quota::api::ResourceFlavor;
use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
use crate::quota::model::PodSetInfo;
use crate::quota::{
    Coupled, Engine, EngineConfig, EventType, Quantity, Replicas, Time, WorkloadInfo,
};

const GPU: &str = "nvidia.com/gpu";
/// The `Finished` reason of a job whose work ran out.
const SUCCEEDED: &str = "Succeeded";
const SAMPLE_MS: Time = 60_000;
const INFERENCE_PRIORITY: i32 = 1000;
/// Points of the over-time series kept for the chart.
const SERIES_POINTS: u64 = 480;

/// What went wrong inside a run (an engine refusing what the driver built).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("quota engine: {0}")]
    Quota(#[from] crate::quota::Error),
    #[error("placement engine: {0}")]
    Placement(#[from] crate::placement::Error),
    #[error("scaler spec: {0}")]
    Scaler(String),
    #[error("{0}")]
    Sizing(String),
}

/// How the GPUs are split, the same for the three fleets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sizing {
    /// Replicas the scalers ask for at the inference peak (GPUs).
    pub inference_peak_gpus: u32,
    /// Mean GPUs the scalers ask for over the run.
    pub inference_mean_gpus: f64,
    /// The dedicated fleet's inference pool: the peak, in whole nodes.
    pub inference_pool_gpus: u32,
    /// Inference's nominal quota in the shared fleets.
    pub inference_quota_gpus: u32,
    /// Training work offered (mean GPUs at the tasks' own sizes).
    pub training_offered_gpus: f64,
}

/// The sizing of a run: the inference peak from the demand curves and the scalers'
/// threshold (what the replicas will be), the rest from the knobs.
pub fn sizing(services: &[Service], knobs: &Knobs) -> Result<Sizing, RunError> {
    let horizon = knobs.horizon();
    let want = |n: u32, gpus: u8| -> u64 {
        (f64::from(n) / knobs.replica_target).ceil() as u64 * u64::from(gpus)
    };
    let mut changes: Vec<(Time, usize, u32)> = services
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            s.steps
                .iter()
                .take_while(|(t, _)| *t <= horizon)
                .map(move |&(t, n)| (t, i, n))
        })
        .collect();
    changes.sort_unstable();
    let mut now: Vec<u64> = vec![0; services.len()];
    let (mut total, mut peak, mut area, mut last) = (0u64, 0u64, 0.0f64, 0);
    for (t, i, n) in changes {
        area += total as f64 * (t - last) as f64;
        last = t;
        total = total - now[i] + want(n, services[i].gpus);
        now[i] = want(n, services[i].gpus);
        peak = peak.max(total);
    }
    area += total as f64 * horizon.saturating_sub(last) as f64;
    let mean = area / horizon.max(1) as f64;
    let per_node = u64::from(knobs.gpus_per_node);
    let pool = peak.div_ceil(per_node) * per_node;
    if pool >= u64::from(knobs.gpus) {
        return Err(RunError::Sizing(format!(
            "--gpus {}: the inference peak needs {pool} GPUs ({peak} replicas); give the fleet more",
            knobs.gpus
        )));
    }
    let quota = match knobs.inference_share {
        Some(s) => (f64::from(knobs.gpus) * s).round() as u32,
        None => pool as u32,
    };
    let outside_mig = knobs.gpus - knobs.mig_gpus();
    if knobs.mig_nodes > 0 && quota >= outside_mig {
        return Err(RunError::Sizing(format!(
            "--mig-nodes {}: leaves {outside_mig} GPUs outside MIG, and inference's quota needs {quota} of them (replicas take whole GPUs)",
            knobs.mig_nodes
        )));
    }
    Ok(Sizing {
        inference_peak_gpus: peak as u32,
        inference_mean_gpus: mean,
        inference_pool_gpus: pool as u32,
        inference_quota_gpus: quota,
        training_offered_gpus: knobs.training_load * (f64::from(knobs.gpus) - mean).max(0.0),
    })
}

/// A point of the over-time series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeriesPoint {
    pub hour: f64,
    pub allocated_pct: f64,
    pub used_pct: f64,
    /// Serving inference replicas minus demand, in GPUs (negative: short).
    pub inference_headroom_gpus: f64,
}

/// Inference: demand met.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InferenceStats {
    /// Demand units (one instance of the trace) that waited for a ready replica.
    pub waits: usize,
    /// `None` when no unit waited.
    pub ready_p50_s: Option<f64>,
    pub ready_p99_s: Option<f64>,
    /// Only the units whose wait began while inference was within its nominal quota.
    pub ready_p99_within_quota_s: Option<f64>,
    /// Units still waiting at the end.
    pub unresolved: usize,
    /// Share of service-time with fewer replicas serving than demand.
    pub under_provisioned_pct: f64,
    pub mean_headroom_gpus: f64,
}

/// Training and batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingStats {
    pub jobs: usize,
    pub started: usize,
    pub completed: usize,
    /// GPU-hours of progress kept (run time minus what preemptions threw away).
    pub useful_gpu_hours: f64,
    pub queue_p50_min: f64,
    pub queue_p95_min: f64,
    pub queue_mean_min: f64,
    /// Jobs never started by the end.
    pub never_started: usize,
    pub preemptions: usize,
    /// GPU-hours lost since the victims' last checkpoints.
    pub rework_gpu_hours: f64,
    pub rework_gpu_min_per_preemption: f64,
}

/// Tessera's MIG nodes (`--mig-nodes`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigStats {
    pub nodes: u32,
    pub gpus: u32,
    /// Instances per profile in the fleet.
    pub instances: Vec<(String, u32)>,
    /// Time-averaged after the warm-up, as a share of the MIG GPUs: compute slices held
    /// by placed instances, and what their tasks use of them.
    pub allocated_pct: f64,
    pub used_pct: f64,
    /// Jobs that ask for a MIG instance, and those of them started.
    pub jobs: usize,
    pub started: usize,
}

/// Time spent in each engine, per decision.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Costs {
    pub scaler_steps: u64,
    pub scaler_step_ns_mean: f64,
    /// Quota engine calls (submit, schedule, advance_to, replica changes).
    pub quota_calls: u64,
    pub quota_call_us_mean: f64,
    pub placements: u64,
    pub placement_us_mean: f64,
    #[serde(skip)]
    scaler_ns: u128,
    #[serde(skip)]
    quota_ns: u128,
    #[serde(skip)]
    place_ns: u128,
}

/// One fleet's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetResult {
    pub fleet: FleetKind,
    pub label: &'static str,
    pub gpus: u32,
    /// Time-averaged after the warm-up.
    pub allocated_pct: f64,
    pub used_pct: f64,
    /// Free GPU capacity stranded on partly used GPUs.
    pub fragmented_pct: f64,
    /// GPU capacity admitted by quota that no node could take yet.
    pub admitted_unplaced_pct: f64,
    pub inference: InferenceStats,
    pub training: TrainingStats,
    /// Tessera's MIG nodes, when the run has some.
    pub mig: Option<MigStats>,
    pub costs: Costs,
    pub series: Vec<SeriesPoint>,
    pub wall_s: f64,
}

enum Owner {
    Job(usize),
    Replica(usize),
}

struct Pod {
    owner: Owner,
    cluster: usize,
    demand: Demand,
    /// GPU capacity it holds once placed (milli): the demand's, or a MIG instance's
    /// compute slices.
    held_milli: u64,
    /// What the task really uses (GPU-milli).
    used_milli: u64,
    placed: Option<(Placement, Time)>,
    seq: u64,
}

#[derive(Default)]
struct Tracker {
    demand: u32,
    serving: u32,
    /// Start of each unmet unit, and whether inference was within quota then.
    unmet: VecDeque<(Time, bool)>,
    under_since: Option<Time>,
}

#[derive(Default, Clone, Copy)]
struct JobAcc {
    first_placed: Option<Time>,
    /// Work left (ms at the task's own speed).
    remaining: Time,
    /// Bumped at each end of a run, so that a stale completion is ignored.
    gen: u64,
}

struct Sim<'a> {
    kind: FleetKind,
    knobs: &'a Knobs,
    sizing: Sizing,
    services: &'a [Service],
    jobs: &'a [Job],
    engine: Engine,
    replicas: Replicas,
    bases: Vec<WorkloadInfo>,
    clusters: Vec<Cluster>,
    policies: Vec<Box<dyn Policy>>,
    /// Tessera's MIG nodes: group `g` is cluster `mig_base + g`.
    mig: MigGroups,
    mig_base: usize,
    /// The MIG group each job asks for (`None`: a vGPU share or whole GPUs).
    job_mig: Vec<Option<usize>>,
    /// The fleet's model names, `--gpu-models` order (a job's model bits index it).
    models: Vec<String>,
    mig_held_milli: u64,
    mig_used_milli: u64,
    rng: SplitMix64,
    pods: HashMap<String, Pod>,
    unplaced: BTreeMap<u64, String>,
    /// GPUs were released since the waiting pods were last tried.
    released: bool,
    /// Pods were admitted since.
    fresh: bool,
    seq: u64,
    targets: Vec<u32>,
    trackers: Vec<Tracker>,
    job_acc: Vec<JobAcc>,
    /// `(when, job, gen)`: a placed job's work runs out (the job exits; the driver
    /// reports it to the quota engine as a controller would).
    completions: BinaryHeap<Reverse<(Time, usize, u64)>>,
    waits: Vec<(f64, bool)>,
    under_ms: u128,
    useful_milli_ms: f64,
    rework_milli_ms: f64,
    preemptions: usize,
    completed: usize,
    train_used_milli: u64,
    costs: Costs,
}

fn timed<T>(acc: &mut u128, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    *acc += t0.elapsed().as_nanos();
    out
}

fn scaler_settings(knobs: &Knobs, name: &str) -> Result<Settings, RunError> {
    let spec: ScalerSpec = serde_json::from_value(serde_json::json!({
        "scaleTargetRef": {"name": name},
        "pollingInterval": knobs.polling_s,
        "minReplicaCount": 0,
        "maxReplicaCount": 100_000,
        "preemption": {"persistSeconds": knobs.persist_s, "holdFreedSeconds": knobs.hold_s},
        "triggers": [{"type": "prometheus", "metadata": {
            "serverAddress": "http://simulated",
            "query": "instances_needed",
            "threshold": knobs.replica_target.to_string(),
        }}],
    }))
    .map_err(|e| RunError::Scaler(e.to_string()))?;
    spec.validate()
        .map_err(|e| RunError::Scaler(format!("{}: {}", e.field, e.reason)))
}

impl<'a> Sim<'a> {
    fn new(
        kind: FleetKind,
        knobs: &'a Knobs,
        sizing: Sizing,
        services: &'a [Service],
        jobs: &'a [Job],
    ) -> Result<Self, RunError> {
        let mut engine = Engine::new(EngineConfig::default());
        let rf: ResourceFlavor = flavor("gpu");
        engine.apply_flavor(&rf, 0)?;
        let mig = if kind == FleetKind::Tessera {
            MigGroups::new(knobs)
        } else {
            MigGroups::default()
        };
        let mig_nodes = if mig.is_empty() { 0 } else { knobs.mig_nodes };
        let train_quota =
            knobs.gpus - mig_nodes * u32::from(knobs.gpus_per_node) - sizing.inference_quota_gpus;
        let (inf_q, train_q) = if kind.shared() {
            (sizing.inference_quota_gpus, train_quota)
        } else {
            (
                sizing.inference_pool_gpus,
                knobs.gpus - sizing.inference_pool_gpus,
            )
        };
        let mut inf = cluster_queue("inference").quota("gpu", GPU, i64::from(inf_q));
        let mut train = cluster_queue("training").quota("gpu", GPU, i64::from(train_q));
        if kind.shared() {
            inf = inf
                .cohort("fleet")
                .preemption("{reclaimWithinCohort: Any, withinClusterQueue: Never}");
            train = train.cohort("fleet");
        }
        // MIG nodes advertise no `nvidia.com/gpu`, only their instances: training's
        // nominal quota of each profile is the fleet's instances of it.
        // (A flavor per profile: Kueue lets a flavor serve one resource group.)
        for g in &mig.groups {
            let name = format!("mig-{}", g.profile);
            engine.apply_flavor(&flavor(&name), 0)?;
            train = train.quota(
                &name,
                &g.resource,
                i64::from(g.instances(knobs.gpus_per_node)),
            );
        }
        if knobs.min_runtime_min > 0.0 {
            let secs = (knobs.min_runtime_min * 60.0).round() as u64;
            train = train.preemption(&format!("{{minimumRuntime: {secs}s}}"));
        }
        engine.apply_cluster_queue(&inf.build(), 0)?;
        engine.apply_cluster_queue(&train.build(), 0)?;
        engine.apply_local_queue(&local_queue("infer", "serve", "inference"), 0)?;
        engine.apply_local_queue(&local_queue("train", "batch", "training"), 0)?;

        let all: Vec<&str> = knobs.node_models().collect();
        let per_node = knobs.gpus_per_node;
        let specs = if kind.shared() {
            let general = all.len() - mig_nodes as usize;
            let mut v = vec![nodes::specs(
                "node",
                all[..general].iter().copied(),
                per_node,
            )];
            v.extend((0..mig.groups.len()).map(|g| mig.specs(g, &all[general..])));
            v
        } else {
            let pool = (sizing.inference_pool_gpus / u32::from(per_node)) as usize;
            vec![
                nodes::specs("infer", all[..pool].iter().copied(), per_node),
                nodes::specs("train", all[pool..].iter().copied(), per_node),
            ]
        };
        let models: Vec<String> = knobs.model_names().into_iter().map(String::from).collect();
        let job_mig: Vec<Option<usize>> = jobs
            .iter()
            .map(|j| mig.profile_for(j.shape.num_gpu, j.shape.gpu_milli, j.shape.models))
            .collect();
        let mig_base = 1;
        let mut clusters = specs
            .into_iter()
            .map(Cluster::new)
            .collect::<Result<Vec<_>, _>>()?;
        // The policy's view of the workload: the shapes this fleet will place.
        let mut policies: Vec<Box<dyn Policy>> = Vec::new();
        for (ci, cluster) in clusters.iter_mut().enumerate() {
            let mut demands = Vec::new();
            let group = (!mig.is_empty() && ci >= mig_base).then(|| ci - mig_base);
            if kind.shared() || ci == 1 {
                for (j, g) in jobs.iter().zip(&job_mig) {
                    if *g == group {
                        demands.push(cluster.demand(&job_request(kind, j, *g, &models))?);
                    }
                }
            }
            if group.is_some() {
                if demands.is_empty() {
                    demands.push(cluster.demand(&Request::whole(0, 0, 1))?);
                }
            } else if kind.shared() || ci == 0 {
                for s in services {
                    let d = cluster.demand(&Request::whole(0, 0, s.gpus))?;
                    demands.extend(std::iter::repeat_n(d, s.peak(knobs.horizon()) as usize));
                }
            }
            let ctx = PolicyContext {
                target: Workload::from_demands(&demands, super::super::protocol::DEFAULT_COVERAGE),
                shapes: Workload::from_demands(&demands, 1.0),
                ties: TieBreak::First,
            };
            policies.push(kind.policy().build(&ctx));
        }
        let bases = services
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut w = WorkloadInfo::new(&format!("infer/s{i}"), "serve")
                    .pod_set("main", 1, &[(GPU, i64::from(s.gpus))])
                    .priority(INFERENCE_PRIORITY);
                w.pods_ready_after = Some(0);
                w
            })
            .collect();
        Ok(Sim {
            kind,
            knobs,
            sizing,
            services,
            jobs,
            engine,
            replicas: Replicas::default(),
            bases,
            clusters,
            policies,
            mig,
            mig_base,
            job_mig,
            models,
            mig_held_milli: 0,
            mig_used_milli: 0,
            rng: SplitMix64::new(knobs.seed),
            pods: HashMap::new(),
            unplaced: BTreeMap::new(),
            released: false,
            fresh: false,
            seq: 0,
            targets: vec![0; services.len()],
            trackers: (0..services.len()).map(|_| Tracker::default()).collect(),
            job_acc: jobs
                .iter()
                .map(|j| JobAcc {
                    remaining: j.shape.duration,
                    ..Default::default()
                })
                .collect(),
            completions: BinaryHeap::new(),
            waits: Vec::new(),
            under_ms: 0,
            useful_milli_ms: 0.0,
            rework_milli_ms: 0.0,
            preemptions: 0,
            completed: 0,
            train_used_milli: 0,
            costs: Costs::default(),
        })
    }

    fn inference_cluster(&self) -> usize {
        0
    }

    fn training_cluster(&self) -> usize {
        if self.kind.shared() {
            0
        } else {
            1
        }
    }

    /// Carries the engine's events to the clusters: placements and releases.
    fn sync(&mut self, now: Time) -> Result<(), RunError> {
        for ev in self.engine.take_events() {
            match ev.kind {
                EventType::Admitted => self.admitted(&ev.workload)?,
                EventType::Preempted => {
                    let rework_ms = ev.expected_rework.unwrap_or(0.0) * 1000.0;
                    self.ended(&ev.workload, now, Some(rework_ms))?;
                }
                EventType::Evicted => self.ended(&ev.workload, now, None)?,
                EventType::Finished => {
                    if ev.reason.as_deref() == Some(SUCCEEDED) {
                        self.completed += 1;
                    }
                    self.ended(&ev.workload, now, None)?;
                }
                _ => {}
            }
        }
        if self.released || self.fresh {
            self.released = false;
            self.fresh = false;
            let waiting: Vec<String> = self.unplaced.values().cloned().collect();
            for key in waiting {
                self.place(&key, now)?;
            }
        }
        Ok(())
    }

    fn admitted(&mut self, key: &str) -> Result<(), RunError> {
        let (owner, cluster, req, used_milli) = if let Some(j) = key
            .strip_prefix("train/j")
            .and_then(|s| s.parse::<usize>().ok())
        {
            let job = &self.jobs[j];
            let mig = self.job_mig[j];
            (
                Owner::Job(j),
                mig.map_or(self.training_cluster(), |g| self.mig_base + g),
                job_request(self.kind, job, mig, &self.models),
                job.shape.milli(),
            )
        } else if let Some(i) = replica_service(key) {
            let g = self.services[i].gpus;
            (
                Owner::Replica(i),
                self.inference_cluster(),
                Request::whole(0, 0, g),
                0,
            )
        } else {
            return Ok(());
        };
        let demand = self.clusters[cluster].demand(&req)?;
        let held_milli = match self.mig_group(cluster) {
            Some(g) => self.mig.groups[g].milli(),
            None => demand.total_milli(),
        };
        self.seq += 1;
        self.pods.insert(
            key.to_string(),
            Pod {
                owner,
                cluster,
                demand,
                held_milli,
                used_milli,
                placed: None,
                seq: self.seq,
            },
        );
        self.unplaced.insert(self.seq, key.to_string());
        self.fresh = true;
        Ok(())
    }

    /// Tries to place an admitted pod; it stays waiting when no node can take it.
    fn place(&mut self, key: &str, now: Time) -> Result<(), RunError> {
        let mig_from = self.mig_from();
        let Some(pod) = self.pods.get_mut(key) else {
            return Ok(());
        };
        let cluster = &mut self.clusters[pod.cluster];
        let policy = &mut self.policies[pod.cluster];
        let rng = &mut self.rng;
        self.costs.placements += 1;
        let p = timed(&mut self.costs.place_ns, || {
            policy.place(cluster, &pod.demand, rng)
        });
        let Some(p) = p else { return Ok(()) };
        cluster.apply(&pod.demand, &p)?;
        pod.placed = Some((p, now));
        self.unplaced.remove(&pod.seq);
        if pod.cluster >= mig_from {
            self.mig_held_milli += pod.held_milli;
            self.mig_used_milli += pod.used_milli;
        }
        match pod.owner {
            Owner::Job(j) => {
                self.train_used_milli += pod.used_milli;
                let acc = &mut self.job_acc[j];
                acc.first_placed.get_or_insert(now);
                self.completions
                    .push(Reverse((now + acc.remaining, j, acc.gen)));
            }
            Owner::Replica(i) => {
                self.trackers[i].serving += 1;
                self.track(i, now);
            }
        }
        Ok(())
    }

    /// A pod's admission ended: preempted (`rework_ms` lost), evicted or finished.
    fn ended(&mut self, key: &str, now: Time, rework_ms: Option<f64>) -> Result<(), RunError> {
        let Some(pod) = self.pods.remove(key) else {
            return Ok(());
        };
        self.unplaced.remove(&pod.seq);
        let Some((p, since)) = pod.placed else {
            return Ok(());
        };
        self.clusters[pod.cluster].release(&pod.demand, &p)?;
        self.released = true;
        if pod.cluster >= self.mig_from() {
            self.mig_held_milli -= pod.held_milli;
            self.mig_used_milli -= pod.used_milli;
        }
        match pod.owner {
            Owner::Job(j) => {
                self.train_used_milli -= pod.used_milli;
                let ran = now.saturating_sub(since) as f64;
                let lost = rework_ms.unwrap_or(0.0).min(ran);
                let acc = &mut self.job_acc[j];
                acc.gen += 1;
                acc.remaining = acc.remaining.saturating_sub((ran - lost) as Time);
                let share = pod.used_milli as f64;
                self.useful_milli_ms += (ran - lost) * share;
                if rework_ms.is_some() {
                    self.preemptions += 1;
                    self.rework_milli_ms += lost * share;
                }
            }
            Owner::Replica(i) => {
                self.trackers[i].serving -= 1;
                self.track(i, now);
            }
        }
        Ok(())
    }

    /// Demand vs serving of service `i` changed at `now`.
    fn track(&mut self, i: usize, now: Time) {
        let warm = self.knobs.warmup();
        let within = self.targets.iter().sum::<u32>() <= self.sizing.inference_quota_gpus;
        let t = &mut self.trackers[i];
        let unmet = t.demand.saturating_sub(t.serving) as usize;
        while t.unmet.len() < unmet {
            t.unmet.push_back((now, within));
        }
        while t.unmet.len() > unmet {
            if let Some((start, within)) = t.unmet.pop_front() {
                if start >= warm {
                    self.waits.push(((now - start) as f64 / 1000.0, within));
                }
            }
        }
        match (unmet > 0, t.under_since) {
            (true, None) => t.under_since = Some(now),
            (false, Some(s)) => {
                self.under_ms += u128::from(now.saturating_sub(s.max(warm)).min(now - s));
                t.under_since = None;
            }
            _ => {}
        }
    }

    fn quota<T>(&mut self, f: impl FnOnce(&mut Engine) -> T) -> T {
        self.costs.quota_calls += 1;
        let engine = &mut self.engine;
        timed(&mut self.costs.quota_ns, || f(engine))
    }

    fn set_replicas(
        &mut self,
        i: usize,
        want: u32,
        now: Time,
        coupled: Coupled,
    ) -> Result<(), RunError> {
        let base = self.bases[i].clone();
        self.targets[i] = want * u32::from(self.services[i].gpus);
        let (engine, replicas) = (&mut self.engine, &mut self.replicas);
        self.costs.quota_calls += 1;
        timed(&mut self.costs.quota_ns, || {
            replicas.set(engine, now, "Deployment", &base, want, coupled)?;
            engine.schedule(now)
        })?;
        self.sync(now)
    }

    fn poll(&mut self, i: usize, scaler: &mut Scaler, now: Time) -> Result<(), RunError> {
        let t = &self.trackers[i];
        let target = self.targets[i] / u32::from(self.services[i].gpus);
        let obs = Observation {
            target,
            serving: t.serving,
            readings: vec![Reading::Value(f64::from(t.demand))],
        };
        self.costs.scaler_steps += 1;
        let d = timed(&mut self.costs.scaler_ns, || scaler.step(&obs, now));
        if d.replicas != target {
            let coupled = Coupled::of(&d, scaler.settings());
            self.set_replicas(i, d.replicas, now, coupled)?;
        }
        Ok(())
    }

    /// The first MIG cluster (`usize::MAX` when the fleet has no MIG nodes).
    fn mig_from(&self) -> usize {
        if self.mig.is_empty() {
            usize::MAX
        } else {
            self.mig_base
        }
    }

    fn mig_group(&self, cluster: usize) -> Option<usize> {
        cluster.checked_sub(self.mig_from())
    }

    /// Clusters of whole GPUs (all but the MIG ones).
    fn gpu_clusters(&self) -> &[Cluster] {
        &self.clusters[..self.mig_from().min(self.clusters.len())]
    }

    fn allocated_milli(&self) -> u64 {
        self.gpu_clusters()
            .iter()
            .map(Cluster::allocated_gpu_milli)
            .sum::<u64>()
            + self.mig_held_milli
    }

    fn fragmented_milli(&self) -> u64 {
        let mut stranded = 0u64;
        if let Some(mig) = self.clusters.get(self.mig_from()..) {
            stranded += self.mig.stranded_milli(mig);
        }
        for c in self.gpu_clusters() {
            for n in 0..c.len() {
                for g in &c.node(n).gpus {
                    if g.milli > 0 && g.milli < 1000 {
                        stranded += u64::from(g.milli);
                    }
                }
            }
        }
        stranded
    }
}

/// What job `j` asks the placement engine for: one instance of its MIG group's
/// cluster, a share of one GPU (Tessera), or whole GPUs; on the models of its
/// `gpu_spec` (`models`: the fleet's model names).
fn job_request(kind: FleetKind, j: &Job, mig: Option<usize>, models: &[String]) -> Request {
    let s = j.shape;
    let r = if mig.is_some() {
        Request::whole(0, 0, 1)
    } else if kind.fractional() && s.num_gpu == 1 && s.gpu_milli < 1000 {
        Request::shared(0, 0, s.gpu_milli)
    } else {
        Request::whole(0, 0, s.num_gpu)
    };
    match s.models {
        Some(mask) => {
            let names: Vec<&str> = models
                .iter()
                .enumerate()
                .filter(|(i, _)| (mask >> i) & 1 == 1)
                .map(|(_, m)| m.as_str())
                .collect();
            r.on_models(&names)
        }
        None => r,
    }
}

/// `infer/s12-3` → 12.
fn replica_service(key: &str) -> Option<usize> {
    let rest = key.strip_prefix("infer/s")?;
    let (svc, _) = rest.split_once('-')?;
    svc.parse().ok()
}

/// Job `i` as the quota engine's workload: charged one instance of its MIG profile's
/// resource, a share of `nvidia.com/gpu` in milli-GPUs (Tessera), or whole GPUs.
fn job_workload(kind: FleetKind, i: usize, j: &Job, mig: Option<&str>) -> WorkloadInfo {
    let s = j.shape;
    let (resource, per_pod) = match mig {
        Some(resource) => (resource, 1000),
        None if kind.fractional() && s.num_gpu == 1 && s.gpu_milli < 1000 => {
            (GPU, i64::from(s.gpu_milli))
        }
        None => (GPU, i64::from(s.num_gpu) * 1000),
    };
    let mut w = WorkloadInfo::new(&format!("train/j{i}"), "batch")
        .created(j.arrival)
        .checkpoint_interval(j.checkpoint);
    w.pod_sets.push(PodSetInfo {
        name: "main".into(),
        count: 1,
        requests: [(resource.to_string(), Quantity(per_pod))]
            .into_iter()
            .collect(),
        ..Default::default()
    });
    w
}

/// The `p` quantile of sorted values, `None` when there are none.
fn quantile(sorted: &[f64], p: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| pct(sorted, p))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs one fleet. `progress(fraction of simulated time)` is called about 100 times.
pub fn run_fleet(
    kind: FleetKind,
    knobs: &Knobs,
    sizing: Sizing,
    services: &[Service],
    jobs: &[Job],
    progress: &dyn Fn(f64),
) -> Result<FleetResult, RunError> {
    let started = Instant::now();
    let mut sim = Sim::new(kind, knobs, sizing, services, jobs)?;
    let horizon = knobs.horizon();
    let warm = knobs.warmup();
    let total_milli = u64::from(knobs.gpus) * 1000;

    // Demand changes of every service, in time order.
    let mut changes: Vec<(Time, usize, u32)> = services
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.steps.iter().map(move |&(t, n)| (t, i, n)))
        .filter(|(t, _, _)| *t <= horizon)
        .collect();
    changes.sort_unstable();
    let mut next_change = 0;

    // Scalers, each starting at the replicas its demand at 0 asks for (the engine's own
    // formula), polls staggered over one interval.
    let mut scalers = Vec::with_capacity(services.len());
    let mut polls = BinaryHeap::new();
    let polling = u64::from(knobs.polling_s) * 1000;
    for (i, s) in services.iter().enumerate() {
        let settings = scaler_settings(knobs, &format!("s{i}"))?;
        let want = settings
            .triggers
            .first()
            .map_or(0, |t| replicas_for(t, f64::from(s.at(0)), 0, 0));
        scalers.push(Scaler::new(settings, kind.coupling(knobs)));
        sim.set_replicas(i, want, 0, Coupled::default())?;
        polls.push(Reverse((polling * i as u64 / services.len() as u64, i)));
    }

    let mut next_job = 0;
    let mut next_sample = warm;
    let plot_every = (horizon / SERIES_POINTS).max(SAMPLE_MS);
    let mut next_plot = 0;
    let (mut samples, mut alloc_sum, mut used_sum, mut frag_sum, mut unplaced_sum, mut head_sum) =
        (0u64, 0.0, 0.0, 0.0, 0.0, 0.0);
    let mut series = Vec::new();
    let mut next_progress = 0;
    let mig_milli = if sim.mig.is_empty() {
        0
    } else {
        u64::from(knobs.mig_gpus()) * 1000
    };
    let (mut mig_alloc_sum, mut mig_used_sum) = (0.0, 0.0);
    loop {
        let timer = sim.engine.next_timer().unwrap_or(Time::MAX);
        let now = [
            polls.peek().map_or(Time::MAX, |Reverse((t, _))| *t),
            jobs.get(next_job).map_or(Time::MAX, |j| j.arrival),
            sim.completions
                .peek()
                .map_or(Time::MAX, |Reverse((t, _, _))| *t),
            changes.get(next_change).map_or(Time::MAX, |c| c.0),
            timer,
            next_sample.min(next_plot),
        ]
        .into_iter()
        .min()
        .unwrap_or(Time::MAX);
        if now > horizon {
            break;
        }
        if timer <= now {
            sim.quota(|e| e.advance_to(now))?;
            sim.sync(now)?;
        }
        while let Some(&Reverse((t, j, gen))) = sim.completions.peek() {
            if t > now {
                break;
            }
            sim.completions.pop();
            if sim.job_acc[j].gen == gen {
                let key = format!("train/j{j}");
                sim.quota(|e| {
                    e.remove_with_reason(now, &key, SUCCEEDED)?;
                    e.schedule(now)
                })?;
                sim.sync(now)?;
            }
        }
        while let Some(&(t, i, n)) = changes.get(next_change) {
            if t > now {
                break;
            }
            next_change += 1;
            sim.trackers[i].demand = n;
            sim.track(i, now);
        }
        let mut arrived = false;
        while let Some(j) = jobs.get(next_job) {
            if j.arrival > now {
                break;
            }
            let mig = sim.job_mig[next_job].map(|g| sim.mig.groups[g].resource.as_str());
            let w = job_workload(kind, next_job, j, mig);
            sim.quota(|e| e.submit(now, w))?;
            next_job += 1;
            arrived = true;
        }
        if arrived {
            sim.quota(|e| e.schedule(now))?;
            sim.sync(now)?;
        }
        while let Some(&Reverse((t, i))) = polls.peek() {
            if t > now {
                break;
            }
            polls.pop();
            sim.poll(i, &mut scalers[i], now)?;
            polls.push(Reverse((t + polling, i)));
        }
        if now >= next_sample && now >= warm {
            next_sample = now + SAMPLE_MS;
            samples += 1;
            let alloc = sim.allocated_milli() as f64 / total_milli as f64;
            alloc_sum += alloc;
            used_sum += used_fraction(&sim, total_milli);
            let unplaced: u64 = sim
                .unplaced
                .values()
                .filter_map(|k| sim.pods.get(k))
                .map(|p| p.held_milli)
                .sum();
            unplaced_sum += unplaced as f64 / total_milli as f64;
            head_sum += headroom(&sim);
            if mig_milli > 0 {
                mig_alloc_sum += sim.mig_held_milli as f64 / mig_milli as f64;
                mig_used_sum += sim.mig_used_milli as f64 / mig_milli as f64;
            }
        }
        if now >= next_plot {
            next_plot = now + plot_every;
            let f = sim.fragmented_milli() as f64 / total_milli as f64;
            if now >= warm {
                frag_sum += f;
            }
            series.push(SeriesPoint {
                hour: now as f64 / 3_600_000.0,
                allocated_pct: 100.0 * sim.allocated_milli() as f64 / total_milli as f64,
                used_pct: 100.0 * used_fraction(&sim, total_milli),
                inference_headroom_gpus: headroom(&sim),
            });
        }
        let done = (now * 100 / horizon.max(1)).min(100);
        if done >= next_progress {
            next_progress = done + 1;
            progress(done as f64 / 100.0);
        }
    }
    // Close open accounts at the horizon.
    for i in 0..services.len() {
        let t = &mut sim.trackers[i];
        if let Some(s) = t.under_since.take() {
            sim.under_ms += u128::from(horizon.saturating_sub(s.max(warm)));
        }
    }
    let unresolved = sim.trackers.iter().map(|t| t.unmet.len()).sum();
    let keys: Vec<String> = sim.pods.keys().cloned().collect();
    for key in keys {
        if let Some(Pod {
            owner: Owner::Job(_),
            placed: Some((_, since)),
            used_milli,
            ..
        }) = sim.pods.get(&key)
        {
            sim.useful_milli_ms += horizon.saturating_sub(*since) as f64 * *used_milli as f64;
        }
    }
    let frag_points = series
        .iter()
        .filter(|p| p.hour * 3_600_000.0 >= warm as f64)
        .count();
    let mut waits: Vec<f64> = sim.waits.iter().map(|w| w.0).collect();
    waits.sort_by(f64::total_cmp);
    let mut within: Vec<f64> = sim.waits.iter().filter(|w| w.1).map(|w| w.0).collect();
    within.sort_by(f64::total_cmp);
    let mut queue: Vec<f64> = sim
        .job_acc
        .iter()
        .zip(jobs)
        .filter_map(|(a, j)| a.first_placed.map(|p| (p - j.arrival) as f64 / 60_000.0))
        .collect();
    queue.sort_by(f64::total_cmp);
    let measured = horizon.saturating_sub(warm).max(1) as f64;
    let gpu_h = |milli_ms: f64| milli_ms / 1000.0 / 3_600_000.0;
    let started_jobs = queue.len();
    let costs = Costs {
        scaler_step_ns_mean: sim.costs.scaler_ns as f64 / sim.costs.scaler_steps.max(1) as f64,
        quota_call_us_mean: sim.costs.quota_ns as f64
            / 1000.0
            / sim.costs.quota_calls.max(1) as f64,
        placement_us_mean: sim.costs.place_ns as f64 / 1000.0 / sim.costs.placements.max(1) as f64,
        ..sim.costs.clone()
    };
    let n = samples.max(1) as f64;
    let mig = (!sim.mig.is_empty()).then(|| MigStats {
        nodes: knobs.mig_nodes,
        gpus: knobs.mig_gpus(),
        instances: sim
            .mig
            .groups
            .iter()
            .map(|g| (g.profile.to_string(), g.instances(knobs.gpus_per_node)))
            .collect(),
        allocated_pct: 100.0 * mig_alloc_sum / n,
        used_pct: 100.0 * mig_used_sum / n,
        jobs: sim.job_mig.iter().filter(|g| g.is_some()).count(),
        started: sim
            .job_acc
            .iter()
            .zip(&sim.job_mig)
            .filter(|(a, g)| g.is_some() && a.first_placed.is_some())
            .count(),
    });
    Ok(FleetResult {
        fleet: kind,
        label: match kind.coupling(knobs) {
            Coupling::Off if kind == FleetKind::Tessera => "Tessera, uncoupled",
            _ => kind.label(),
        },
        gpus: knobs.gpus,
        allocated_pct: 100.0 * alloc_sum / n,
        used_pct: 100.0 * used_sum / n,
        fragmented_pct: 100.0 * frag_sum / frag_points.max(1) as f64,
        admitted_unplaced_pct: 100.0 * unplaced_sum / n,
        inference: InferenceStats {
            waits: waits.len(),
            ready_p50_s: quantile(&waits, 0.5),
            ready_p99_s: quantile(&waits, 0.99),
            ready_p99_within_quota_s: quantile(&within, 0.99),
            unresolved,
            under_provisioned_pct: 100.0 * sim.under_ms as f64
                / (measured * services.len().max(1) as f64),
            mean_headroom_gpus: head_sum / n,
        },
        training: TrainingStats {
            jobs: jobs.len(),
            started: started_jobs,
            completed: sim.completed,
            useful_gpu_hours: gpu_h(sim.useful_milli_ms),
            queue_p50_min: pct(&queue, 0.5),
            queue_p95_min: pct(&queue, 0.95),
            queue_mean_min: queue.iter().sum::<f64>() / queue.len().max(1) as f64,
            never_started: jobs.len() - started_jobs,
            preemptions: sim.preemptions,
            rework_gpu_hours: gpu_h(sim.rework_milli_ms),
            rework_gpu_min_per_preemption: gpu_h(sim.rework_milli_ms) * 60.0
                / sim.preemptions.max(1) as f64,
        },
        mig,
        costs,
        series,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Share of the fleet doing useful work: training at the tasks' own sizes, inference
/// replicas up to the demand they serve.
fn used_fraction(sim: &Sim, total_milli: u64) -> f64 {
    let inference: u64 = sim
        .trackers
        .iter()
        .zip(sim.services)
        .map(|(t, s)| u64::from(t.serving.min(t.demand)) * u64::from(s.gpus) * 1000)
        .sum();
    (sim.train_used_milli + inference) as f64 / total_milli as f64
}

fn headroom(sim: &Sim) -> f64 {
    sim.trackers
        .iter()
        .zip(sim.services)
        .map(|(t, s)| (f64::from(t.serving) - f64::from(t.demand)) * f64::from(s.gpus))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(num_gpu: u8, gpu_milli: u16, models: Option<u64>) -> Job {
        Job {
            arrival: 0,
            shape: crate::sim::fleet::demand::TaskShape {
                num_gpu,
                gpu_milli,
                duration: 60_000,
                models,
            },
            checkpoint: 600_000,
        }
    }

    #[test]
    fn jobs_are_charged_and_placed_by_their_kind() {
        let mig = "nvidia.com/mig-2g.20gb";
        let cases = [
            // (fleet, job, MIG resource) → (resource, milli-units), GPU demand
            (
                FleetKind::Tessera,
                job(1, 220, None),
                Some(mig),
                (mig, 1000),
            ),
            (FleetKind::Tessera, job(1, 220, None), None, (GPU, 220)),
            (FleetKind::Shared, job(1, 220, None), None, (GPU, 1000)),
            (FleetKind::Tessera, job(4, 1000, None), None, (GPU, 4000)),
        ];
        for (kind, j, res, (want_res, want_q)) in cases {
            let w = job_workload(kind, 7, &j, res);
            let got: Vec<(&str, i64)> = w.pod_sets[0]
                .requests
                .iter()
                .map(|(k, q)| (k.as_str(), q.0))
                .collect();
            assert_eq!(got, vec![(want_res, want_q)], "{kind:?} {res:?}");
        }
        let models = ["H100-80GB".to_string(), "A100-40GB".to_string()];
        let r = job_request(
            FleetKind::Tessera,
            &job(1, 220, Some(0b10)),
            Some(0),
            &models,
        );
        assert_eq!(r, Request::whole(0, 0, 1).on_models(&["A100-40GB"]));
        let r = job_request(FleetKind::Tessera, &job(1, 220, None), None, &models);
        assert_eq!(r, Request::shared(0, 0, 220));
        let r = job_request(
            FleetKind::Dedicated,
            &job(1, 220, Some(0b11)),
            None,
            &models,
        );
        assert_eq!(
            r,
            Request::whole(0, 0, 1).on_models(&["H100-80GB", "A100-40GB"])
        );
    }

    #[test]
    fn replica_keys_name_their_service() {
        assert_eq!(replica_service("infer/s12-3"), Some(12));
        assert_eq!(replica_service("train/j1"), None);
        assert_eq!(replica_service("infer/s-1"), None);
    }
}
