//! The controller's metrics, scraped from `GET /metrics` on its probes listener after
//! passes against the API-server double: admissions counted once (a pass that decides
//! the same again adds nothing), their wait from creation, a preemption as an eviction
//! of the victim's queue and a preemption of the preemptor's, the pending workloads
//! and the quota; and read back by a real Prometheus scraping the same listener.

use super::support::http::{get_text, sample};
use super::support::prometheus::{Exporter, Prometheus};
use super::{cfg, cluster, create_pod, pass_at, pod, NOW, PODS};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::controller::metrics::ControllerMetrics;
use tessera::controller::reconciler::PassState;
use tessera::controller::webhook_server::{serve_probes_with, Health};
use tessera::prometheus::{PromClient, Sample};
use tokio_util::sync::CancellationToken;

/// `GET /metrics` on `addr`: the content type and the page.
async fn scrape(addr: SocketAddr) -> (String, String) {
    let (code, kind, page) = get_text(addr, "/metrics").await;
    assert_eq!(code, 200, "{page}");
    (kind, page)
}

const CQ: &str = "cluster_queue=\"cq\"";
const GPU: &str = "cohort=\"\",cluster_queue=\"cq\",flavor=\"h100\",resource=\"nvidia.com/gpu\"";
/// Kueue's LocalQueue labels of `team/lq`, and its GPU row.
const LQ: &str = "name=\"lq\",namespace=\"team\"";
const LQ_GPU: &str = "name=\"lq\",namespace=\"team\",flavor=\"h100\",resource=\"nvidia.com/gpu\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_and_a_preemption_are_counted_once_and_served_on_metrics() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    let metrics = Arc::new(ControllerMetrics::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve_probes_with(
        listener,
        Health::disabled(),
        Some(metrics.clone()),
        stop.clone(),
    ));
    let mut state = PassState::new(&c).with_metrics(metrics.clone());
    for name in ["low-1", "low-2", "low-3"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }

    // 12:00:50: the ungates fail (500): nothing admitted, nothing counted.
    s.fail_requests(&["PUT"], PODS);
    pass_at(&client, &c, &mut state, NOW - 10_000).await;
    s.stop_failing();
    let (_, page) = scrape(addr).await;
    assert_eq!(
        sample(&page, &format!("tessera_admitted_workloads_total{{{CQ}}}")),
        None,
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "tessera_admission_attempts_total{result=\"inadmissible\"}"
        ),
        Some(1.0)
    );

    // 12:01: two of three admitted, a minute after their creation; the third tried and
    // parked.
    pass_at(&client, &c, &mut state, NOW).await;
    let (kind, page) = scrape(addr).await;
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(page.ends_with("# EOF\n"), "{page}");
    let v = |page: &str, series: &str| sample(page, series).unwrap_or(f64::NAN);
    // A LocalQueue family's sample for `lq` (its labels, then `extra` ones).
    let lq_v = |page: &str, family: &str, extra: &str| {
        v(
            page,
            &format!("tessera_local_queue_{family}{{{LQ}{extra}}}"),
        )
    };
    assert_eq!(
        v(&page, &format!("tessera_admitted_workloads_total{{{CQ}}}")),
        2.0,
        "{page}"
    );
    let wait = "tessera_admission_wait_time_seconds";
    assert_eq!(v(&page, &format!("{wait}_count{{{CQ}}}")), 2.0);
    assert_eq!(v(&page, &format!("{wait}_sum{{{CQ}}}")), 120.0);
    assert_eq!(
        v(&page, &format!("{wait}_bucket{{le=\"40.0\",{CQ}}}")),
        0.0,
        "{page}"
    );
    assert_eq!(v(&page, &format!("{wait}_bucket{{le=\"80.0\",{CQ}}}")), 2.0);
    let pending = |page: &str, status: &str| {
        v(
            page,
            &format!("tessera_pending_workloads{{{CQ},status=\"{status}\"}}"),
        )
    };
    assert_eq!(
        (pending(&page, "active"), pending(&page, "inadmissible")),
        (0.0, 1.0)
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_cluster_queue_resource_usage{{{GPU}}}")
        ),
        4.0
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_cluster_queue_nominal_quota{{{GPU}}}")
        ),
        4.0
    );
    assert_eq!(
        sample(
            &page,
            &format!("tessera_cluster_queue_borrowing_limit{{{GPU}}}")
        ),
        None
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_cluster_queue_status{{{CQ},status=\"active\"}}")
        ),
        1.0
    );
    assert_eq!(
        v(
            &page,
            "tessera_admission_attempts_total{result=\"success\"}"
        ),
        1.0
    );
    // The same per LocalQueue, under Kueue's `local_queue_*` names and labels.
    let lq_pending = |page: &str, status: &str| {
        v(
            page,
            &format!("tessera_local_queue_pending_workloads{{{LQ},status=\"{status}\"}}"),
        )
    };
    assert_eq!(
        (
            lq_pending(&page, "active"),
            lq_pending(&page, "inadmissible")
        ),
        (0.0, 1.0),
        "{page}"
    );
    assert_eq!(lq_v(&page, "admitted_workloads_total", ""), 2.0);
    let lq_wait = "tessera_local_queue_admission_wait_time_seconds";
    assert_eq!(v(&page, &format!("{lq_wait}_sum{{{LQ}}}")), 120.0);
    assert_eq!(lq_v(&page, "admitted_active_workloads", ""), 2.0);
    // Kueue's quota-reservation families: reserved in the pass that admits (no
    // admission checks), so the same counts and waits.
    assert_eq!(
        v(
            &page,
            &format!("tessera_quota_reserved_workloads_total{{{CQ}}}")
        ),
        2.0
    );
    let reserved_wait = "tessera_quota_reserved_wait_time_seconds";
    assert_eq!(v(&page, &format!("{reserved_wait}_sum{{{CQ}}}")), 120.0);
    assert_eq!(
        v(
            &page,
            &format!("tessera_reserving_active_workloads{{{CQ}}}")
        ),
        2.0
    );
    assert_eq!(lq_v(&page, "quota_reserved_workloads_total", ""), 2.0);
    assert_eq!(
        v(
            &page,
            &format!("tessera_local_queue_quota_reserved_wait_time_seconds_sum{{{LQ}}}")
        ),
        120.0
    );
    assert_eq!(lq_v(&page, "reserving_active_workloads", ""), 2.0);
    assert_eq!(
        v(&page, &format!("tessera_admitted_active_workloads{{{CQ}}}")),
        2.0
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_local_queue_resource_usage{{{LQ_GPU}}}")
        ),
        4.0
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_local_queue_status{{{LQ},active=\"True\"}}")
        ),
        1.0
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_local_queue_status{{{LQ},active=\"False\"}}")
        ),
        0.0
    );

    // The same again: nothing is counted twice.
    pass_at(&client, &c, &mut state, NOW + 1_000).await;
    let (_, page) = scrape(addr).await;
    assert_eq!(
        v(&page, &format!("tessera_admitted_workloads_total{{{CQ}}}")),
        2.0
    );
    assert_eq!(
        v(
            &page,
            "tessera_admission_attempts_total{result=\"inadmissible\"}"
        ),
        2.0
    );

    // A high-priority pod preempts one low pod (45 s grace: it still holds its GPUs).
    create_pod(&s, "high-1", 2, "high", json!({}), None);
    pass_at(&client, &c, &mut state, NOW + 2_000).await;
    let victim = s.evictions()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, page) = scrape(addr).await;
    let evicted = format!("tessera_evicted_workloads_total{{{CQ},reason=\"Preempted\"}}");
    let preempted = "tessera_preempted_workloads_total{preempting_cluster_queue=\"cq\",reason=\"InClusterQueue\"}";
    assert_eq!(
        (v(&page, &evicted), v(&page, preempted)),
        (1.0, 1.0),
        "{page}"
    );
    assert_eq!(
        v(
            &page,
            &format!("tessera_local_queue_evicted_workloads_total{{{LQ},reason=\"Preempted\"}}")
        ),
        1.0
    );
    // The victim terminates and the preemptor waits: the LocalQueue still uses 4 GPUs,
    // with one workload fewer admitted.
    assert_eq!(
        v(
            &page,
            &format!("tessera_local_queue_resource_usage{{{LQ_GPU}}}")
        ),
        4.0
    );
    assert_eq!(lq_v(&page, "admitted_active_workloads", ""), 1.0);
    assert_eq!(
        v(
            &page,
            &format!("tessera_cluster_queue_resource_usage{{{GPU}}}")
        ),
        4.0
    );
    // Still terminating: the next pass neither evicts nor counts again.
    pass_at(&client, &c, &mut state, NOW + 3_000).await;
    let (_, page) = scrape(addr).await;
    assert_eq!((v(&page, &evicted), v(&page, preempted)), (1.0, 1.0));

    // The victim is gone: the preemptor is admitted, 64 s after its creation.
    assert!(s.delete_object(PODS, &victim));
    pass_at(&client, &c, &mut state, NOW + 4_000).await;
    assert!(pod(&s, "high-1")["spec"]["schedulingGates"]
        .as_array()
        .is_none_or(|g| g.is_empty()));
    let (_, page) = scrape(addr).await;
    assert_eq!(
        v(&page, &format!("tessera_admitted_workloads_total{{{CQ}}}")),
        3.0
    );
    assert_eq!(v(&page, &format!("{wait}_sum{{{CQ}}}")), 184.0);
    assert_eq!(v(&page, &format!("{lq_wait}_sum{{{LQ}}}")), 184.0);
    assert_eq!(lq_v(&page, "admitted_active_workloads", ""), 2.0);
    assert_eq!(
        (pending(&page, "active"), pending(&page, "inadmissible")),
        (0.0, 1.0),
        "{page}"
    );

    // A real Prometheus scraping the probes listener reads the same.
    let target = Exporter::at(addr);
    if let Some(p) = Prometheus::start(&target).await {
        let query = "tessera_pending_workloads{cluster_queue=\"cq\",status=\"inadmissible\"}";
        let client = PromClient::new(Duration::from_secs(2)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let got = loop {
            let got = client.query_one(&p.url, query).await;
            if matches!(got, Ok(Sample::Value(_))) || Instant::now() > deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(matches!(got, Ok(Sample::Value(v)) if v == 1.0), "{got:?}");
        let admitted = client
            .query_one(&p.url, "sum(tessera_admitted_workloads_total)")
            .await;
        assert!(
            matches!(admitted, Ok(Sample::Value(v)) if v == 3.0),
            "{admitted:?}"
        );
        let lq = client
            .query_one(
                &p.url,
                "sum by (namespace, name) (tessera_local_queue_pending_workloads{namespace=\"team\",name=\"lq\"})",
            )
            .await;
        assert!(matches!(lq, Ok(Sample::Value(v)) if v == 1.0), "{lq:?}");
        let lq_admitted = client
            .query_one(
                &p.url,
                "tessera_local_queue_admitted_workloads_total{namespace=\"team\",name=\"lq\"}",
            )
            .await;
        assert!(
            matches!(lq_admitted, Ok(Sample::Value(v)) if v == 3.0),
            "{lq_admitted:?}"
        );
    }
    stop.cancel();
}
