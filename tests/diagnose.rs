//! `tessera diagnose` on snapshots built here: each of the four causes found with its
//! evidence, "no cause" said as such, bad input refused; the binary's exit codes, the
//! `--snapshot` round trip and `dump` against the API-server double.

mod support;

use std::process::Command;

use serde_json::{json, Value};
use tessera::diagnose::{diagnose_pod, Cause, Settings, Snapshot, Usage};
use tessera::vgpu::record::ASSIGNMENT_ANNOTATION;

const AT: &str = "2026-12-03T12:00:00Z";

fn gpu_node(name: &str, gpus: u32, labels: Value, taints: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string(), "cpu": "64",
                                   "memory": "512Gi"}}})
}

fn vgpu_node(name: &str) -> Value {
    let devices: Vec<Value> = (0..2)
        .map(|i| {
            json!({"uuid": format!("GPU-{name}-{i}"), "model": "NVIDIA A100-SXM4-80GB",
                        "memoryMiB": 81920, "slots": 10, "healthy": true})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {
            "tessera.io/vgpu-devices": Value::from(devices).to_string(),
            "tessera.io/vgpu-heartbeat": AT}},
        "status": {"allocatable": {"nvidia.com/gpu": "20"}}})
}

fn pod(name: &str, limits: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-03T11:00:00Z",
                     "labels": {"tessera.io/queue-name": "lq"}},
        "spec": {"containers": [{"name": "main", "image": "cuda",
                                 "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"}})
}

fn gpus(n: u32) -> Value {
    json!({"nvidia.com/gpu": n.to_string()})
}

fn running(mut p: Value, node: &str) -> Value {
    p["spec"]["nodeName"] = json!(node);
    p["status"]["phase"] = json!("Running");
    p
}

/// vGPU pods holding 73,728 MiB of each of the four vGPU GPUs (8,192 MiB free on each).
fn vgpu_tenants() -> Vec<Value> {
    let mut out = Vec::new();
    for node in ["v1", "v2"] {
        for i in 0..2 {
            let mut p = running(
                pod(
                    &format!("tenant-{node}-{i}"),
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "73728"}),
                ),
                node,
            );
            p["metadata"]["annotations"] = json!({ASSIGNMENT_ANNOTATION: json!({"node": node,
                "containers": [{"name": "main", "devices": [
                    {"uuid": format!("GPU-{node}-{i}"), "memoryMiB": 73728, "cores": 0}]}]})
                .to_string()});
            out.push(p);
        }
    }
    out
}

/// Two 8-GPU nodes, 6 GPUs taken on each (2 free on each); `gpu-b` tainted; two vGPU
/// nodes with 8 GiB free per GPU; and the pods under test.
fn snapshot(extra: Vec<Value>) -> Snapshot {
    let nodes = vec![
        gpu_node("gpu-a", 8, json!({"pool": "infer"}), json!([])),
        gpu_node(
            "gpu-b",
            8,
            json!({"pool": "train"}),
            json!([{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}]),
        ),
        vgpu_node("v1"),
        vgpu_node("v2"),
    ];
    let mut pods = vec![
        running(pod("train-a", gpus(6)), "gpu-a"),
        running(pod("train-b", gpus(6)), "gpu-b"),
        // Finished pods hold nothing.
        {
            let mut done = running(pod("done", gpus(2)), "gpu-a");
            done["status"]["phase"] = json!("Succeeded");
            done
        },
    ];
    pods.extend(vgpu_tenants());
    pods.extend(extra);
    Snapshot::new(nodes, pods, AT.parse().unwrap())
}

fn diagnose(s: &Snapshot, name: &str, usage: Option<&Usage>) -> tessera::diagnose::Diagnosis {
    diagnose_pod(
        s,
        "team",
        name,
        usage,
        &Settings::default(),
        AT.parse().unwrap(),
    )
    .unwrap()
}

fn verdict(d: &tessera::diagnose::Diagnosis) -> (Cause, String) {
    let v = d.verdict().unwrap_or_else(|| panic!("no verdict: {d:#?}"));
    (v.cause, v.summary.clone())
}

