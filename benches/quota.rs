//! Quota engine benchmark: Kueue's scheduler performance shapes driven in simulated time,
//! the indexed engine against the naive full-rescan baseline, side by side.
//!
//! `cargo bench --bench quota` (add `-- --quick` for the small shapes only). Under
//! `cargo test` it only runs a smoke check.
//! Shapes (from Kueue's `test/performance/scheduler/configs`):
//! - baseline: 5 cohorts x 6 ClusterQueues, 500 workloads each (15,000): small (1 unit,
//!   every 100 ms, runs 200 ms, priority 50), medium (5, 500 ms, 500 ms, 100), large
//!   (20, 1200 ms, 1000 ms, 200); nominal 20, borrowingLimit 100, reclaimWithinCohort
//!   Any, withinClusterQueue LowerPriority.
//! - 1,000 queues: 10 cohorts x 100 ClusterQueues, 50 workloads each (50,000) with the
//!   large-scale config's faster cadence (20/50/200 ms, runs 50/100/200 ms).
//! - starvation: one queue, N inadmissible workloads, 2,000 small ones streaming through.

use std::time::Instant;
use tessera::quota::fixtures::{cluster_queue, flavor, local_queue};
use tessera::quota::{Engine, EngineConfig, Requeue, Time, WorkloadInfo};

const RES: &str = "cpu";

struct Class {
    name: &'static str,
    count: usize,
    interval: Time,
    runtime: Time,
    priority: i32,
    request: i64,
}

struct Shape {
    name: &'static str,
    cohorts: usize,
    queues: usize,
    classes: Vec<Class>,
}

fn baseline() -> Shape {
    Shape {
        name: "5 cohorts x 6 CQs, 15,000 workloads",
        cohorts: 5,
        queues: 6,
        classes: vec![
            Class {
                name: "small",
                count: 350,
                interval: 100,
                runtime: 200,
                priority: 50,
                request: 1,
            },
            Class {
                name: "medium",
                count: 100,
                interval: 500,
                runtime: 500,
                priority: 100,
                request: 5,
            },
            Class {
                name: "large",
                count: 50,
                interval: 1200,
                runtime: 1000,
                priority: 200,
                request: 20,
            },
        ],
    }
}

fn thousand() -> Shape {
    Shape {
        name: "10 cohorts x 100 CQs, 50,000 workloads",
        cohorts: 10,
        queues: 100,
        classes: vec![
            Class {
                name: "small",
                count: 35,
                interval: 20,
                runtime: 50,
                priority: 50,
                request: 1,
            },
            Class {
                name: "medium",
                count: 10,
                interval: 50,
                runtime: 100,
                priority: 100,
                request: 5,
            },
            Class {
                name: "large",
                count: 5,
                interval: 200,
                runtime: 200,
                priority: 200,
                request: 20,
            },
        ],
    }
}

