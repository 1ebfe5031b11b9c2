//! `tessera report chargeback` over a week for 200 namespaces from a real Prometheus
//! (issue 21: ≤ 5 s). A simulated week (`tests/support/chargeback_week.rs`: 200 namespaces ×
//! 2 pods on 25 nodes, whole/MIG/time-sliced/vGPU, container restarts, pods that come and
//! go), scraped every 60 s, is backfilled a day at a time with `promtool tsdb
//! create-blocks-from openmetrics` into Debian's Prometheus; the report (the library call,
//! as the binary makes it) is timed cold (first query after start) and warm, and checked
//! against the simulated ledger.
//!
//! Run: `cargo bench --bench chargeback` (`CHARGEBACK_NAMESPACES`, default 200;
//! `CHARGEBACK_RUNS`, default 5). Under `cargo test --all-targets`: 3 namespaces over one
//! day, as a smoke test. Needs `prometheus` and `promtool` on PATH.

#[path = "../tests/support/chargeback_week.rs"]
mod week;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera::chargeback::read;
use tessera::chargeback::report::{GroupBy, Window};
use tessera::prometheus::PromClient;
use week::{Spec, Week, WEEK};

const START: i64 = 1_795_392_000;
const DAY: i64 = 86_400;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (namespaces, length, runs) = if full {
        (
            env("CHARGEBACK_NAMESPACES", 200),
            WEEK,
            env("CHARGEBACK_RUNS", 5),
        )
    } else {
        (3, DAY, 1)
    };
    if Command::new("promtool").arg("--version").output().is_err()
        || Command::new("prometheus")
            .arg("--version")
            .output()
            .is_err()
    {
        println!("chargeback bench: prometheus/promtool not installed (apt-get install prometheus); skipped");
        return;
    }
    let started = Instant::now();
    let week = Week::simulate(Spec {
        start: START,
        seed: 2026,
        namespaces,
        nodes: 25,
        sample_every: 60,
        length,
    });
    let series: usize = week.holds.len() * 2;
    let samples: usize = week.holds.iter().map(|h| h.samples.len() * 2).sum();
    println!(
        "simulated {namespaces} namespaces, {series} counter series, {samples} samples, {} resets in {:.1?}",
        week.resets,
        started.elapsed()
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let tsdb = dir.path().join("tsdb");
    let started = Instant::now();
    let mut day = START;
    while day < START + length + DAY {
        let text = dir.path().join("day.om");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&text).unwrap());
        week.write_openmetrics_between(&mut file, day, day + DAY)
            .unwrap();
        drop(file);
        let out = Command::new("promtool")
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&text)
            .arg(&tsdb)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        day += DAY;
    }
    println!("backfilled in {:.1?}", started.elapsed());

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, "global: {scrape_interval: 1m}\n").unwrap();
    let mut prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg("--storage.tsdb.retention.time=100y")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = PromClient::new(Duration::from_secs(120)).unwrap();
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.query_one(&url, "vector(1)").await.is_err() {
            assert!(Instant::now() < deadline, "prometheus did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let window = Window::new(START, START + length, 60).unwrap();
    let mut times = Vec::new();
    for (i, by) in ["namespace", "label:team", "namespace", "queue", "namespace"]
        .iter()
        .cycle()
        .take(runs.max(1))
        .enumerate()
    {
        let by = GroupBy::parse(by).unwrap();
        let started = Instant::now();
        let report = runtime
            .block_on(read::run(&client, &url, &window, &by))
            .unwrap();
        let took = started.elapsed();
        let want = week.expected(START, START + length, |l| match by.label() {
            "namespace" => l.namespace.clone(),
            "queue" => l.queue.clone(),
            _ => l.team.clone(),
        });
        assert_eq!(report.rows.len(), want.len());
        for row in &report.rows {
            let (a, _) = want[&(row.group.clone(), row.model.clone(), row.mode.clone())];
            assert!(
                (row.allocated_gpu_seconds - a).abs() < 1e-3,
                "{row:?} vs {a}"
            );
        }
        println!(
            "run {i} (by {}{}): {:.2?}, {} rows",
            by.label(),
            if i == 0 { ", cold" } else { "" },
            took,
            report.rows.len()
        );
        times.push(took);
    }
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    let cold = times[0];
    let mut warm = times[1..].to_vec();
    warm.sort();
    if let (Some(median), Some(max)) = (warm.get(warm.len() / 2), warm.last()) {
        println!(
            "chargeback report, {namespaces} namespaces over {} days: cold {cold:.2?}, warm median {median:.2?}, max {max:.2?} (target ≤ 5 s)",
            length / DAY
        );
    } else {
        println!("chargeback report smoke: {cold:.2?}");
    }
}
