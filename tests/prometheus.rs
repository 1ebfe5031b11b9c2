//! Instant queries against a real Prometheus (Debian's package, started on a loopback
//! port scraping an exporter the test drives), as the autoscaler's prometheus triggers
//! make them, and the scaling engine fed by those readings: one series, no series,
//! several series, NaN and +Inf, PromQL that Prometheus refuses (its own error shown), a
//! server that is down, one that never answers (timeout), a bad address — and the
//! Prometheus going away mid-run: the target is held, then falls back, never goes to zero.

mod support;

use std::time::{Duration, Instant};
use support::prometheus::{Exporter, Prometheus};
use tessera::autoscale::{Coupling, Observation, Reading, Scaler, ScalerSpec};
use tessera::prometheus::{PromClient, QueryError, Sample};

fn client() -> PromClient {
    PromClient::new(Duration::from_secs(2)).expect("a client")
}

/// Polls `query` until it returns what `done` accepts (Prometheus scrapes every second).
async fn eventually(
    p: &Prometheus,
    query: &str,
    done: impl Fn(&Result<Sample, QueryError>) -> bool,
) -> Result<Sample, QueryError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = client().query_one(&p.url, query).await;
        if done(&got) || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_queries_answer_one_sample_or_say_why_not() {
    let exporter = Exporter::start().await;
    exporter.set(
        "queue_depth{service=\"llm\"} 250\nqueue_depth{service=\"asr\"} 40\n\
         latency_nan NaN\nlatency_inf +Inf\n",
    );
    let Some(p) = Prometheus::start(&exporter).await else {
        return;
    };
    let one = r#"queue_depth{service="llm"}"#;
    assert_eq!(
        eventually(&p, one, |r| matches!(r, Ok(Sample::Value(_)))).await,
        Ok(Sample::Value(250.0))
    );
    let c = client();
    assert_eq!(
        c.query_one(&p.url, "sum(queue_depth)").await,
        Ok(Sample::Value(290.0))
    );
    assert_eq!(
        c.query_one(&p.url, "queue_depth").await,
        Err(QueryError::SeveralSeries(2))
    );
    assert_eq!(
        c.query_one(&p.url, "no_such_metric").await,
        Ok(Sample::Empty)
    );
    assert!(matches!(c.query_one(&p.url, "latency_nan").await, Ok(Sample::Value(v)) if v.is_nan()));
    assert_eq!(
        c.query_one(&p.url, "latency_inf").await,
        Ok(Sample::Value(f64::INFINITY))
    );
    assert_eq!(
        c.query_one(&p.url, "scalar(sum(queue_depth))").await,
        Ok(Sample::Value(290.0))
    );
    match c.query_one(&p.url, "sum(queue_depth").await {
        Err(QueryError::Refused { error_type, error }) => {
            assert_eq!(error_type, "bad_data");
            assert!(
                error.contains("parse error"),
                "Prometheus's own message: {error}"
            );
        }
        other => panic!("bad PromQL answered {other:?}"),
    }
    assert!(matches!(
        c.query_one(&p.url, "queue_depth[1m]").await,
        Err(QueryError::WrongType(t)) if t == "matrix"
    ));
    assert!(matches!(
        c.query_one("prometheus:9090", "up").await,
        Err(QueryError::BadAddress { .. })
    ));
}

#[tokio::test]
async fn a_server_that_is_down_or_silent_is_an_error_within_the_timeout() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let got = client().query_one(&down, "up").await;
    assert!(
        matches!(got, Err(QueryError::Unreachable { .. })),
        "{got:?}"
    );

    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let slow = PromClient::new(Duration::from_millis(300)).unwrap();
    let start = Instant::now();
    let got = slow.query_one(&url, "up").await;
    assert!(matches!(got, Err(QueryError::Timeout { .. })), "{got:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

fn reading(r: Result<Sample, QueryError>) -> Reading {
    match r {
        Ok(Sample::Value(v)) => Reading::Value(v),
        Ok(Sample::Empty) => Reading::Empty,
        Err(e) => Reading::Failed(e.to_string()),
    }
}

/// The engine on real readings: the queue depth scales the target; Prometheus killed,
/// the target is held for two polls and then set to the fallback, never to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_scales_on_real_readings_and_falls_back_when_prometheus_goes() {
    let exporter = Exporter::start().await;
    exporter.set("queue_depth 250\n");
    let Some(mut p) = Prometheus::start(&exporter).await else {
        return;
    };
    let spec: ScalerSpec = serde_json::from_value(serde_json::json!({
        "scaleTargetRef": {"name": "llm"},
        "minReplicaCount": 0, "maxReplicaCount": 10, "cooldownPeriod": 0,
        "fallback": {"failureThreshold": 3, "replicas": 4},
        "triggers": [{"type": "prometheus", "metadata": {
            "serverAddress": p.url, "query": "sum(queue_depth)", "threshold": "100"}}]
    }))
    .unwrap();
    let settings = spec.validate().unwrap();
    let query = settings.triggers[0].query.clone();
    let mut scaler = Scaler::new(settings, Coupling::Quota);
    let first = eventually(&p, &query, |r| matches!(r, Ok(Sample::Value(_)))).await;
    assert_eq!(first, Ok(Sample::Value(250.0)));
    let mut target = 1;
    let mut now = 0;
    let mut poll = |scaler: &mut Scaler, r: Reading, target: &mut u32| {
        now += 15_000;
        let d = scaler.step(
            &Observation {
                target: *target,
                serving: *target,
                readings: vec![r],
            },
            now,
        );
        *target = d.replicas;
        d
    };
    let r = reading(client().query_one(&p.url, &query).await);
    assert_eq!(
        poll(&mut scaler, r, &mut target).replicas,
        3,
        "ceil(250 / 100)"
    );
    p.stop();
    for i in 0..3 {
        let r = reading(client().query_one(&p.url, &query).await);
        assert!(matches!(r, Reading::Failed(_)), "{r:?}");
        let d = poll(&mut scaler, r, &mut target);
        if i < 2 {
            assert_eq!(d.replicas, 3, "held while Prometheus is away: {d:?}");
        } else {
            assert_eq!((d.replicas, d.fallback), (4, true), "{d:?}");
        }
    }
}
