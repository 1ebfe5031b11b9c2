//! `tessera plan` as a user runs it: the JSON shape, the table, and clear errors.

use std::process::Command;

fn tessera(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run tessera")
}

fn scenario(name: &str) -> String {
    format!(
        "{}/tests/scenarios/plan/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn json_output_has_the_documented_shape() {
    let out = tessera(&["plan", "-f", &scenario("reclaim"), "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let events = v["events"].as_array().expect("events array");
    let admitted = events
        .iter()
        .find(|e| e["type"] == "Admitted" && e["workload"] == "team-b/b-1")
        .expect("b-1 admitted");
    assert_eq!(admitted["clusterQueue"], "team-b");
    assert_eq!(admitted["flavors"]["main"]["nvidia.com/gpu"], "h100");
    assert_eq!(admitted["borrowing"], false);
    let preempted = events
        .iter()
        .find(|e| e["type"] == "Preempted")
        .expect("a preemption");
    assert_eq!(preempted["workload"], "team-a/a-3");
    assert_eq!(preempted["by"], "team-b/b-1");
    assert_eq!(preempted["reason"], "InCohortReclamation");
    assert!(preempted["expectedRework"].is_number());
    let pending = events
        .iter()
        .find(|e| e["type"] == "Pending")
        .expect("pending");
    assert!(pending["reason"].is_string() && pending["message"].is_string());
    assert!(v["final"]["admitted"].is_array());
    assert_eq!(v["final"]["pending"][0]["workload"], "team-a/a-3");
    assert_eq!(v["final"]["pending"][0]["position"], 1);
}

#[test]
fn table_output_lists_events_and_final_state() {
    let out = tessera(&["plan", "-f", &scenario("minimal-victims")]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Preempted") && text.contains("ml/urgent"),
        "{text}"
    );
    assert!(
        text.contains("ADMITTED (3)") && text.contains("PENDING (1)"),
        "{text}"
    );
}

#[test]
fn until_stops_the_plan_early() {
    let out = tessera(&[
        "plan",
        "-f",
        &scenario("minimum-runtime"),
        "-o",
        "json",
        "--until",
        "5m",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(!v["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "Preempted"));
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "kind: ResourceFlavor\nmetadata: {name: a}\n---\nkind: ClusterQueue\nmetadata: {name: q}\nspec:\n  resourceGroups: [{coveredResources: [gpu], flavors: [{name: a, resources: [{name: gpu, nominalQuota: 1, borrowingLimit: 2}]}]}]\n",
            &["document 2", "line 4", "borrowingLimit"][..],
        ),
        ("kind: Gadget\nmetadata: {name: x}\n", &["unsupported kind", "Gadget"][..]),
        (
            "kind: Workload\nmetadata: {name: w, creationTimestamp: \"2024-01-01T00:00:00Z\"}\nspec: {queueName: q, podSets: []}\n",
            &["creationTimestamp", "offset"][..],
        ),
        (
            "kind: ClusterQueue\nmetadata: {name: q}\nspec: {resourceGroups: [{coveredResources: [gpu], flavors: [{name: a, resources: [{name: gpu, nominalQuota: lots}]}]}]}\n",
            &["lots"][..],
        ),
        ("kind: [\n", &["document 1"][..]),
        // Fields Tessera would ignore are refused by path, in its own kinds and in the
        // Kubernetes ones (checked against the full API types).
        (
            "kind: ClusterQueue\nmetadata: {name: q}\nspec: {bogus: 1, resourceGroups: []}\n",
            &["ClusterQueue \"q\"", "unknown field spec.bogus"][..],
        ),
        (
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  paralelism: 2\n  template: {spec: {containers: [{name: c, image: x}]}}\n",
            &["Job \"j\"", "unknown field spec.paralelism"][..],
        ),
        (
            "kind: LocalQueue\nmetadata: {name: l, namespace: n, labels: {a: b}, bogus: 1}\nspec: {clusterQueue: q}\n",
            &["unknown field metadata.bogus"][..],
        ),
    ];
    for (i, (yaml, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&path, yaml).expect("write");
        let out = tessera(&["plan", "-f", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} should fail");
        assert!(!err.contains("panicked"), "case {i} panicked: {err}");
        for w in *want {
            assert!(err.contains(w), "case {i}: {err:?} should mention {w:?}");
        }
    }
    let missing = tessera(&["plan", "-f", "/nonexistent/plan.yaml"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/plan.yaml"));
}

#[test]
fn pod_groups_and_dra_claims_become_one_workload() {
    let yaml = r#"
apiVersion: config.kueue.x-k8s.io/v1beta1
kind: Configuration
resources:
  deviceClassMappings: [{name: nvidia.com/gpu, deviceClassNames: [gpu.tessera.io]}]
---
kind: ResourceFlavor
metadata: {name: h100}
---
kind: ClusterQueue
metadata: {name: q}
spec:
  namespaceSelector: {}
  resourceGroups: [{coveredResources: [nvidia.com/gpu], flavors: [{name: h100, resources: [{name: nvidia.com/gpu, nominalQuota: 4}]}]}]
---
kind: LocalQueue
metadata: {name: q, namespace: ml}
spec: {clusterQueue: q}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus, namespace: ml}
spec: {spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.tessera.io, count: 2}}]}}}
---
kind: Pod
metadata:
  name: worker-0
  namespace: ml
  labels: {kueue.x-k8s.io/queue-name: q, kueue.x-k8s.io/pod-group-name: trainer}
  annotations: {kueue.x-k8s.io/pod-group-total-count: "2"}
spec:
  resourceClaims: [{name: gpus, resourceClaimTemplateName: two-gpus}]
  containers: [{name: c}]
---
kind: Pod
metadata:
  name: worker-1
  namespace: ml
  labels: {kueue.x-k8s.io/queue-name: q, kueue.x-k8s.io/pod-group-name: trainer}
  annotations: {kueue.x-k8s.io/pod-group-total-count: "2"}
  creationTimestamp: 30s
spec:
  resourceClaims: [{name: gpus, resourceClaimTemplateName: two-gpus}]
  containers: [{name: c}]
"#;
    let out = tessera::quota::scenario::plan_str(yaml, &Default::default()).expect("plan");
    let admitted: Vec<_> = out
        .events
        .iter()
        .filter(|e| e.kind == tessera::quota::EventType::Admitted)
        .collect();
    assert_eq!(admitted.len(), 1, "{:?}", out.events);
    assert_eq!(admitted[0].workload, "ml/trainer");
    assert_eq!(
        admitted[0].time, 30.0,
        "admitted once the whole group exists"
    );
    let usage = &out.final_state.cluster_queues[0].resources[0];
    assert_eq!(usage.usage, "4");
}

/// HAMi-style vGPU pods are charged their shares times their vGPU count: two pods of
/// 2 × 10 GiB fill a queue's 40 GiB of `nvidia.com/gpumem`, and a third waits with the
/// resource named (charged per vGPU, 3 × 10 GiB would have fit).
#[test]
fn vgpu_pods_are_charged_memory_and_cores_per_vgpu() {
    let pod = |name: &str, at: &str, gpus: u32| {
        format!(
            r#"---
kind: Pod
metadata:
  name: {name}
  namespace: ml
  labels: {{tessera.io/queue-name: q}}
  creationTimestamp: {at}
spec:
  containers:
  - name: main
    resources: {{limits: {{nvidia.com/gpu: {gpus}, nvidia.com/gpumem: 10240, nvidia.com/gpucores: 30}}}}
"#
        )
    };
    let yaml = format!(
        r#"kind: ResourceFlavor
metadata: {{name: a100}}
---
kind: ClusterQueue
metadata: {{name: q}}
spec:
  namespaceSelector: {{}}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu, nvidia.com/gpumem, nvidia.com/gpucores]
    flavors:
    - name: a100
      resources:
      - {{name: nvidia.com/gpu, nominalQuota: 8}}
      - {{name: nvidia.com/gpumem, nominalQuota: 40960}}
      - {{name: nvidia.com/gpucores, nominalQuota: 800}}
---
kind: LocalQueue
metadata: {{name: q, namespace: ml}}
spec: {{clusterQueue: q}}
{}{}{}"#,
        pod("a", "0s", 2),
        pod("b", "10s", 2),
        pod("c", "20s", 1)
    );
    let out = tessera::quota::scenario::plan_str(&yaml, &Default::default()).expect("plan");
    let admitted: Vec<_> = out
        .events
        .iter()
        .filter(|e| e.kind == tessera::quota::EventType::Admitted)
        .map(|e| e.workload.as_str())
        .collect();
    assert_eq!(admitted, ["ml/a", "ml/b"], "{:?}", out.events);
    let usage: std::collections::BTreeMap<_, _> = out.final_state.cluster_queues[0]
        .resources
        .iter()
        .map(|r| (r.resource.as_str(), r.usage.as_str()))
        .collect();
    assert_eq!(usage["nvidia.com/gpumem"], "40960", "{usage:?}");
    assert_eq!(usage["nvidia.com/gpucores"], "120", "{usage:?}");
    let pending = out
        .events
        .iter()
        .find(|e| e.kind == tessera::quota::EventType::Pending && e.workload == "ml/c")
        .expect("c waits");
    let message = format!("{pending:?}");
    assert!(message.contains("nvidia.com/gpumem"), "{message}");
}

/// `tessera plan` replays an InferenceScaler on a MetricSeries with the quota engine: the
/// queue grows at 10m, the scale-up reclaims the GPUs training borrowed; it falls at 30m
/// and the replicas go once the 5-minute scale-down window has passed; the GPUs they
/// free are held from the training Job for the default hour.
#[test]
fn inference_scaling_is_replayed_with_admissions_and_preemptions() {
    let out = tessera(&[
        "plan",
        "-f",
        &scenario("inference-scaling"),
        "--until",
        "110m",
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let events = v["events"].as_array().expect("events");
    let brief: Vec<(f64, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["time"].as_f64().unwrap(),
                e["type"].as_str().unwrap(),
                e["workload"].as_str().unwrap(),
            )
        })
        .collect();
    let scaled: Vec<_> = events.iter().filter(|e| e["type"] == "Scaled").collect();
    assert_eq!(scaled.len(), 2, "{brief:?}");
    assert_eq!(
        (scaled[0]["time"].as_f64(), scaled[0]["reason"].as_str()),
        (Some(600.0), Some("ScaledUp"))
    );
    assert!(
        scaled[0]["message"]
            .as_str()
            .unwrap()
            .contains("1 → 4 replicas"),
        "{}",
        scaled[0]
    );
    assert_eq!(scaled[1]["reason"], "ScaledDown");
    assert_eq!(
        scaled[1]["time"].as_f64(),
        Some(1800.0 + 285.0),
        "the first poll whose window no longer holds a 4"
    );
    let preempted = events
        .iter()
        .find(|e| e["type"] == "Preempted")
        .expect("training reclaimed");
    assert_eq!(preempted["workload"], "llm/finetune");
    assert_eq!(preempted["time"].as_f64(), Some(600.0));
    let admitted: Vec<f64> = events
        .iter()
        .filter(|e| e["type"] == "Admitted" && e["workload"] == "llm/finetune")
        .map(|e| e["time"].as_f64().unwrap())
        .collect();
    assert_eq!(
        admitted,
        [0.0, 2085.0 + 3600.0],
        "admitted at 0, again when the scale-down's hold ends: {brief:?}"
    );
}

#[test]
fn bad_scalers_and_series_are_refused_naming_the_field() {
    let base = "kind: ResourceFlavor\nmetadata: {name: h100}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: chat, namespace: llm}\nspec: {replicas: 1, template: {spec: {containers: [{resources: {requests: {nvidia.com/gpu: 1}}}]}}}\n---\n";
    let trigger = "triggers: [{type: prometheus, metadata: {serverAddress: 'http://p:9090', query: q, threshold: '1'}}]";
    let cases = [
        (
            format!("kind: InferenceScaler\nmetadata: {{name: s, namespace: llm}}\nspec: {{scaleTargetRef: {{name: other}}, {trigger}}}\n"),
            "Deployment llm/other is not defined earlier",
        ),
        (
            format!("kind: InferenceScaler\nmetadata: {{name: s, namespace: llm}}\nspec: {{scaleTargetRef: {{kind: Job, name: chat}}, {trigger}}}\n"),
            "spec.scaleTargetRef.kind",
        ),
        (
            format!("kind: InferenceScaler\nmetadata: {{name: s, namespace: llm}}\nspec: {{scaleTargetRef: {{name: chat}}, minReplicaCount: 3, maxReplicaCount: 2, {trigger}}}\n"),
            "spec.minReplicaCount",
        ),
        (
            format!("kind: InferenceScaler\nmetadata: {{name: s, namespace: llm}}\nspec: {{scaleTargetRef: {{name: chat}}, pollingIntervall: 5, {trigger}}}\n"),
            "pollingIntervall",
        ),
        (
            "kind: MetricSeries\nmetadata: {name: m}\nspec: {query: q, samples: [{at: 0s, value: 1, down: true}]}\n".to_string(),
            "spec.samples[0]",
        ),
        (
            "kind: MetricSeries\nmetadata: {name: m}\nspec: {query: q, samples: [{at: 5m, value: 1}, {at: 1m, value: 2}]}\n".to_string(),
            "spec.samples[1].at",
        ),
    ];
    for (doc, want) in cases {
        let yaml = format!("{base}{doc}");
        let err = tessera::quota::scenario::plan_str(&yaml, &Default::default())
            .expect_err(&doc)
            .to_string();
        assert!(err.contains(want), "{doc}\n→ {err}");
    }
}

/// A non-urgent scale-up (2 → 3 replicas) that needs training's GPUs waits for its demand
/// to persist: when the queue falls back within the window the waiting replica is
/// released and training is never preempted; when it persists, training is preempted at
/// the window's end. KEDA + Kueue (`--scaling-coupling off`) preempt at once either way.
#[test]
fn a_scale_up_preempts_training_only_once_its_demand_persisted() {
    let yaml = |drop_at: &str| {
        format!(
            r#"kind: ResourceFlavor
metadata: {{name: h100}}
---
kind: ClusterQueue
metadata: {{name: inference}}
spec:
  cohortName: fleet
  namespaceSelector: {{}}
  preemption: {{reclaimWithinCohort: Any}}
  resourceGroups: [{{coveredResources: [nvidia.com/gpu], flavors: [{{name: h100, resources: [{{name: nvidia.com/gpu, nominalQuota: 4}}]}}]}}]
---
kind: ClusterQueue
metadata: {{name: training}}
spec:
  cohortName: fleet
  namespaceSelector: {{}}
  resourceGroups: [{{coveredResources: [nvidia.com/gpu], flavors: [{{name: h100, resources: [{{name: nvidia.com/gpu, nominalQuota: 4}}]}}]}}]
---
kind: LocalQueue
metadata: {{name: serve, namespace: llm}}
spec: {{clusterQueue: inference}}
---
kind: LocalQueue
metadata: {{name: train, namespace: llm}}
spec: {{clusterQueue: training}}
---
kind: MetricSeries
metadata: {{name: q}}
spec:
  query: sum(q)
  samples: [{{at: 0s, value: 200}}, {{at: 10m, value: 300}}, {{at: {drop_at}, value: 150}}]
---
kind: Deployment
metadata: {{name: chat, namespace: llm, labels: {{tessera.io/queue-name: serve}}}}
spec: {{replicas: 2, template: {{spec: {{containers: [{{resources: {{requests: {{nvidia.com/gpu: 1}}}}}}]}}}}}}
---
kind: Job
metadata: {{name: finetune, namespace: llm, labels: {{tessera.io/queue-name: train}}}}
spec: {{parallelism: 6, template: {{spec: {{containers: [{{resources: {{requests: {{nvidia.com/gpu: 1}}}}}}]}}}}}}
---
kind: InferenceScaler
metadata: {{name: chat, namespace: llm}}
spec:
  scaleTargetRef: {{name: chat}}
  pollingInterval: 15
  minReplicaCount: 1
  maxReplicaCount: 4
  preemption: {{persistSeconds: 180}}
  triggers: [{{type: prometheus, metadata: {{serverAddress: 'http://p:9090', query: sum(q), threshold: '100'}}}}]
"#
        )
    };
    let run = |drop_at: &str, coupling| {
        let opts = tessera::quota::scenario::PlanOptions {
            until: Some(40 * 60_000),
            coupling,
        };
        tessera::quota::scenario::plan_str(&yaml(drop_at), &opts).expect("plan")
    };
    let preemptions = |out: &tessera::quota::scenario::PlanOutput| -> Vec<f64> {
        out.events
            .iter()
            .filter(|e| e.kind == tessera::quota::EventType::Preempted)
            .map(|e| e.time)
            .collect()
    };
    use tessera::autoscale::Coupling;
    let brief = run("11m", Coupling::Quota);
    assert!(preemptions(&brief).is_empty(), "{:#?}", brief.events);
    let waited = brief
        .events
        .iter()
        .find(|e| e.workload == "llm/chat-2" && e.kind == tessera::quota::EventType::Pending)
        .expect("chat-2 waited");
    assert_eq!(
        waited.reason.as_deref(),
        Some("DemandNotPersisted"),
        "{waited:?}"
    );
    assert!(brief
        .events
        .iter()
        .any(|e| e.reason.as_deref() == Some("ReleasedWaiting") && e.time == 660.0));
    assert_eq!(
        preemptions(&run("11m", Coupling::Off)),
        [600.0],
        "KEDA + Kueue preempt at once"
    );
    assert_eq!(
        preemptions(&run("30m", Coupling::Quota)),
        [780.0],
        "persisted: preempts at 10m + 180 s"
    );
}
