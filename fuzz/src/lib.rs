//! The fuzz targets' bodies: one function per input format Tessera reads from outside,
//! each taking the raw bytes a file, a request or a flag would carry.
//!
//! What a target asserts: the parser returns (`Ok` or a clear `Err`) without panicking or
//! aborting, quickly (hack/fuzz.sh runs libFuzzer with `-timeout=1`: no input may take a
//! second). Where a format has an encoder, what it accepts must also survive an
//! encode → decode round trip unchanged.
//!
//! `fuzz_targets/<name>.rs` wraps each function for libFuzzer (`cargo fuzz run <name>`).

use std::collections::{BTreeMap, HashMap};

use tessera::agent::split_record;
use tessera::controller::webhook;
use tessera::dra::checkpoint;
use tessera::dra::sharing;
use tessera::gpu::GpuBackend;

/// Every target by name, for tools that drive them all.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("layout_config", layout_config),
    ("fake_inventory", fake_inventory),
    ("plan_file", plan_file),
    ("simulate_csv", simulate_csv),
    ("admission_review", admission_review),
    ("dra_checkpoint", dra_checkpoint),
    ("split_record", split_record),
    ("gpu_config", gpu_config),
    ("shim_limits", shim_limits),
    ("extender", extender),
    ("prometheus_answer", prometheus_answer),
    ("pod_views", pod_views),
];

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A named layout config (the ConfigMap's `config.yaml` or a named entry).
pub fn layout_config(data: &[u8]) {
    if let Some(yaml) = text(data) {
        let _ = tessera::partition::config::parse_config("fuzz", yaml);
    }
}

/// `--fake-gpus`: a spec string (`8xH100-80GB,1xL4`) or an inventory YAML file; an
/// inventory that parses is also listed, as the agent does at start.
pub fn fake_inventory(data: &[u8]) {
    let Some(text) = text(data) else { return };
    if let Ok(backend) = tessera::gpu::fake::FakeBackend::from_spec(text) {
        let _ = backend.inventory();
    }
    if let Ok(backend) = tessera::gpu::fake::FakeBackend::from_yaml(text) {
        let _ = backend.inventory();
    }
}

/// A `tessera plan -f` scenario file (multi-document YAML).
pub fn plan_file(data: &[u8]) {
    if let Some(text) = text(data) {
        let _ = tessera::quota::scenario::Scenario::parse(text);
    }
}

/// `tessera simulate` trace CSVs: the same text as a node list, a pod list, a DLRM
/// instance list, a training task list and an Azure LLM request trace.
pub fn simulate_csv(data: &[u8]) {
    if let Some(text) = text(data) {
        let _ = tessera::sim::trace::parse_node_list(text, "nodes.csv");
        let _ = tessera::sim::trace::parse_pod_list(text, "pods.csv");
        use tessera::sim::fleet::demand;
        let _ = demand::parse_services(text, "dlrm.csv");
        let _ = demand::parse_tasks(text, "pods.csv");
        if let Ok(minutes) = demand::parse_llm_tokens_per_minute(text, "llm.csv") {
            let s = demand::llm_service("llm", &minutes, 64, 0.2, 2 * 86_400_000);
            assert!(s.peak(2 * 86_400_000) <= 64, "an LLM service above its peak");
        }
    }
}

/// An AdmissionReview request body, as the webhook server hands it over after JSON
/// decoding; answered without and with known priority classes, and by the vGPU pod
/// webhook in both modes.
pub fn admission_review(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(answer) = webhook::review(&body, None, webhook::Options::default()) {
        let _ = webhook::to_json(&answer);
    }
    let classes = BTreeMap::from([("high".to_string(), 1000), ("low".to_string(), -10)]);
    let _ = webhook::review(&body, Some(&classes), webhook::Options::default());
    // The vGPU pod webhook, in extender and DRA mode.
    use tessera::controller::vgpu_webhook::{self, VgpuMode, VgpuOptions};
    for mode in [VgpuMode::Extender, VgpuMode::Dra] {
        let options = VgpuOptions {
            mode,
            ..VgpuOptions::default()
        };
        let _ = vgpu_webhook::review(&body, &options);
    }
}

/// The DRA driver's checkpoint: the snapshot file, the log file that continues it, and
/// (when the input is a JSON `Data`) the snapshot round trip and the start-up recovery;
/// and the kubelet's DRA checkpoint (`dra_manager_state`) the vGPU guard reads.
pub fn dra_checkpoint(data: &[u8]) {
    let _ = checkpoint::decode_snapshot("fuzz", data);
    // The kubelet's own DRA checkpoint, which the vGPU guard reads.
    let _ = tessera::agent::vgpu_guard::kubelet_claim_pods(data);
    if let Ok(parsed) = checkpoint::log::parse(data) {
        let mut state = checkpoint::Data::default();
        checkpoint::log::apply(&mut state, parsed.ops);
    }
    if let Ok(content) = serde_json::from_slice::<checkpoint::Data>(data) {
        let bytes = checkpoint::encode(&content).expect("a decoded checkpoint encodes");
        let back = checkpoint::decode("fuzz", &bytes).expect("an encoded checkpoint decodes");
        assert_eq!(back, content, "checkpoint round trip changed the content");
        let _ = checkpoint::recover(content, "boot-id");
    }
}

/// The DRA/device-plugin split record, and its round trip.
pub fn split_record(data: &[u8]) {
    let _ = split_record::decode("fuzz", data);
    if let Ok(record) = serde_json::from_slice::<split_record::Recorded>(data) {
        let bytes = split_record::encode(&record).expect("a decoded record encodes");
        let back = split_record::decode("fuzz", &bytes).expect("an encoded record decodes");
        assert_eq!(back, record, "split record round trip changed the content");
    }
}

/// A ResourceClaim's opaque `GpuConfig` parameters (`gpu.tessera.io/v1alpha1`).
pub fn gpu_config(data: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = sharing::parse_parameters(&value);
    }
}

