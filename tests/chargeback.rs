//! Chargeback against a real Prometheus: a simulated week (a seed; namespaces in queues
//! and teams, two GPU models, whole GPUs, MIG devices, time-sliced replicas and vGPU
//! slices, container restarts that reset counters, pods that come and go) is written as
//! OpenMetrics, backfilled with `promtool tsdb create-blocks-from openmetrics`, and served
//! by Debian's Prometheus. `tessera report chargeback` (the library call and the binary)
//! must give back the ledger the test computed, to the GPU-second, for several groupings
//! and windows; every dashboard panel's query must return data on that week. A window
//! without data, a Prometheus that is down, and bad flags are clear errors with a non-zero
//! exit, never a table of zeros.

mod support;
#[path = "support/chargeback_week.rs"]
mod week;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};
use support::prometheus::{backfill, backfill_rules, Prometheus};
use tessera::chargeback::read::{self, ReadError};
use tessera::chargeback::report::{GroupBy, Report, Source, Window};
use tessera::chargeback::ChargeLabels;
use tessera::prometheus::PromClient;
use week::{Spec, Week, WEEK};

/// Monday 2026-11-23T00:00:00Z.
const START: i64 = 1_795_392_000;
const DAY: i64 = 86_400;

fn client() -> PromClient {
    PromClient::new(Duration::from_secs(30)).expect("a client")
}

fn group_of(by: &GroupBy) -> impl Fn(&ChargeLabels) -> String + '_ {
    move |l: &ChargeLabels| match by.label() {
        "namespace" => l.namespace.clone(),
        "queue" => l.queue.clone(),
        "team" => l.team.clone(),
        "node" => l.node.clone(),
        other => panic!("the test does not group by {other}"),
    }
}

/// The report's rows equal the expected ledger: the same (group, model, mode) keys, and
/// allocated and used GPU-seconds within a thousandth of a GPU-second.
fn assert_matches(
    report: &Report,
    want: &BTreeMap<(String, String, String), (f64, f64)>,
    what: &str,
) {
    let got: BTreeMap<_, _> = report
        .rows
        .iter()
        .map(|r| {
            (
                (r.group.clone(), r.model.clone(), r.mode.clone()),
                (r.allocated_gpu_seconds, r.used_gpu_seconds),
            )
        })
        .collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: rows"
    );
    for (key, &(a, u)) in want {
        let (ga, gu) = got[key];
        let gu = gu.unwrap_or_else(|| panic!("{what}: {key:?} has no used GPU-seconds"));
        assert!(
            (ga - a).abs() < 1e-3,
            "{what}: {key:?} allocated {ga} ≠ {a}"
        );
        assert!((gu - u).abs() < 1e-3, "{what}: {key:?} used {gu} ≠ {u}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfilled_week_reads_back_to_the_gpu_second_and_every_dashboard_query_answers() {
    let started = Instant::now();
    let week = Week::simulate(Spec {
        start: START,
        seed: 21,
        namespaces: 10,
        nodes: 4,
        sample_every: 120,
        length: WEEK,
    });
    assert!(
        week.resets >= 10,
        "the week has counter resets: {}",
        week.resets
    );
    eprintln!("simulated: {:?}", started.elapsed());
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("week.om");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&text).unwrap());
    week.write_openmetrics(&mut file).unwrap();
    drop(file);
    let tsdb = dir.path().join("tsdb");
    if !backfill(&text, &tsdb) {
        return;
    }
    std::fs::remove_file(&text).unwrap();
    eprintln!("written and backfilled: {:?}", started.elapsed());
    let Some(prom) = Prometheus::on_tsdb(&tsdb).await else {
        return;
    };

    // Windows: the whole week; Tuesday 13:00 to Thursday 07:30 (off day boundaries,
    // through container restarts); one hour; the last day.
    let windows = [
        (START, START + WEEK),
        (START + DAY + 13 * 3600, START + 3 * DAY + 7 * 3600 + 1800),
        (START + 4 * DAY + 3600, START + 4 * DAY + 7200),
        (START + 6 * DAY, START + WEEK),
    ];
    let c = client();
    for by in ["namespace", "queue", "label:team", "label:node"] {
        let by = GroupBy::parse(by).unwrap();
        for (from, to) in windows {
            let window = Window::new(from, to, 60).unwrap();
            let report = read::run(&c, &prom.url, &window, &by, Source::Raw)
                .await
                .unwrap();
            let want = week.expected(from, to, group_of(&by));
            assert!(!want.is_empty());
            assert_matches(&report, &want, &format!("by {} {from}..{to}", by.label()));
        }
    }
    // The same at the scrape interval as the step.
    let window = Window::new(START, START + WEEK, 120).unwrap();
    let by = GroupBy::Queue;
    let report = read::run(&c, &prom.url, &window, &by, Source::Raw)
        .await
        .unwrap();
    assert_matches(
        &report,
        &week.expected(START, START + WEEK, group_of(&by)),
        "step 120",
    );
    eprintln!("reports: {:?}", started.elapsed());

    a_window_partly_without_data_names_the_gap(&prom, &week).await;
    binary_reports_match_the_library(&prom, &week);
    a_window_without_data_says_so(&prom).await;
    every_dashboard_query_returns_data(&prom).await;
    the_recording_rules_give_the_report_on_their_own_grid(&prom, &week, dir.path()).await;
    eprintln!("total: {:?}", started.elapsed());
}

