//! A simulated week of GPU allocations for the chargeback tests and bench: namespaces
//! in queues and teams, on nodes of two GPU models, holding whole GPUs, MIG devices,
//! time-sliced replicas and vGPU slices; long-running pods with container restarts
//! (counter resets) and pods that come and go. From a seed.
//!
//! The node agent's accounting is modelled as it will run: every 10 s tick charges
//! `share × seconds` (and `× busy` for used) through `tessera::chargeback::Ledger`; every
//! `sample_every` seconds the counters are sampled, as Prometheus scrapes them. The truth
//! the report is checked against is kept per sample period, so any window on whole
//! periods has an exact expected value. [`Week::write_openmetrics`] writes the samples
//! for `promtool tsdb create-blocks-from openmetrics`, with `tessera_devices` gauges and
//! the controller's queue series for the dashboards.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use tessera::chargeback::metrics::{write_family_header, write_sample};
use tessera::chargeback::{charge_of, Account, ChargeLabels, Ledger, Slice, ALLOCATED, USED};

/// Agent accounting tick, seconds.
const TICK: i64 = 10;
pub const WEEK: i64 = 7 * 86_400;

pub struct Spec {
    /// Unix seconds, a multiple of `sample_every`.
    pub start: i64,
    pub seed: u64,
    pub namespaces: usize,
    pub nodes: usize,
    /// Scrape interval, seconds (a multiple of 10).
    pub sample_every: i64,
    /// Length of the simulation, seconds ([`WEEK`] for a week).
    pub length: i64,
}

/// One container's hold on one device: its spans of time and its counter samples.
pub struct Hold {
    pub labels: ChargeLabels,
    pub share: f64,
    /// `(at, allocated, used)` counter samples, time-ordered.
    pub samples: Vec<(i64, f64, f64)>,
    /// Truth per sample period `(start + k·P, start + (k+1)·P]`.
    truth: Vec<Account>,
}

pub struct Week {
    pub spec: Spec,
    pub holds: Vec<Hold>,
    /// Counter resets simulated (container restarts and series forgotten and charged again).
    pub resets: usize,
}

/// splitmix64: a small seeded generator (no dependency for a test fixture).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const QUEUES: [&str; 4] = ["research", "prod", "serve", "batch"];
const TEAMS: [&str; 5] = ["vision", "nlp", "speech", "platform", ""];

fn model(node: usize) -> (&'static str, u64) {
    if node.is_multiple_of(2) {
        ("H100-80GB", 81_920)
    } else {
        ("A100-40GB", 40_960)
    }
}

/// The device a namespace's `k`-th pod holds.
fn slice(kind: usize, rng: &mut Rng, gpu_memory_mib: u64) -> Slice {
    match kind % 4 {
        0 => Slice::Whole,
        1 => Slice::Mig {
            compute_slices: [1, 2, 3][rng.range(0, 3) as usize],
            gpu_compute_slices: 7,
        },
        2 => Slice::Timeslice {
            replicas: [2, 4][rng.range(0, 2) as usize],
        },
        _ => Slice::Vgpu {
            memory_mib: gpu_memory_mib / [2, 4, 8][rng.range(0, 3) as usize],
            gpu_memory_mib,
            cores_percent: [10, 30, 60][rng.range(0, 3) as usize],
        },
    }
}

impl Week {
    pub fn simulate(spec: Spec) -> Week {
        assert_eq!(spec.start % spec.sample_every, 0);
        assert_eq!(spec.sample_every % TICK, 0);
        let mut rng = Rng::new(spec.seed);
        let mut holds = Vec::new();
        let mut resets = 0;
        for ns in 0..spec.namespaces {
            for k in 0..2 {
                let node = rng.range(0, spec.nodes as i64) as usize;
                let (model, memory) = model(node);
                let device = slice(ns + k, &mut rng, memory);
                let labels = ChargeLabels {
                    node: format!("node-{node:02}"),
                    gpu: format!("GPU-{node:02}-{}", rng.range(0, 8)),
                    model: model.to_string(),
                    mode: device.mode(),
                    namespace: format!("ns-{ns:03}"),
                    pod: if k == 0 {
                        format!("train-{ns}")
                    } else {
                        format!("serve-{ns}")
                    },
                    container: "main".to_string(),
                    queue: QUEUES[ns % QUEUES.len()].to_string(),
                    team: TEAMS[ns % TEAMS.len()].to_string(),
                };
                let share = device.share().expect("the fixture's devices are valid");
                let spans = if k == 0 {
                    // Long-running: most of the week, starting and ending off the grid.
                    vec![(
                        spec.start + rng.range(1, 7200),
                        spec.start + spec.length - rng.range(1, 7200),
                    )]
                } else {
                    comes_and_goes(&spec, &mut rng)
                };
                let busy_base = 0.2 + 0.7 * rng.unit();
                let (hold, n) = account(&spec, &mut rng, labels, share, busy_base, &spans);
                resets += n;
                holds.push(hold);
            }
        }
        Week {
            spec,
            holds,
            resets,
        }
    }