#[test]
fn a_gated_pod_waits_for_quota_with_the_controllers_reason() {
    let mut p = pod("queued", gpus(1));
    p["spec"]["schedulingGates"] = json!([{"name": "tessera.io/admission"}]);
    let message = "insufficient unused quota for pod set main: nvidia.com/gpu in flavor h100: 1 requested, 0 available";
    p["status"]["conditions"] = json!([{"type": "tessera.io/Admitted", "status": "False",
        "reason": "WaitingForQuota", "message": message}]);
    let mut s = snapshot(vec![p]);
    let d = diagnose(&s, "queued", None);
    let (cause, summary) = verdict(&d);
    assert_eq!(cause, Cause::Quota);
    assert_eq!(summary, format!("quota: WaitingForQuota: {message}"));
    assert_eq!(d.findings[0].evidence, ["local queue lq"]);
    // Only the first cause is walked when it explains the pod.
    assert_eq!(d.findings.len(), 1);
    // The place in the queue is on the pod's `Workload` record (another pod's record,
    // or another namespace's, is not read for it).
    let record = |ns: &str, owner: &str, name: &str, place: &str| {
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": name, "namespace": ns,
                            "ownerReferences": [{"kind": "Pod", "name": owner}]},
               "status": {"positionInClusterQueue": place}})
    };
    s.workloads = vec![
        record("other", "queued", "pod-queued", "1"),
        record("team", "queued-2", "pod-queued-2", "5"),
        record("team", "queued", "pod-queued", "4"),
    ];
    let (_, summary) = verdict(&diagnose(&s, "queued", None));
    assert_eq!(
        summary,
        format!(
            "quota: WaitingForQuota: {message} (position 4 in its ClusterQueue; Workload pod-queued)"
        )
    );
}

#[test]
fn whole_gpus_short_in_the_cluster_are_memory_and_scattered_ones_placement() {
    let s = snapshot(vec![pod("five", gpus(5)), pod("four", gpus(4))]);
    let (cause, summary) = verdict(&diagnose(&s, "five", None));
    assert_eq!(cause, Cause::Memory);
    assert!(
        summary.contains(
            "the pod asks 5 nvidia.com/gpu, the cluster has 4 nvidia.com/gpu free \
             (largest free 2 nvidia.com/gpu on gpu-a)"
        ),
        "{summary}"
    );
    let d = diagnose(&s, "four", None);
    let (cause, summary) = verdict(&d);
    assert_eq!(cause, Cause::Placement);
    assert!(
        summary.contains("4 nvidia.com/gpu free in total, but no node has 4 nvidia.com/gpu"),
        "{summary}"
    );
    assert_eq!(d.findings[0].cause, Cause::Quota);
    assert!(!d.findings[0].explains);
}

#[test]
fn nodes_with_room_ruled_out_by_taints_and_selectors_are_placement() {
    let mut picky = pod("picky", gpus(2));
    picky["spec"]["nodeSelector"] = json!({"pool": "train"});
    let s = snapshot(vec![picky, pod("plain", gpus(2))]);
    let d = diagnose(&s, "picky", None);
    let (cause, summary) = verdict(&d);
    assert_eq!(cause, Cause::Placement);
    assert!(
        summary.contains("every node with room is ruled out"),
        "{summary}"
    );
    let evidence = &d.verdict().unwrap().evidence;
    assert!(evidence.contains(&"gpu-a: node selector pool=train does not match".to_string()));
    assert!(evidence.contains(&"gpu-b: taint gpu=reserved:NoSchedule not tolerated".to_string()));

    // The same pod without the selector fits gpu-a: no cause, said as such.
    let d = diagnose(&s, "plain", None);
    assert!(d.verdict().is_none(), "{d:#?}");
    let last = d.findings.last().unwrap();
    assert!(
        last.summary
            .starts_with("no cause found: gpu-a may take it now"),
        "{}",
        last.summary
    );
}

#[test]
fn vgpu_pods_get_the_extenders_reason_or_fragmentation() {
    let vgpu = |name: &str, mib: &str| {
        let mut p = pod(
            name,
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib}),
        );
        p["spec"]["schedulerName"] = json!("tessera-scheduler");
        p
    };
    let s = snapshot(vec![
        vgpu("small", "4096"),
        vgpu("mid", "10240"),
        vgpu("huge", "40960"),
    ]);
    // 8 GiB free on each GPU: 4 GiB fits, and placement finds no obstacle.
    let d = diagnose(&s, "small", None);
    assert!(d.verdict().is_none(), "{d:#?}");
    assert!(d.findings[1]
        .summary
        .contains("its vGPUs fit on 2 node(s): v1, v2"));
    // 10 GiB: 32 GiB free in total, on no single GPU.
    let (cause, summary) = verdict(&diagnose(&s, "mid", None));
    assert_eq!(cause, Cause::Placement);
    assert_eq!(
        summary,
        "placement: 4 GPUs have 32768 MiB free in total, but no single GPU has 10240 MiB \
         (largest free 8192 MiB)"
    );
    // 40 GiB: more than is free in total: the extender's own reason.
    let d = diagnose(&s, "huge", None);
    let (cause, summary) = verdict(&d);
    assert_eq!(cause, Cause::Memory);
    assert!(summary.starts_with("memory: "), "{summary}");
    assert!(summary.contains("40960 MiB"), "{summary}");
    assert!(!d.verdict().unwrap().evidence.is_empty());
}

