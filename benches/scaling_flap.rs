//! Inference autoscaling beside training on one cohort, on an oscillating, jittery load,
//! replayed through `tessera plan` (the autoscaling engine and the quota engine together,
//! in simulated time), with Tessera's coupling and without it (KEDA + Kueue behaviour).
//!
//! The fleet: 16 GPUs in a cohort, inference nominal 8, training nominal 8. Inference is
//! one Deployment scaled by an InferenceScaler (threshold 100 requests per replica,
//! 1..8 replicas, 15 s polls, HPA's default behaviour, `preemption.persistSeconds: 120`).
//! Its load: a daily sine between 100 and 700 requests/s, Gaussian-ish noise (sd 25) and
//! short spikes (+250 for 45 s, about four an hour), sampled every 15 s, seeded. Training:
//! a 2-GPU job every 15 minutes, running 3 h, checkpointing every 20 minutes, borrowing
//! whatever inference does not use.
//!
//! Reported per coupling: training preemptions per hour, rework (GPU-hours lost since
//! the victims' last checkpoints), GPU-hours training ran, and inference demand met: per
//! 15 s sample, how long until the replicas that sample's load needs are admitted (or
//! the load falls below it), p99 and p99.9; the shortfalls (runs of samples with fewer
//! replicas admitted than the load needs), how long they lasted, and the share of time
//! under-provisioned.
//!
//! Run: `cargo bench --bench scaling_flap` (`FLAP_HOURS`, default 24; `FLAP_SEED`,
//! default 7; `FLAP_PERSIST` seconds, default 120; `FLAP_URGENT`, `FLAP_HOLD`
//! (`holdFreedSeconds`), `FLAP_CHEAP` (`cheapReworkSeconds`), default the spec's;
//! `FLAP_EPISODES=1` prints each shortfall). Under `cargo test --all-targets`: 2 hours,
//! as a smoke test.

use std::fmt::Write as _;
use tessera::autoscale::Coupling;
use tessera::placement::SplitMix64;
use tessera::quota::scenario::{plan_str, PlanOptions, PlanOutput};
use tessera::quota::EventType;

const STEP_S: u64 = 15;
const THRESHOLD: f64 = 100.0;
const MAX_REPLICAS: u32 = 8;

fn load(hours: u64, seed: u64) -> Vec<(u64, f64)> {
    let mut rng = SplitMix64::new(seed);
    let mut uniform = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let day = 24.0 * 3600.0;
    let mut spike_left = 0u64;
    (0..hours * 3600 / STEP_S)
        .map(|i| {
            let t = i * STEP_S;
            let base = 400.0 - 300.0 * (2.0 * std::f64::consts::PI * t as f64 / day).cos();
            // Sum of uniforms: roughly normal, sd 25.
            let noise = (0..4).map(|_| uniform() - 0.5).sum::<f64>() * 25.0 * 1.73;
            if spike_left == 0 && uniform() < 4.0 * STEP_S as f64 / 3600.0 {
                spike_left = 45 / STEP_S;
            }
            let spike = if spike_left > 0 {
                spike_left -= 1;
                250.0
            } else {
                0.0
            };
            (t, (base + noise + spike).max(0.0))
        })
        .collect()
}