    pub fn end(&self) -> i64 {
        self.spec.start + self.spec.length
    }

    /// Allocated and used GPU-seconds over `(from, to]` (whole sample periods) per
    /// `(group, model, mode)`, where `group` reads a hold's group label.
    pub fn expected(
        &self,
        from: i64,
        to: i64,
        group: impl Fn(&ChargeLabels) -> String,
    ) -> BTreeMap<(String, String, String), (f64, f64)> {
        let p = self.spec.sample_every;
        assert_eq!((from - self.spec.start) % p, 0);
        assert_eq!((to - self.spec.start) % p, 0);
        let mut sums = BTreeMap::new();
        for hold in &self.holds {
            let first = ((from - self.spec.start) / p).max(0) as usize;
            let last = (((to - self.spec.start) / p).max(0) as usize).min(hold.truth.len());
            if first >= last {
                continue;
            }
            let (mut a, mut u) = (0.0, 0.0);
            for acc in &hold.truth[first..last] {
                a += acc.allocated_seconds;
                u += acc.used_seconds;
            }
            if a == 0.0 {
                continue;
            }
            let key = (
                group(&hold.labels),
                hold.labels.model.clone(),
                hold.labels.mode.as_str().to_string(),
            );
            let entry = sums.entry(key).or_insert((0.0, 0.0));
            entry.0 += a;
            entry.1 += u;
        }
        sums
    }

    /// The counters as OpenMetrics text with timestamps, one series after another, and a
    /// `tessera_devices` gauge per node; ends with `# EOF`.
    pub fn write_openmetrics(&self, out: &mut impl Write) -> std::io::Result<()> {
        self.write_openmetrics_between(out, i64::MIN, i64::MAX)
    }

    /// [`Week::write_openmetrics`] for the samples in `[from, to)` only (a backfill in
    /// pieces, to keep the text files small).
    pub fn write_openmetrics_between(
        &self,
        out: &mut impl Write,
        from: i64,
        to: i64,
    ) -> std::io::Result<()> {
        let mut text = String::new();
        for (name, used) in [(ALLOCATED, false), (USED, true)] {
            write_family_header(&mut text, name);
            for hold in &self.holds {
                for &(at, a, u) in hold.samples.iter().filter(|s| s.0 >= from && s.0 < to) {
                    write_sample(
                        &mut text,
                        name,
                        &hold.labels,
                        if used { u } else { a },
                        Some(at),
                    );
                }
                out.write_all(text.as_bytes())?;
                text.clear();
            }
        }
        text.push_str("# HELP tessera_devices Devices advertised to the kubelet.\n");
        text.push_str("# TYPE tessera_devices gauge\n");
        let p = self.spec.sample_every;
        for node in 0..self.spec.nodes {
            for (resource, count) in [("nvidia.com/gpu", 6), ("nvidia.com/mig-1g.10gb", 7)] {
                let mut at = self.spec.start.max(from);
                while at <= self.end() && at < to {
                    use std::fmt::Write as _;
                    let _ = writeln!(
                        text,
                        "tessera_devices{{node=\"node-{node:02}\",resource=\"{resource}\",health=\"healthy\"}} {count} {at}"
                    );
                    at += p;
                }
                out.write_all(text.as_bytes())?;
                text.clear();
            }
        }
        self.write_queue_gauges(&mut text, from, to);
        out.write_all(text.as_bytes())?;
        out.write_all(b"# EOF\n")
    }