/// The CUDA shim's limits: the agent-written limits file (`/etc/tessera/limits`), and the
/// same bytes as `KEY=VALUE` environment variables for the shim's config parser (the limit
/// variables, the core policy, the shared cache path), each value through the size parser.
pub fn shim_limits(data: &[u8]) {
    let _ = tessera_cuda::source::parse_file("fuzz", data);
    let Some(text) = text(data) else { return };
    let vars: HashMap<&str, &str> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .collect();
    let _ = tessera_cuda::config::Config::parse(|k| vars.get(k).map(|v| v.to_string()));
    let _ = tessera_cuda::config::Config::check_indices(vars.keys().copied());
    for (k, v) in &vars {
        let _ = tessera_cuda::config::parse_size(k, v);
    }
}

/// The scheduler extender's inputs: `ExtenderArgs` (the pod's vGPU request read with
/// HAMi's semantics, the candidate names), `ExtenderBindingArgs`, and the records it reads
/// from Nodes and Pods (`tessera.io/vgpu-devices`, `tessera.io/vgpu-assignment`).
pub fn extender(data: &[u8]) {
    use tessera::controller::extender::{records, wire};
    if let Ok(args) = serde_json::from_slice::<wire::ExtenderArgs>(data) {
        let _ = tessera::vgpu::request::pod_request(&args.pod, &Default::default());
        let _ = args.node_names();
    }
    let _ = serde_json::from_slice::<wire::ExtenderBindingArgs>(data);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = records::node_state(&value);
        let _ = records::pod_assignment(&value);
        let _ = records::pod_host(&value);
    }
}

/// A Prometheus server's answer to an instant query (any status, any body), as the
/// autoscaler's triggers read it.
pub fn prometheus_answer(data: &[u8]) {
    let status = data
        .first()
        .map_or(200, |b| if b % 2 == 0 { 200 } else { 400 });
    let _ = tessera::prometheus::decode_instant(status, data.get(1..).unwrap_or_default());
}

/// A Pod as a tenant writes it (spec, annotations, status), through what the node agent
/// and `tessera diagnose` read from it: the slot binder checks the pod's own assignment
/// annotation against its own request for each of its vGPU containers, and diagnose walks
/// a snapshot holding it. A snapshot file itself is read back too.
pub fn pod_views(data: &[u8]) {
    use k8s_openapi::api::core::v1::Pod;
    use tessera::diagnose::{diagnose_pod, Settings, Snapshot};
    use tessera::vgpu::record::ASSIGNMENT_ANNOTATION;
    use tessera::vgpu::slots::{bind, Holder, SlotGpu};
    let _ = Snapshot::from_json(data);
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let gpus: Vec<SlotGpu> = (0..2)
        .map(|i| SlotGpu {
            uuid: format!("GPU-{i}"),
            minor: i,
            memory_mib: 81_920,
            healthy: true,
        })
        .collect();
    if let Ok(pod) = serde_json::from_value::<Pod>(value.clone()) {
        let annotation = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
            .map(String::as_str);
        let request = tessera::vgpu::request::pod_request(&pod, &Default::default());
        for c in request.ok().flatten().iter().flat_map(|r| &r.containers) {
            let holder = Holder {
                namespace: "ns".into(),
                pod: "p".into(),
                container: c.name.clone(),
                resource: "nvidia.com/gpu".into(),
                device_ids: (0..c.count.min(64)).map(|i| format!("GPU-0::s{i}")).collect(),
            };
            let _ = bind(&holder, annotation, Some(c), "n1", &gpus);
        }
    }
    let at = "2026-12-03T12:00:00Z".parse().unwrap_or_default();
    let node = serde_json::json!({"metadata": {"name": "n1"},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}}});
    let (ns, name) = (
        value["metadata"]["namespace"].as_str().unwrap_or("").to_string(),
        value["metadata"]["name"].as_str().unwrap_or("").to_string(),
    );
    let snapshot = Snapshot::new(vec![node], vec![value], at);
    let _ = diagnose_pod(&snapshot, &ns, &name, None, &Settings::default(), at);
}
