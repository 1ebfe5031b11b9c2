//! The live InferenceScaler loop (`tessera controller`'s autoscaler) against the
//! API-server double and a real Prometheus (Debian's package) scraping an exporter the test
//! drives: KEDA's Prometheus example, renamed to `InferenceScaler`, scales a Deployment up
//! from the metric, to zero after the cooldown, and back from zero — through `/scale`, with
//! KEDA's status conditions and an Event per change; an invalid spec and a target without
//! `/scale` are reported and their targets left alone. Every request the loop makes is
//! checked against the controller's RBAC.
//!
//! The Deployment controller and the scheduler are modelled by a task that keeps one
//! scheduled pod per replica (created and deleted as `spec.replicas` changes).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use support::apiserver::ApiServer;
use support::prometheus::{Exporter, Prometheus};
use tessera::autoscale::Coupling;
use tessera::controller::autoscaler::{self, AutoscalerConfig};
use tessera::controller::reconciler::{Clock, SystemClock};
use tessera::controller::scaler_metrics::ScalerMetrics;
use tokio_util::sync::CancellationToken;

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/ml/deployments";
const PODS: &str = "/api/v1/namespaces/ml/pods";
const SCALERS: &str = "/apis/tessera.io/v1alpha1/namespaces/ml/inferencescalers";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ml/events";

fn deployment(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}}})
}

/// KEDA's Prometheus scaler example with the kind renamed (and short intervals).
fn scaler(name: &str, target: &str, prometheus: &str) -> Value {
    json!({"apiVersion": "tessera.io/v1alpha1", "kind": "InferenceScaler",
        "metadata": {"name": name, "namespace": "ml", "generation": 1},
        "spec": {
            "scaleTargetRef": {"name": target},
            "pollingInterval": 1,
            "cooldownPeriod": 2,
            "minReplicaCount": 0,
            "maxReplicaCount": 10,
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": prometheus,
                "query": "sum(http_requests_in_flight{service=\"web\"})",
                "threshold": "100",
                "activationThreshold": "5"}}]}})
}