/// The rules of `daemonset/prometheus/` backfilled over the week by promtool (from the
/// raw counters), served by a second Prometheus. Rules are evaluated at an offset within
/// the minute, so a rule sample at `t + offset` holds the raw samples of the minute
/// before it: over `(from, to]` the rule samples hold the raw samples in `[from, to)`,
/// which on this week's 120 s grid are the ledger's `(from - 120, to - 120]`.
async fn the_recording_rules_give_the_report_on_their_own_grid(
    raw: &Prometheus,
    week: &Week,
    dir: &std::path::Path,
) {
    let rules = std::path::Path::new("daemonset/prometheus/tessera-chargeback.rules.yml");
    let out = dir.join("rules");
    if !backfill_rules(rules, &raw.url, START, START + WEEK, &out) {
        return;
    }
    let Some(prom) = Prometheus::on_tsdb(&out).await else {
        return;
    };
    let c = client();
    let p = week.spec.sample_every;
    for by in ["namespace", "label:team"] {
        let by = GroupBy::parse(by).unwrap();
        for (from, to) in [
            (START + DAY, START + WEEK),
            (START + DAY + 13 * 3600, START + 3 * DAY + 1800),
        ] {
            let window = Window::new(from, to, 60).unwrap();
            let report = read::run(&c, &prom.url, &window, &by, Source::Rules)
                .await
                .unwrap();
            let want = week.expected(from - p, to - p, group_of(&by));
            assert_matches(
                &report,
                &want,
                &format!("rules by {} {from}..{to}", by.label()),
            );
        }
    }
    let (from, to) = (START + DAY, START + 5 * DAY);
    let out = report_cli(
        &prom.url,
        &rfc3339(from),
        &rfc3339(to),
        &["--source", "rules", "-o", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let total: f64 = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["allocated_gpu_seconds"].as_f64().unwrap())
        .sum();
    let want: f64 = week
        .expected(from - p, to - p, |l| l.namespace.clone())
        .values()
        .map(|v| v.0)
        .sum();
    assert!((total - want).abs() < 1e-2, "{total} ≠ {want}");
}

/// `tessera report chargeback --prometheus URL --from FROM --to TO` and `rest`.
fn report_cli(url: &str, from: &str, to: &str, rest: &[&str]) -> std::process::Output {
    let mut args = vec!["--prometheus", url, "--from", from, "--to", to];
    args.extend_from_slice(rest);
    tessera(&args)
}

fn tessera(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["report", "chargeback"])
        .args(args)
        .env_remove("TESSERA_PROMETHEUS")
        .output()
        .expect("tessera runs")
}

fn rfc3339(at: i64) -> String {
    tessera::chargeback::report::format_time(at)
}