fn scenario(hours: u64, series: &[(u64, f64)], preemption: &str) -> String {
    let mut y = String::from(
        "kind: ResourceFlavor\nmetadata: {name: h100}\n---\n\
kind: ClusterQueue\nmetadata: {name: inference}\nspec:\n  cohortName: fleet\n  namespaceSelector: {}\n  preemption: {reclaimWithinCohort: Any}\n  resourceGroups: [{coveredResources: [nvidia.com/gpu], flavors: [{name: h100, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}]}]\n---\n\
kind: ClusterQueue\nmetadata: {name: training}\nspec:\n  cohortName: fleet\n  namespaceSelector: {}\n  resourceGroups: [{coveredResources: [nvidia.com/gpu], flavors: [{name: h100, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}]}]\n---\n\
kind: LocalQueue\nmetadata: {name: serve, namespace: web}\nspec: {clusterQueue: inference}\n---\n\
kind: LocalQueue\nmetadata: {name: train, namespace: ml}\nspec: {clusterQueue: training}\n---\n\
kind: MetricSeries\nmetadata: {name: load}\nspec:\n  query: sum(rate(requests_total[1m]))\n  samples:\n",
    );
    for (t, v) in series {
        let _ = writeln!(y, "  - {{at: {t}s, value: {v:.1}}}");
    }
    y.push_str(
        "---\nkind: Deployment\nmetadata: {name: chat, namespace: web, labels: {tessera.io/queue-name: serve}}\n\
spec: {replicas: 1, template: {spec: {containers: [{resources: {requests: {nvidia.com/gpu: 1}}}]}}}\n---\n\
kind: InferenceScaler\nmetadata: {name: chat, namespace: web}\nspec:\n  scaleTargetRef: {name: chat}\n  pollingInterval: 15\n  minReplicaCount: 1\n  maxReplicaCount: 8\n  preemption: ",
    );
    y.push_str(preemption);
    y.push_str(
        "\n  triggers: [{type: prometheus, metadata: {serverAddress: 'http://prometheus:9090', query: 'sum(rate(requests_total[1m]))', threshold: '100'}}]\n",
    );
    for j in 0..hours * 4 {
        let _ = write!(
            y,
            "---\nkind: Job\nmetadata:\n  name: train-{j}\n  namespace: ml\n  labels: {{tessera.io/queue-name: train}}\n  annotations: {{tessera.io/runtime: 3h, tessera.io/checkpoint-interval: 20m}}\n  creationTimestamp: {}s\nspec: {{parallelism: 2, template: {{spec: {{containers: [{{resources: {{requests: {{nvidia.com/gpu: 1}}}}}}]}}}}}}\n",
            j * 900
        );
    }
    y
}

struct Outcome {
    preemptions: usize,
    rework_gpu_h: f64,
    /// GPU-hours training held (lost work included).
    training_gpu_h: f64,
    /// Per shortfall: from its first sample to the sample it was resolved at.
    delays: Vec<f64>,
    /// Per sample: how long until that sample's demand was met.
    waits: Vec<f64>,
    under_share: f64,
}

/// Inference replicas admitted over time, from the plan's events.
fn admitted_over_time(out: &PlanOutput) -> Vec<(f64, i64)> {
    // A replica released while it waited finishes without having been admitted.
    let mut admitted = std::collections::BTreeSet::new();
    let mut steps = Vec::new();
    for e in out
        .events
        .iter()
        .filter(|e| e.workload.starts_with("web/chat-"))
    {
        match e.kind {
            EventType::Admitted => admitted.insert(e.workload.as_str()),
            EventType::Finished | EventType::Preempted | EventType::Evicted => {
                admitted.remove(e.workload.as_str())
            }
            _ => continue,
        };
        steps.push((e.time, admitted.len() as i64));
    }
    steps
}