/// The Deployment controller and scheduler: one scheduled pod per replica of `name`.
fn keep_replicas(api: ApiServer, name: &'static str, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut made = 0u64;
        while !stop.is_cancelled() {
            let want = replicas(&api, name) as usize;
            let pods = api.objects(PODS);
            if pods.len() < want {
                made += 1;
                api.put_object(
                    PODS,
                    json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": format!("{name}-{made}"), "namespace": "ml",
                            "labels": {"app": name}},
                        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x"}]}}),
                );
            } else if pods.len() > want {
                let last = pods[pods.len() - 1]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string();
                api.delete_object(PODS, &last);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

fn replicas(api: &ApiServer, name: &str) -> i64 {
    api.object(DEPLOYMENTS, name).unwrap()["spec"]["replicas"]
        .as_i64()
        .unwrap()
}

fn condition(api: &ApiServer, scaler: &str, kind: &str) -> Option<(String, String)> {
    let obj = api.object(SCALERS, scaler)?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
}

async fn until(what: &str, within: Duration, cond: impl Fn() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > within {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Starts the loop; its metrics are registered in the registry returned.
fn start_loop(api: &ApiServer, stop: &CancellationToken) -> Registry {
    let mut registry = Registry::with_prefix("tessera");
    let metrics = ScalerMetrics::register(&mut registry);
    let cfg = AutoscalerConfig {
        tick: Duration::from_millis(200),
        query_timeout: Duration::from_secs(2),
        coupling: Coupling::Quota,
        lease_namespace: "tessera-system".into(),
        lease_name: "tessera-controller-autoscaler".into(),
        identity: "test".into(),
        lease_duration: 15_000,
        metrics,
    };
    tokio::spawn(autoscaler::run(
        api.client(),
        cfg,
        Arc::new(SystemClock),
        stop.clone(),
    ));
    registry
}

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
    out
}

fn events(api: &ApiServer) -> Vec<(String, String)> {
    api.objects(EVENTS)
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["note"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keda_scaled_object_renamed_scales_a_deployment_to_zero_and_back() {
    let exporter = Exporter::start().await;
    exporter.set("http_requests_in_flight{service=\"web\"} 350\n");
    let Some(prom) = Prometheus::start(&exporter).await else {
        return;
    };
    let api = ApiServer::start("node-a").await;
    api.list_across_namespaces();
    api.put_object(DEPLOYMENTS, deployment("web", 1));
    api.put_object(SCALERS, scaler("web", "web", &prom.url));
    let stop = CancellationToken::new();
    keep_replicas(api.clone(), "web", stop.clone());
    let registry = start_loop(&api, &stop);

    // Before Prometheus has a sample the query is empty (0: not active) and the scaler
    // was never active, so the Deployment goes to zero at once, as KEDA does; then 350
    // in flight activates it and, at 100 per replica, asks for 4 (HPA's default scale-up
    // allows +4 pods per 15 s from the replicas at the period's start, 0 here).
    until("4 replicas", Duration::from_secs(20), || {
        replicas(&api, "web") == 4
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?} {:?}", api.object(SCALERS, "web"), events(&api)));
    until("Active", Duration::from_secs(5), || {
        condition(&api, "web", "Active").is_some_and(|c| c.0 == "True")
    })
    .await
    .unwrap();
    assert_eq!(condition(&api, "web", "Ready").unwrap().0, "True");
    // The poll shows under KEDA's metric names (keda_ → tessera_).
    let trigger = r#"namespace="ml",scaledObject="web",scaler="prometheusScaler",triggerIndex="0",metric="s0-prometheus",type="scaledobject""#;
    let text = scrape(&registry);
    for line in [
        format!("tessera_scaler_metrics_value{{{trigger}}} 350.0"),
        format!("tessera_scaler_active{{{trigger}}} 1"),
    ] {
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
    assert!(
        text.contains("tessera_internal_scale_loop_latency_seconds{namespace=\"ml\",type=\"scaledobject\",resource=\"web\"}"),
        "{text}"
    );

    // Traffic stops: below the activation threshold for the 2 s cooldown → zero.
    exporter.set("http_requests_in_flight{service=\"web\"} 0\n");
    until("zero replicas", Duration::from_secs(20), || {
        replicas(&api, "web") == 0
    })
    .await
    .unwrap();
    until("not Active", Duration::from_secs(5), || {
        condition(&api, "web", "Active").is_some_and(|c| c.0 == "False")
    })
    .await
    .unwrap();

    // Traffic returns: activated from zero.
    exporter.set("http_requests_in_flight{service=\"web\"} 50\n");
    until("back from zero", Duration::from_secs(20), || {
        replicas(&api, "web") >= 1
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(replicas(&api, "web"), 1, "50 in flight at 100 per replica");
    // A scale-up that is not urgent (asks for less than 3× the replicas) records its
    // anti-flap window on the target for the quota pass: its new replicas may not
    // preempt until `preemption.persistSeconds` (120 s by default) after the demand rose.
    exporter.set("http_requests_in_flight{service=\"web\"} 150\n");
    until("2 replicas", Duration::from_secs(20), || {
        replicas(&api, "web") == 2
    })
    .await
    .unwrap();
    let annotations = api.object(DEPLOYMENTS, "web").unwrap()["metadata"]["annotations"].clone();
    let at =
        tessera::controller::time::millis(annotations["tessera.io/scaled-up-at"].as_str().unwrap())
            .unwrap();
    let until_t = tessera::controller::time::millis(
        annotations["tessera.io/preempt-not-before"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    // Counted from when the demand first exceeded the serving replicas (a few polls
    // before the scale-up).
    assert!(
        until_t > at + 60_000 && until_t <= at + 120_000,
        "{annotations}"
    );
    // The status follows the /scale write (same poll, next request).
    until("the status at 2 replicas", Duration::from_secs(10), || {
        api.object(SCALERS, "web")
            .is_some_and(|s| s["status"]["desiredReplicas"] == 2)
    })
    .await
    .unwrap();
    let status = api.object(SCALERS, "web").unwrap()["status"].clone();
    assert!(status["lastActiveTime"].is_string(), "{status}");

    let reasons: Vec<String> = events(&api).into_iter().map(|e| e.0).collect();
    for reason in ["Scaled", "ScaledToZero", "Activated"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} not in {reasons:?}"
        );
    }
    let notes = events(&api);
    let to_zero = notes.iter().rfind(|e| e.0 == "ScaledToZero").unwrap();
    assert!(
        to_zero.1.contains("Deployment web scaled from 4 to 0") && to_zero.1.contains("cooldown"),
        "{to_zero:?}"
    );
    stop.cancel();
    support::rbac::assert_allows_every_request(&api, "daemonset/controller/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_and_targets_are_reported_and_their_targets_left_alone() {
    let api = ApiServer::start("node-a").await;
    api.list_across_namespaces();
    api.put_object(DEPLOYMENTS, deployment("typo", 3));
    api.put_object(DEPLOYMENTS, deployment("inverted", 3));
    // A misspelt field, min above max, and a target kind without /scale.
    let mut typo = scaler("typo", "typo", "http://127.0.0.1:9");
    typo["spec"]["pollingIntervall"] = json!(5);
    api.put_object(SCALERS, typo);
    let mut inverted = scaler("inverted", "inverted", "http://127.0.0.1:9");
    inverted["spec"]["minReplicaCount"] = json!(8);
    inverted["spec"]["maxReplicaCount"] = json!(2);
    api.put_object(SCALERS, inverted);
    api.put_object(
        "/api/v1/namespaces/ml/configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ml"}}),
    );
    let mut no_scale = scaler("no-scale", "cm", "http://127.0.0.1:9");
    no_scale["spec"]["scaleTargetRef"] =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "cm"});
    api.put_object(SCALERS, no_scale);
    // A DaemonSet has no /scale either; a kind the server does not serve at all.
    let mut daemonset = scaler("daemonset", "agents", "http://127.0.0.1:9");
    daemonset["spec"]["scaleTargetRef"] =
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agents"});
    api.put_object(SCALERS, daemonset);
    let mut unknown = scaler("unknown", "x", "http://127.0.0.1:9");
    unknown["spec"]["scaleTargetRef"] =
        json!({"apiVersion": "apps/v1", "kind": "Deploymnet", "name": "x"});
    api.put_object(SCALERS, unknown);
    let stop = CancellationToken::new();
    let _registry = start_loop(&api, &stop);

    until("five conditions", Duration::from_secs(10), || {
        ["typo", "inverted", "no-scale", "daemonset", "unknown"]
            .iter()
            .all(|s| condition(&api, s, "Ready").is_some())
    })
    .await
    .unwrap();
    let (ok, message) = condition(&api, "typo", "Ready").unwrap();
    assert_eq!(ok, "False");
    assert!(message.contains("pollingIntervall"), "{message}");
    let (ok, message) = condition(&api, "inverted", "Ready").unwrap();
    assert_eq!(ok, "False");
    assert!(message.contains("spec.minReplicaCount"), "{message}");
    let (ok, message) = condition(&api, "no-scale", "Ready").unwrap();
    assert_eq!(ok, "False");
    assert_eq!(
        message, "ConfigMap (v1) has no /scale subresource",
        "{message}"
    );
    let (_, message) = condition(&api, "daemonset", "Ready").unwrap();
    assert_eq!(message, "DaemonSet (apps/v1) has no /scale subresource");
    let (_, message) = condition(&api, "unknown", "Ready").unwrap();
    assert_eq!(
        message,
        "Deploymnet (apps/v1) is not a kind the API server serves"
    );
    // Several polls later: nothing scaled, one Event per bad spec (not one per poll).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(replicas(&api, "typo"), 3);
    assert_eq!(replicas(&api, "inverted"), 3);
    let reasons: Vec<String> = events(&api).into_iter().map(|e| e.0).collect();
    assert_eq!(
        reasons.iter().filter(|r| *r == "InvalidSpec").count(),
        2,
        "{reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| *r == "ScaleTargetError").count(),
        3,
        "{reasons:?}"
    );
    stop.cancel();
}

/// A scale target is found through the API server's discovery document: a custom
/// resource with an irregular plural (`inferencepolicies`) and a `/scale` subresource
/// is scaled, here to its fallback replicas while Prometheus is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_with_an_irregular_plural_is_found_through_discovery() {
    const POLICIES: &str = "/apis/example.com/v1/namespaces/ml/inferencepolicies";
    let api = ApiServer::start("node-a").await;
    api.list_across_namespaces();
    api.serve_kind(
        "example.com/v1",
        "inferencepolicies",
        "InferencePolicy",
        true,
    );
    api.put_object(
        POLICIES,
        json!({"apiVersion": "example.com/v1", "kind": "InferencePolicy",
            "metadata": {"name": "llm", "namespace": "ml"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}}}}),
    );
    let mut s = scaler("llm", "llm", "http://127.0.0.1:9");
    s["spec"]["scaleTargetRef"] =
        json!({"apiVersion": "example.com/v1", "kind": "InferencePolicy", "name": "llm"});
    s["spec"]["fallback"] = json!({"failureThreshold": 1, "replicas": 3});
    api.put_object(SCALERS, s);
    let stop = CancellationToken::new();
    let _registry = start_loop(&api, &stop);
    let scaled = || api.object(POLICIES, "llm").unwrap()["spec"]["replicas"].as_i64() == Some(3);
    until("the fallback replicas", Duration::from_secs(10), scaled)
        .await
        .unwrap();
    let (ok, message) = condition(&api, "llm", "Fallback").unwrap();
    assert_eq!(ok, "True", "{message}");
    stop.cancel();
}

/// A coupled scale-down records the hold on what it frees on its target, where the
/// quota pass reads it back (and a restarted controller finds it): `tessera.io/hold-freed`
/// with the replicas before, the end `holdFreedSeconds` later and `cheapReworkSeconds`;
/// a second scale-down while it stands keeps the peak and the later end. An annotation
/// there that cannot be read is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coupled_scale_down_records_its_hold_on_the_target() {
    let exporter = Exporter::start().await;
    exporter.set("http_requests_in_flight{service=\"web\"} 350\n");
    let Some(prom) = Prometheus::start(&exporter).await else {
        return;
    };
    let api = ApiServer::start("node-a").await;
    api.list_across_namespaces();
    let mut web = deployment("web", 4);
    web["metadata"]["annotations"] = json!({"tessera.io/hold-freed": "garbage"});
    api.put_object(DEPLOYMENTS, web);
    let mut spec = scaler("web", "web", &prom.url);
    spec["spec"]["minReplicaCount"] = json!(1);
    spec["spec"]["preemption"] = json!({"holdFreedSeconds": 600, "cheapReworkSeconds": 120});
    spec["spec"]["advanced"] = json!({"horizontalPodAutoscalerConfig": {"behavior": {
        "scaleDown": {"stabilizationWindowSeconds": 0}}}});
    api.put_object(SCALERS, spec);
    let stop = CancellationToken::new();
    keep_replicas(api.clone(), "web", stop.clone());
    let _registry = start_loop(&api, &stop);
    until("Active at 4", Duration::from_secs(20), || {
        condition(&api, "web", "Active").is_some_and(|c| c.0 == "True")
            && replicas(&api, "web") == 4
    })
    .await
    .unwrap();
    let hold = |api: &ApiServer| -> Value {
        let text = api.object(DEPLOYMENTS, "web").unwrap()["metadata"]["annotations"]
            ["tessera.io/hold-freed"]
            .as_str()
            .unwrap_or("null")
            .to_string();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    };
    let millis = |v: &Value| tessera::controller::time::millis(v.as_str().unwrap()).unwrap();

    // 150 in flight at 100 per replica: 2.
    exporter.set("http_requests_in_flight{service=\"web\"} 150\n");
    until("2 replicas", Duration::from_secs(20), || {
        replicas(&api, "web") == 2
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", events(&api)));
    let now = SystemClock.now();
    let first = hold(&api);
    assert_eq!(first["replicas"], 4, "{first}");
    assert_eq!(first["maxReworkSeconds"], 120, "{first}");
    let end = millis(&first["until"]);
    assert!(end > now + 590_000 && end <= now + 600_000, "{first}");

    // 50: 1. The hold keeps the peak of 4, and ends 600 s after this scale-down.
    exporter.set("http_requests_in_flight{service=\"web\"} 50\n");
    until("1 replica", Duration::from_secs(20), || {
        replicas(&api, "web") == 1
    })
    .await
    .unwrap();
    let second = hold(&api);
    assert_eq!(second["replicas"], 4, "{second}");
    assert!(millis(&second["until"]) > end, "{first} then {second}");
    stop.cancel();
    support::rbac::assert_allows_every_request(&api, "daemonset/controller/rbac.yaml");
}
