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
//! the victims' last checkpoints), and inference demand met: the delay from the poll at
//! which the load needs more replicas than are admitted to the moment enough are
//! admitted (p50 / p99), and the share of time under-provisioned.
//!
//! Run: `cargo bench --bench scaling_flap` (`FLAP_HOURS`, default 24; `FLAP_SEED`,
//! default 7; `FLAP_PERSIST` seconds, default 120; `FLAP_URGENT`, default the spec's).
//! Under `cargo test --all-targets`: 2 hours, as a smoke test.

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
    delays: Vec<f64>,
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
    let admitted = admitted_over_time(out);
    let at = |t: f64| {
        admitted
            .iter()
            .take_while(|(when, _)| *when <= t)
            .last()
            .map_or(0, |(_, n)| *n)
    };
    // Short of replicas: more load per replica than the threshold and the HPA's 10 %
    // tolerance allow.
    let need = |v: f64| ((v / (THRESHOLD * 1.1)).ceil() as u32).clamp(1, MAX_REPLICAS) as i64;
    let (mut delays, mut under) = (Vec::new(), 0usize);
    let mut since: Option<f64> = None;
    for &(t, v) in series {
        let t = t as f64;
        if at(t) < need(v) {
            under += 1;
            since.get_or_insert(t);
        } else if let Some(s) = since.take() {
            delays.push(t - s);
        }
    }
    delays.sort_by(f64::total_cmp);
    Outcome {
        preemptions: training.len(),
        rework_gpu_h,
        delays,
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
    let preemption = match std::env::var("FLAP_URGENT") {
        Ok(urgent) => format!("{{persistSeconds: {persist}, urgentRatio: {urgent}}}"),
        Err(_) => format!("{{persistSeconds: {persist}}}"),
    };
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
            "{name:<28} preemptions/h {:>5.2}  rework {:>6.2} GPU-h  demand-to-ready p50 {:>4.0} s p99 {:>4.0} s  under-provisioned {:>4.1} %  ({:.1} s)",
            o.preemptions as f64 / hours as f64,
            o.rework_gpu_h,
            pct(&o.delays, 0.5),
            pct(&o.delays, 0.99),
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