struct Result {
    wall: f64,
    admissions: u64,
    evaluations: u64,
    usage_pct: f64,
    tta: Vec<(&'static str, f64)>,
}

fn run(shape: &Shape, requeue: Requeue) -> Result {
    let mut e = Engine::new(EngineConfig {
        record_events: false,
        requeue,
        ..Default::default()
    });
    e.apply_flavor(&flavor("default"), 0).expect("flavor");
    let mut arrivals: Vec<(Time, usize, WorkloadInfo)> = Vec::new();
    let mut nominal_total = 0i64;
    for c in 0..shape.cohorts {
        for q in 0..shape.queues {
            let name = format!("cq-{c}-{q}");
            let cq = cluster_queue(&name)
                .cohort(&format!("cohort-{c}"))
                .quota_with("default", RES, 20, Some(100), None)
                .preemption("reclaimWithinCohort: Any\nwithinClusterQueue: LowerPriority")
                .build();
            nominal_total += 20_000;
            e.apply_cluster_queue(&cq, 0).expect("cq");
            e.apply_local_queue(&local_queue("ns", &name, &name), 0)
                .expect("lq");
            for (ci, class) in shape.classes.iter().enumerate() {
                for i in 0..class.count {
                    let t = i as Time * class.interval;
                    let w = WorkloadInfo::new(&format!("ns/{name}-{}-{i}", class.name), &name)
                        .pod_set("main", 1, &[(RES, class.request)])
                        .priority(class.priority)
                        .created(t)
                        .runtime(class.runtime);
                    arrivals.push((t, ci, w));
                }
            }
        }
    }
    arrivals.sort_by_key(|(t, _, _)| *t);
    let keys: Vec<(Time, usize, String)> =
        arrivals.iter().map(|(t, c, w)| (*t, *c, w.key())).collect();
    let start = Instant::now();
    let mut integral: f64 = 0.0;
    let mut last: Time = 0;
    let step = |e: &mut Engine, to: Time, integral: &mut f64, last: &mut Time| {
        while let Some(t) = e.next_timer() {
            if t > to {
                break;
            }
            *integral += e.usage_total() as f64 * (t - *last) as f64;
            *last = t;
            e.advance_to(t).expect("advance");
        }
        *integral += e.usage_total() as f64 * (to - *last) as f64;
        *last = to;
    };
    let mut i = 0;
    while i < arrivals.len() {
        let t = arrivals[i].0;
        step(&mut e, t, &mut integral, &mut last);
        while i < arrivals.len() && arrivals[i].0 == t {
            let w = arrivals[i].2.clone();
            e.submit(t, w).expect("submit");
            i += 1;
        }
        e.schedule(t).expect("schedule");
    }
    while let Some(t) = e.next_timer() {
        step(&mut e, t, &mut integral, &mut last);
    }
    let wall = start.elapsed().as_secs_f64();
    let end = last.max(1);
    let mut tta = Vec::new();
    for (ci, class) in shape.classes.iter().enumerate() {
        let waits: Vec<f64> = keys
            .iter()
            .filter(|(_, c, _)| *c == ci)
            .filter_map(|(t, _, k)| e.first_admitted_at(k).map(|a| (a - t) as f64 / 1000.0))
            .collect();
        tta.push((
            class.name,
            waits.iter().sum::<f64>() / waits.len().max(1) as f64,
        ));
    }
    Result {
        wall,
        admissions: e.stats.admissions,
        evaluations: e.stats.evaluations,
        usage_pct: 100.0 * integral / (nominal_total as f64 * end as f64),
        tta,
    }
}

fn report(shape: &Shape) {
    println!("\n== {}", shape.name);
    let fast = run(shape, Requeue::Indexed);
    let naive = run(shape, Requeue::FullRescan);
    for (label, r) in [("indexed", &fast), ("full-rescan", &naive)] {
        let tta: Vec<String> = r.tta.iter().map(|(n, s)| format!("{n} {s:.1}s")).collect();
        println!(
            "{label:>12}: {:.3}s wall, {} admissions ({:.0}/s), {} evaluations, usage {:.1}% of nominal, mean time to admission: {}",
            r.wall,
            r.admissions,
            r.admissions as f64 / r.wall,
            r.evaluations,
            r.usage_pct,
            tta.join(", ")
        );
    }
    println!(
        "       ratio: full-rescan / indexed wall time = {:.1}x, evaluations = {:.1}x",
        naive.wall / fast.wall,
        naive.evaluations as f64 / fast.evaluations.max(1) as f64
    );
}

/// One queue with `parked` workloads that never fit and a stream of small ones.
fn starvation(parked: usize, requeue: Requeue) -> (f64, u64) {
    let mut e = Engine::new(EngineConfig {
        record_events: false,
        requeue,
        ..Default::default()
    });
    e.apply_flavor(&flavor("default"), 0).expect("flavor");
    let cq = cluster_queue("q").quota("default", RES, 100).build();
    e.apply_cluster_queue(&cq, 0).expect("cq");
    e.apply_local_queue(&local_queue("ns", "q", "q"), 0)
        .expect("lq");
    let base = WorkloadInfo::new("ns/base", "q").pod_set("main", 1, &[(RES, 50)]);
    e.submit(0, base).expect("submit");
    for i in 0..parked {
        let w = WorkloadInfo::new(&format!("ns/huge-{i}"), "q").pod_set("main", 1, &[(RES, 60)]);
        e.submit(1, w).expect("submit");
    }
    e.schedule(1).expect("schedule");
    let start = Instant::now();
    let before = e.stats.admissions;
    for i in 0..2000u64 {
        let t = 10 + i * 10;
        e.advance_to(t).expect("advance");
        let w = WorkloadInfo::new(&format!("ns/small-{i}"), "q")
            .pod_set("main", 1, &[(RES, 1)])
            .runtime(5);
        e.submit(t, w).expect("submit");
        e.schedule(t).expect("schedule");
    }
    e.advance_to(u64::MAX / 2).expect("advance");
    let n = e.stats.admissions - before;
    (start.elapsed().as_secs_f64() * 1e6 / n as f64, n)
}

/// `cargo test --all-targets` runs this binary without `--bench`: a fast smoke check that
/// both engines agree on a small shape, instead of the benchmark.
fn smoke() {
    let shape = Shape {
        name: "smoke: 2 cohorts x 2 CQs",
        cohorts: 2,
        queues: 2,
        classes: vec![
            Class {
                name: "small",
                count: 30,
                interval: 100,
                runtime: 200,
                priority: 50,
                request: 1,
            },
            Class {
                name: "large",
                count: 5,
                interval: 1200,
                runtime: 1000,
                priority: 200,
                request: 20,
            },
        ],
    };
    let a = run(&shape, Requeue::Indexed);
    let b = run(&shape, Requeue::FullRescan);
    assert_eq!(a.admissions, b.admissions, "engines disagree");
    assert!(a.evaluations <= b.evaluations);
    let (_, n) = starvation(20, Requeue::Indexed);
    assert_eq!(n, 2000);
    println!("quota bench smoke test ok (run `cargo bench --bench quota` for numbers)");
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        smoke();
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    println!("quota engine benchmark (one thread; ratios are what matter)");
    println!("\n== starvation: microseconds per admission of a small workload next to N inadmissible ones");
    let sizes: &[usize] = if quick {
        &[100, 1000]
    } else {
        &[100, 1000, 10_000]
    };
    for &n in sizes {
        let (fast, _) = starvation(n, Requeue::Indexed);
        let (naive, _) = starvation(n, Requeue::FullRescan);
        println!(
            "  N={n:>6}: indexed {fast:>9.1} us, full-rescan {naive:>11.1} us, ratio {:.0}x",
            naive / fast
        );
    }
    report(&baseline());
    if !quick {
        report(&thousand());
    }
}