fn outcome(out: &PlanOutput, series: &[(u64, f64)]) -> Outcome {
    let training: Vec<_> = out
        .events
        .iter()
        .filter(|e| e.kind == EventType::Preempted && e.workload.starts_with("ml/"))
        .collect();
    let rework_gpu_h = training
        .iter()
        .map(|e| e.expected_rework.unwrap_or(0.0) * 2.0 / 3600.0)
        .sum();
    // Training GPU-hours run: each job holds 2 GPUs from admission to its end.
    let mut running: std::collections::HashMap<&str, f64> = Default::default();
    let mut training_gpu_h = 0.0;
    for e in out.events.iter().filter(|e| e.workload.starts_with("ml/")) {
        match e.kind {
            EventType::Admitted => {
                running.insert(e.workload.as_str(), e.time);
            }
            EventType::Finished | EventType::Preempted | EventType::Evicted => {
                if let Some(from) = running.remove(e.workload.as_str()) {
                    training_gpu_h += (e.time - from) * 2.0 / 3600.0;
                }
            }
            _ => {}
        }
    }
    let end = series.last().map_or(0.0, |(t, _)| *t as f64);
    training_gpu_h += running
        .values()
        .map(|from| (end - from).max(0.0) * 2.0 / 3600.0)
        .sum::<f64>();
    let admitted = admitted_over_time(out);
    // Replicas admitted at each sample (events at the sample's instant count).
    let mut have = Vec::with_capacity(series.len());
    let (mut k, mut n) = (0, 0);
    for &(t, _) in series {
        while k < admitted.len() && admitted[k].0 <= t as f64 {
            n = admitted[k].1;
            k += 1;
        }
        have.push(n);
    }
    // Short of replicas: more load per replica than the threshold and the HPA's 10 %
    // tolerance allow.
    let need: Vec<i64> = series
        .iter()
        .map(|&(_, v)| ((v / (THRESHOLD * 1.1)).ceil() as u32).clamp(1, MAX_REPLICAS) as i64)
        .collect();
    let (mut delays, mut under) = (Vec::new(), 0usize);
    let mut since: Option<usize> = None;
    for i in 0..series.len() {
        if have[i] < need[i] {
            under += 1;
            since.get_or_insert(i);
        } else if let Some(s) = since.take() {
            if std::env::var("FLAP_EPISODES").is_ok() {
                eprintln!(
                    "episode {} .. {}: need {} have {}",
                    series[s].0, series[i].0, need[s], have[s]
                );
            }
            delays.push((series[i].0 - series[s].0) as f64);
        }
    }
    // Each sample's demand: how long until it was met (or the load fell below it).
    let mut waits: Vec<f64> = (0..series.len())
        .map(|i| {
            (i..series.len())
                .find(|&j| have[j] >= need[i].min(need[j]))
                .map_or(f64::INFINITY, |j| (series[j].0 - series[i].0) as f64)
        })
        .collect();
    delays.sort_by(f64::total_cmp);
    waits.sort_by(f64::total_cmp);
    Outcome {
        preemptions: training.len(),
        rework_gpu_h,
        training_gpu_h,
        delays,
        waits,
        under_share: under as f64 / series.len() as f64,
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let hours = if full { env("FLAP_HOURS", 24) } else { 2 };
    let seed = env("FLAP_SEED", 7);
    let series = load(hours, seed);
    let persist = env("FLAP_PERSIST", 120);
    let mut preemption = format!("{{persistSeconds: {persist}");
    if let Ok(urgent) = std::env::var("FLAP_URGENT") {
        let _ = write!(preemption, ", urgentRatio: {urgent}");
    }
    if let Ok(hold) = std::env::var("FLAP_HOLD") {
        let _ = write!(preemption, ", holdFreedSeconds: {hold}");
    }
    if let Ok(cheap) = std::env::var("FLAP_CHEAP") {
        let _ = write!(preemption, ", cheapReworkSeconds: {cheap}");
    }
    preemption.push('}');
    let text = scenario(hours, &series, &preemption);
    if let Ok(path) = std::env::var("FLAP_DUMP") {
        std::fs::write(path, &text).expect("FLAP_DUMP is writable");
    }
    let mut rows = Vec::new();
    for (name, coupling) in [
        ("KEDA + Kueue (coupling off)", Coupling::Off),
        ("Tessera (coupled)", Coupling::Quota),
    ] {
        let started = std::time::Instant::now();
        let opts = PlanOptions {
            until: Some(hours * 3_600_000),
            coupling,
        };
        let out = plan_str(&text, &opts).expect("the scenario plans");
        let o = outcome(&out, &series);
        println!(
            "{name:<28} preemptions/h {:>5.2}  rework {:>6.2} GPU-h  training ran {:>5.1} GPU-h  demand met in p99 {:>3.0} s p99.9 {:>3.0} s  shortfalls {:>3} resolved p50 {:>3.0} s max {:>3.0} s  under-provisioned {:>4.1} %  ({:.1} s)",
            o.preemptions as f64 / hours as f64,
            o.rework_gpu_h,
            o.training_gpu_h,
            pct(&o.waits, 0.99),
            pct(&o.waits, 0.999),
            o.delays.len(),
            pct(&o.delays, 0.5),
            pct(&o.delays, 1.0),
            o.under_share * 100.0,
            started.elapsed().as_secs_f64()
        );
        rows.push(o);
    }
    let (off, on) = (&rows[0], &rows[1]);
    println!(
        "coupled / off: preemptions {:.2}, rework {:.2} ({hours} h, seed {seed})",
        on.preemptions as f64 / off.preemptions.max(1) as f64,
        on.rework_gpu_h / off.rework_gpu_h.max(f64::MIN_POSITIVE)
    );
}