fn binary_reports_match_the_library(prom: &Prometheus, week: &Week) {
    let (from, to) = (START + DAY, START + 5 * DAY);
    let (f, t) = (rfc3339(from), rfc3339(to));
    let out = report_cli(&prom.url, &f, &t, &["--by", "label:team", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["from"], f.as_str());
    let want = week.expected(from, to, |l| l.team.clone());
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for row in rows {
        let key = (
            row["group"].as_str().unwrap().to_string(),
            row["model"].as_str().unwrap().to_string(),
            row["mode"].as_str().unwrap().to_string(),
        );
        let (a, u) = want[&key];
        assert!(
            (row["allocated_gpu_seconds"].as_f64().unwrap() - a).abs() < 1e-3,
            "{row}"
        );
        assert!(
            (row["used_gpu_seconds"].as_f64().unwrap() - u).abs() < 1e-3,
            "{row}"
        );
    }

    let out = report_cli(&prom.url, &f, &t, &["--by", "queue", "-o", "csv"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = String::from_utf8(out.stdout).unwrap();
    let want = week.expected(from, to, |l| l.queue.clone());
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("queue,model,mode,allocated_gpu_seconds,used_gpu_seconds,from,to")
    );
    let total: f64 = lines
        .map(|l| l.split(',').nth(3).unwrap().parse::<f64>().unwrap())
        .sum();
    let want_total: f64 = want.values().map(|v| v.0).sum();
    assert!((total - want_total).abs() < 1e-2, "{total} ≠ {want_total}");

    let out = report_cli(&prom.url, &f, &t, &["--by", "label:team"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    eprintln!("{table}");
    let total_line = table.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    assert!(
        total_line.contains(&format!("{:.3}", want_total / 3600.0)),
        "{total_line} vs {want_total} GPU-s"
    );
}

/// Two days past the week's end: the last one has no sample at all, and is named.
async fn a_window_partly_without_data_names_the_gap(prom: &Prometheus, week: &Week) {
    let (from, to) = (START + 6 * DAY, START + 9 * DAY);
    let window = Window::new(from, to, 60).unwrap();
    let by = GroupBy::Namespace;
    let report = read::run(&client(), &prom.url, &window, &by, Source::Raw)
        .await
        .unwrap();
    assert_matches(
        &report,
        &week.expected(from, to, group_of(&by)),
        "past the end",
    );
    assert_eq!(report.missing.len(), 1, "{:?}", report.missing);
    assert_eq!(report.missing[0].from, rfc3339(START + 8 * DAY));
    assert_eq!(report.missing[0].to, rfc3339(to));
    let out = report_cli(&prom.url, &rfc3339(from), &rfc3339(to), &[]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!(
            "MISSING: no samples {} .. {}",
            rfc3339(START + 8 * DAY),
            rfc3339(to)
        )),
        "{table}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no chargeback samples in this part of the window"),
        "{err}"
    );
}

async fn a_window_without_data_says_so(prom: &Prometheus) {
    let window = Window::new(START - 30 * DAY, START - 29 * DAY, 60).unwrap();
    match read::run(
        &client(),
        &prom.url,
        &window,
        &GroupBy::Namespace,
        Source::Raw,
    )
    .await
    {
        Err(ReadError::NoData { metric, .. }) => {
            assert_eq!(metric, "tessera_chargeback_gpu_allocated_seconds_total")
        }
        other => panic!("an empty window answered {other:?}"),
    }
    let (f, t) = (rfc3339(START - 30 * DAY), rfc3339(START - 29 * DAY));
    let out = report_cli(&prom.url, &f, &t, &[]);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "no table: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no tessera_chargeback_gpu_allocated_seconds_total samples between"),
        "{err}"
    );
}

/// Every `expr` in every dashboard, with Grafana's interval variables set, evaluated at
/// the week's end, returns at least one series.
async fn every_dashboard_query_returns_data(prom: &Prometheus) {
    let mut checked = 0;
    for entry in std::fs::read_dir("daemonset/dashboards").unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let dashboard: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        assert!(
            dashboard["schemaVersion"].as_u64().unwrap_or(0) >= 36,
            "{}",
            path.display()
        );
        assert!(dashboard["uid"].is_string() && dashboard["title"].is_string());
        let variables = dashboard["templating"]["list"].as_array().unwrap();
        assert!(variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["name"] == "datasource"));
        let panels = dashboard["panels"].as_array().unwrap();
        let mut ids = std::collections::BTreeSet::new();
        for panel in panels {
            assert!(
                ids.insert(panel["id"].as_u64().unwrap()),
                "{}: duplicate panel id",
                path.display()
            );
            assert!(panel["gridPos"]["w"].is_u64() && panel["gridPos"]["h"].is_u64());
            for target in panel["targets"].as_array().into_iter().flatten() {
                let title = panel["title"].as_str().unwrap_or_default();
                assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
                let expr = target["expr"].as_str().unwrap();
                let query = expr
                    .replace("$__rate_interval", "10m")
                    .replace("$__range", "7d");
                assert!(!query.contains('$'), "{title}: unknown variable in {expr}");
                let answer = client()
                    .query_vector(&prom.url, &query, START + WEEK)
                    .await
                    .unwrap_or_else(|e| panic!("{title}: {expr}: {e}"));
                assert!(
                    !answer.is_empty(),
                    "{}: {title}: {expr} returned no data",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "{checked} queries checked");
}

#[test]
fn a_prometheus_that_is_down_or_bad_flags_are_clear_errors() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = tessera(&["--prometheus", &down, "--from", "now-1d", "--timeout", "5"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GPU-seconds for") && err.contains("is unreachable"),
        "{err}"
    );

    // Accepts connections and never answers: the report gives up after --timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = format!("http://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept() {
            held.push(tcp);
        }
    });
    let started = Instant::now();
    let out = tessera(&["--prometheus", &slow, "--timeout", "1"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not answer within 1s"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));

    let cases: [(&[&str], &str); 5] = [
        (
            &["--by", "team"],
            "--by \"team\": expected namespace, queue or label:KEY",
        ),
        (&["--from", "last week"], "--from \"last week\""),
        (&["--to", "now-3x"], "the unit must be s, m, h, d or w"),
        (
            &["--from", "now", "--to", "now-1d"],
            "--from must be before --to",
        ),
        (&["--step", "0"], "--step 0"),
    ];
    for (args, want) in cases {
        let mut all = vec!["--prometheus", down.as_str()];
        all.extend_from_slice(args);
        let out = tessera(&all);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