    /// The controller's queue series the dashboards read (Kueue's names with the
    /// `tessera_` prefix), one ClusterQueue per queue of the week: pending `active` the
    /// pods of that queue starting within the next 30 min, `inadmissible` those starting
    /// 30–60 min later; `admitted_workloads_total` the pods started so far.
    fn write_queue_gauges(&self, text: &mut String, from: i64, to: i64) {
        use std::fmt::Write as _;
        let mut starts: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for h in &self.holds {
            if let Some(first) = h.samples.first() {
                starts
                    .entry(h.labels.queue.as_str())
                    .or_default()
                    .push(first.0);
            }
        }
        starts.values_mut().for_each(|v| v.sort_unstable());
        // Starts in (lo, hi].
        let within = |v: &[i64], lo: i64, hi: i64| {
            v.partition_point(|t| *t <= hi) - v.partition_point(|t| *t <= lo)
        };
        let p = self.spec.sample_every;
        let times: Vec<i64> = (0..)
            .map(|k| self.spec.start.max(from) + k * p)
            .take_while(|at| *at <= self.end() && *at < to)
            .collect();
        let gauge = "tessera_pending_workloads";
        let _ = writeln!(
            text,
            "# HELP {gauge} Pending workloads per cluster_queue and status."
        );
        let _ = writeln!(text, "# TYPE {gauge} gauge");
        for (q, v) in &starts {
            for (status, lo, hi) in [("active", 0, 1800), ("inadmissible", 1800, 3600)] {
                for at in &times {
                    let n = within(v, at + lo, at + hi);
                    let _ = writeln!(
                        text,
                        "{gauge}{{cluster_queue=\"{q}\",status=\"{status}\"}} {n} {at}"
                    );
                }
            }
        }
        let counter = "tessera_admitted_workloads";
        let _ = writeln!(
            text,
            "# HELP {counter} Workloads admitted per cluster_queue."
        );
        let _ = writeln!(text, "# TYPE {counter} counter");
        for (q, v) in &starts {
            for at in &times {
                let n = v.partition_point(|t| t <= at);
                let _ = writeln!(text, "{counter}_total{{cluster_queue=\"{q}\"}} {n} {at}");
            }
        }
    }
}

/// Spans of 20 min to 12 h separated by at least 10 min, off the sampling grid.
fn comes_and_goes(spec: &Spec, rng: &mut Rng) -> Vec<(i64, i64)> {
    let mut spans = Vec::new();
    let mut at = spec.start + rng.range(1, 3 * 3600);
    while at < spec.start + spec.length - 3600 {
        let end = (at + rng.range(1200, 12 * 3600)).min(spec.start + spec.length - 1);
        spans.push((at, end));
        at = end + rng.range(600, 8 * 3600);
    }
    spans
}

/// Ticks each span through a one-series ledger, sampling it every period; the counter
/// restarts from 0 at container restarts (right after a scrape) and after a span's series
/// is forgotten (two periods after it ends).
fn account(
    spec: &Spec,
    rng: &mut Rng,
    labels: ChargeLabels,
    share: f64,
    busy_base: f64,
    spans: &[(i64, i64)],
) -> (Hold, usize) {
    let p = spec.sample_every;
    let periods = (spec.length / p + 4) as usize;
    let mut truth = vec![Account::default(); periods];
    let mut samples = Vec::new();
    let mut resets = 0;
    for (i, &(s, e)) in spans.iter().enumerate() {
        let mut ledger = Ledger::new();
        if i > 0 {
            resets += 1;
        }
        // Container restarts in a long span: the counter resets right after a scrape.
        let restarts: Vec<i64> = if e - s > 86_400 {
            (0..2).map(|_| rng.range(s / p + 1, e / p) * p).collect()
        } else {
            vec![]
        };
        let first_sample = (s + p - 1) / p * p;
        let last_sample = (e + p - 1) / p * p + p;
        let mut t = s;
        let mut next_sample = first_sample;
        loop {
            while next_sample <= t && next_sample <= last_sample {
                let acc = ledger.get(&labels).unwrap_or_default();
                samples.push((next_sample, acc.allocated_seconds, acc.used_seconds));
                if restarts.contains(&next_sample) {
                    ledger.forget(&labels);
                    ledger.charge(&labels, share, 0.0, 0.0);
                    resets += 1;
                }
                next_sample += p;
            }
            if next_sample > last_sample {
                break;
            }
            if t >= e {
                t = next_sample;
                continue;
            }
            let tick_end = ((t / TICK + 1) * TICK).min(next_sample).min(e);
            // Busy varies by hour of the week, differently per hold.
            let hour = (t - spec.start) / 3600;
            let busy =
                busy_base * (0.5 + 0.05 * ((hour * 7 + (busy_base * 1000.0) as i64) % 10) as f64);
            let seconds = (tick_end - t) as f64;
            ledger.charge(&labels, share, busy, seconds);
            let add = charge_of(share, busy, seconds);
            let bucket = ((tick_end - 1 - spec.start) / p) as usize;
            truth[bucket].allocated_seconds += add.allocated_seconds;
            truth[bucket].used_seconds += add.used_seconds;
            t = tick_end;
        }
    }
    (
        Hold {
            labels,
            share,
            samples,
            truth,
        },
        resets,
    )
}