#[test]
fn a_running_pod_with_idle_gpus_is_the_app() {
    let s = snapshot(vec![]);
    let idle = Usage {
        utilization_percent: 4.0,
        window_seconds: 3 * 3600,
    };
    let (cause, summary) = verdict(&diagnose(&s, "train-a", Some(&idle)));
    assert_eq!(cause, Cause::App);
    assert_eq!(
        summary,
        "app: allocated 6 nvidia.com/gpu, used 4 % over the last 3.0 h: the job looks \
         input-bound or idle"
    );
    let busy = Usage {
        utilization_percent: 71.0,
        window_seconds: 3600,
    };
    assert!(diagnose(&s, "train-a", Some(&busy)).verdict().is_none());
    // Without a reading: nothing is claimed.
    let d = diagnose(&s, "train-a", None);
    assert!(d.verdict().is_none());
    assert!(d.findings[0].summary.contains("no utilization reading"));
}

#[test]
fn a_missing_pod_is_an_error_naming_it() {
    let e = diagnose_pod(
        &snapshot(vec![]),
        "team",
        "ghost",
        None,
        &Settings::default(),
        AT.parse().unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "pod team/ghost does not exist");
}

fn tessera(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_reads_snapshots_and_says_by_its_exit_code_whether_a_cause_was_found() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snap");
    std::fs::create_dir_all(&dir).unwrap();
    let s = snapshot(vec![pod("five", gpus(5)), pod("plain", gpus(2))]);
    std::fs::write(dir.join("snapshot.json"), serde_json::to_vec(&s).unwrap()).unwrap();
    let snap = dir.to_str().unwrap();

    let (code, out, _) = tessera(&["diagnose", "five", "-n", "team", "--snapshot", snap], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: memory"), "{out}");
    let (code, out, _) = tessera(
        &["diagnose", "plain", "-n", "team", "--snapshot", snap],
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("verdict: no cause found"), "{out}");
    let (code, out, _) = tessera(
        &[
            "diagnose",
            "--namespace",
            "team",
            "--snapshot",
            snap,
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(code, 2, "one of two has no cause: {out}");
    let all: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["pod"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["five", "plain"]);

    // Bad input: a missing pod, another snapshot version, nothing to diagnose.
    let (code, _, err) = tessera(
        &["diagnose", "ghost", "-n", "team", "--snapshot", snap],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("pod team/ghost does not exist"), "{err}");
    let mut other: Value = serde_json::to_value(&s).unwrap();
    other["format"] = json!("tessera.io/diagnose-snapshot/v0");
    std::fs::write(dir.join("snapshot.json"), other.to_string()).unwrap();
    let (code, _, err) = tessera(&["diagnose", "five", "-n", "team", "--snapshot", snap], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("is not the one this tessera reads"), "{err}");
    let (code, _, err) = tessera(&["diagnose", "--snapshot", snap], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("name a pod, or give --namespace"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_lists_the_cluster_and_the_snapshot_diagnoses_offline() {
    let api = support::apiserver::ApiServer::start("gpu-a").await;
    api.list_across_namespaces();
    api.put_object("/api/v1/namespaces/team/pods", pod("five", gpus(5)));
    // A pod waiting for quota and its `Workload` record, listed across namespaces.
    let mut queued = pod("queued", gpus(1));
    queued["spec"]["schedulingGates"] = json!([{"name": "tessera.io/admission"}]);
    queued["status"]["conditions"] = json!([{"type": "tessera.io/Admitted", "status": "False",
        "reason": "WaitingForQuota", "message": "insufficient unused quota"}]);
    api.put_object("/api/v1/namespaces/team/pods", queued);
    api.put_object(
        "/apis/tessera.io/v1alpha1/namespaces/team/workloads",
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": "pod-queued", "namespace": "team",
                            "ownerReferences": [{"kind": "Pod", "name": "queued"}]},
               "spec": {}, "status": {"positionInClusterQueue": "11-20"}}),
    );
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = support::dra_agent::kubeconfig(tmp.path(), &api.url);
    let out_dir = tmp.path().join("dump");
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();
    let out = out_dir.to_str().unwrap().to_string();
    let (code, stdout, err) = tokio::task::spawn_blocking(move || {
        tessera(
            &["diagnose", "dump", "--out", &out],
            &[("KUBECONFIG", &kubeconfig)],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("2 pods"), "{stdout}");
    let snapshot =
        Snapshot::from_json(&std::fs::read(out_dir.join("snapshot.json")).unwrap()).unwrap();
    assert_eq!(snapshot.nodes.len(), 1);
    let d = diagnose(&snapshot, "five", None);
    // The double's node has no GPUs: 5 asked, none free.
    assert_eq!(verdict(&d).0, Cause::Memory);
    // The records were listed with the pods: the waiting pod's place is in the dump.
    assert_eq!(snapshot.workloads.len(), 1);
    let (cause, summary) = verdict(&diagnose(&snapshot, "queued", None));
    assert_eq!(cause, Cause::Quota);
    assert_eq!(
        summary,
        "quota: WaitingForQuota: insufficient unused quota (position 11-20 in its ClusterQueue; Workload pod-queued)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_step_reads_utilization_from_a_real_prometheus() {
    use support::prometheus::{Exporter, Prometheus};
    let exporter = Exporter::start().await;
    // DCGM exporter's gauge for train-a's GPUs: 3 % and 5 % busy; nothing for train-b.
    exporter.set(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
         DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",namespace=\"team\",pod=\"train-a\"} 3\n\
         DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",namespace=\"team\",pod=\"train-a\"} 5\n",
    );
    let Some(mut prom) = Prometheus::start(&exporter).await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snap");
    std::fs::create_dir_all(&dir).unwrap();
    // The snapshot is taken "now": the window reaches back into Prometheus's samples.
    let mut s = snapshot(vec![]);
    s.taken_at = k8s_openapi::jiff::Timestamp::now().to_string();
    std::fs::write(dir.join("snapshot.json"), serde_json::to_vec(&s).unwrap()).unwrap();
    let snap = dir.to_str().unwrap().to_string();
    let url = prom.url.clone();
    let run = move |pod: &'static str| {
        let (snap, url) = (snap.clone(), url.clone());
        tokio::task::spawn_blocking(move || {
            tessera(
                &[
                    "diagnose",
                    pod,
                    "-n",
                    "team",
                    "--snapshot",
                    &snap,
                    "--prometheus",
                    &url,
                    "--window-seconds",
                    "60",
                ],
                &[],
            )
        })
    };
    // Prometheus scrapes every second: wait for the first samples.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (code, out, err) = loop {
        let (code, out, err) = run("train-a").await.unwrap();
        if code == 0 || std::time::Instant::now() > deadline {
            break (code, out, err);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("app: allocated 6 nvidia.com/gpu, used 4 % over the last 1 min"),
        "{out}"
    );
    // No series for train-b: said, not read as 0 %.
    let (code, out, err) = run("train-b").await.unwrap();
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("has no GPU utilization for team/train-b"),
        "{err}"
    );
    // Prometheus down: an error naming it, exit 1.
    prom.stop();
    let (code, _, err) = run("train-a").await.unwrap();
    assert_eq!(code, 1);
    assert!(err.contains(&format!("Prometheus {}", prom.url)), "{err}");
}

#[test]
fn top_prints_allocated_against_allocatable_per_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snap");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("snapshot.json"),
        serde_json::to_vec(&snapshot(vec![])).unwrap(),
    )
    .unwrap();
    let (code, out, err) = tessera(&["top", "--snapshot", dir.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    let line = |node: &str| {
        out.lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} in {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // gpu-a: 8 GPUs, 6 taken (the finished pod holds nothing).
    assert_eq!(line("gpu-a")[1..4], ["8", "6", "2"]);
    // v1: split mode, 2 × 72 GiB of its 2 × 80 GiB booked.
    assert_eq!(line("v1")[4..], ["144/160", "GiB"]);
    assert!(
        out.contains("4 nodes, 16 of 56 GPUs allocated (28.6 %)"),
        "{out}"
    );
    let (code, out, _) = tessera(&["top", "--snapshot", dir.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 0);
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["node"], "gpu-a");
    assert_eq!(rows[0]["allocated"], 6);
}

/// `tessera top --gpus` / `--containers` against a real Prometheus scraping the node
/// agents' gauges: the GPU lines add up their containers' shares, a missing gauge is "–"
/// (not 0), `--node` narrows, and a Prometheus without the agents' series says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_per_gpu_and_container_reads_the_agents_gauges() {
    use support::prometheus::{Exporter, Prometheus};
    let exporter = Exporter::start().await;
    let gib = 1u64 << 30;
    exporter.set(&format!(
        "# TYPE tessera_gpu_memory_used_bytes gauge\n\
         tessera_gpu_memory_used_bytes{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\"}} {}\n\
         tessera_gpu_memory_used_bytes{{node=\"n2\",gpu=\"GPU-9\",model=\"L4\",mode=\"whole\"}} 0\n\
         # TYPE tessera_gpu_memory_total_bytes gauge\n\
         tessera_gpu_memory_total_bytes{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\"}} {}\n\
         tessera_gpu_memory_total_bytes{{node=\"n2\",gpu=\"GPU-9\",model=\"L4\",mode=\"whole\"}} {}\n\
         # TYPE tessera_gpu_utilization_ratio gauge\n\
         tessera_gpu_utilization_ratio{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\"}} 0.42\n\
         # TYPE tessera_container_gpu_allocated_share gauge\n\
         tessera_container_gpu_allocated_share{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\",namespace=\"ml\",pod=\"a\",container=\"c\",queue=\"\"}} 0.25\n\
         tessera_container_gpu_allocated_share{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\",namespace=\"ml\",pod=\"b\",container=\"c\",queue=\"\"}} 0.5\n\
         # TYPE tessera_container_gpu_busy_ratio gauge\n\
         tessera_container_gpu_busy_ratio{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\",namespace=\"ml\",pod=\"a\",container=\"c\",queue=\"\"}} 0.9\n\
         # TYPE tessera_container_gpu_memory_used_bytes gauge\n\
         tessera_container_gpu_memory_used_bytes{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\",namespace=\"ml\",pod=\"a\",container=\"c\",queue=\"\"}} {}\n\
         # TYPE tessera_container_gpu_memory_limit_bytes gauge\n\
         tessera_container_gpu_memory_limit_bytes{{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"vgpu\",namespace=\"ml\",pod=\"a\",container=\"c\",queue=\"\"}} {}\n",
        10 * gib,
        80 * gib,
        24 * gib,
        4 * gib,
        16 * gib
    ));
    let Some(mut prom) = Prometheus::start(&exporter).await else {
        return;
    };
    let url = prom.url.clone();
    let top = move |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tessera(&args, &[])
        })
    };
    let with = |extra: &[&str]| -> Vec<String> {
        ["top", "--prometheus", url.as_str()]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    // Prometheus scrapes every second: wait for the first samples.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let out = loop {
        let (code, out, err) = top(with(&["--gpus"])).await.unwrap();
        if (code == 0 && out.contains("GPU-9")) || std::time::Instant::now() > deadline {
            assert_eq!(code, 0, "{out}{err}");
            break out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let line = |out: &str, key: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("{key} in {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    // n1's GPU: 0.75 given out to 2 containers, 10 of 80 GiB used, 42 % busy.
    assert_eq!(
        line(&out, "GPU-0"),
        [
            "n1",
            "GPU-0",
            "H100-80GB",
            "vgpu",
            "0.75",
            "2",
            "10.0/80.0",
            "GiB",
            "42"
        ]
    );
    // n2's: nothing given out, no utilization series: "–", not 0.
    assert_eq!(
        line(&out, "GPU-9")[4..],
        ["0.00", "0", "0.0/24.0", "GiB", "–"]
    );
    let (code, out, _) = top(with(&["--containers"])).await.unwrap();
    assert_eq!(code, 0, "{out}");
    assert_eq!(line(&out, "ml/a")[5..], ["0.25", "90", "4.0/16.0", "GiB"]);
    assert_eq!(line(&out, "ml/b")[5..], ["0.50", "–", "–/–", "GiB"]);
    let (code, out, _) = top(with(&["--gpus", "--node", "n2", "--json"]))
        .await
        .unwrap();
    assert_eq!(code, 0);
    let rows: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["gpu"], "GPU-9");
    // A node no agent reports: said, exit 1.
    let (code, _, err) = top(with(&["--gpus", "--node", "nowhere"])).await.unwrap();
    assert_eq!(code, 1);
    assert!(
        err.contains("no tessera_gpu_memory_used_bytes series"),
        "{err}"
    );
    // Without --prometheus: a usage error from the flags.
    let (code, _, err) = top(vec!["top".into(), "--gpus".into()]).await.unwrap();
    assert_eq!(code, 2, "{err}");
    prom.stop();
}
