use super::*;
use serde_json::{json, Value};

/// A pod from its JSON shape: `containers` are app containers, `annotations` as given.
fn pod(annotations: Value, containers: Value) -> Pod {
    pod_with_init(annotations, json!([]), containers)
}

fn pod_with_init(annotations: Value, init: Value, containers: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "uid": "u-1", "annotations": annotations},
        "spec": {"initContainers": init, "containers": containers},
    }))
    .expect("a Pod")
}

fn limits(name: &str, limits: Value) -> Value {
    json!({"name": name, "resources": {"limits": limits}})
}

fn app(count: u32, memory: MemoryRequest, cores: u32) -> ContainerRequest {
    ContainerRequest {
        name: "main".into(),
        kind: ContainerKind::App,
        count,
        memory,
        cores,
    }
}

fn only(request: Option<PodRequest>) -> ContainerRequest {
    let request = request.expect("a vGPU request");
    assert_eq!(request.containers.len(), 1);
    request.containers[0].clone()
}

#[test]
fn hami_examples_give_hami_requests() {
    // (case, limits of container "main", expected request)
    let cases = [
        (
            "the issue's pod",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"}),
            app(1, MemoryRequest::Mib(10_240), 30),
        ),
        (
            "only nvidia.com/gpu: the whole memory, no cores",
            json!({"nvidia.com/gpu": "2"}),
            app(2, MemoryRequest::Percent(100), 0),
        ),
        (
            "gpumem-percentage",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}),
            app(1, MemoryRequest::Percent(25), 0),
        ),
        (
            "gpucores 100: exclusive",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}),
            app(1, MemoryRequest::Percent(100), 100),
        ),
        (
            "a canonical quantity (20k MiB)",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20k"}),
            app(1, MemoryRequest::Mib(20_000), 0),
        ),
    ];
    for (name, limits_json, want) in cases {
        let p = pod(json!({}), json!([limits("main", limits_json)]));
        let got = only(pod_request(&p, &RequestConfig::default()).expect(name));
        assert_eq!(got, want, "{name}");
        assert_eq!(got.exclusive(), want.cores == 100, "{name}");
    }
}

#[test]
fn requests_count_when_limits_are_absent() {
    let c = json!({"name": "main", "resources": {"requests":
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}}});
    let got = only(pod_request(&pod(json!({}), json!([c])), &RequestConfig::default()).unwrap());
    assert_eq!(got, app(1, MemoryRequest::Mib(4_096), 0));
}

#[test]
fn configured_defaults_apply() {
    let config = RequestConfig {
        default_memory_mib: 8_192,
        default_cores: 20,
        default_gpu_count: Some(1),
        ..RequestConfig::default()
    };
    let p = pod(
        json!({}),
        json!([limits("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    let got = only(pod_request(&p, &config).unwrap());
    assert_eq!(got, app(1, MemoryRequest::Mib(8_192), 20));
    // With a default count, gpumem alone is a 1-vGPU request, as in HAMi.
    let p = pod(
        json!({}),
        json!([limits("main", json!({"nvidia.com/gpumem": "1024"}))]),
    );
    let got = only(pod_request(&p, &config).unwrap());
    assert_eq!(got, app(1, MemoryRequest::Mib(1_024), 20));
}

#[test]
fn another_prefix_names_other_resources() {
    let config = RequestConfig {
        prefix: "example.com".into(),
        ..RequestConfig::default()
    };
    let nvidia = pod(
        json!({}),
        json!([limits("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    assert_eq!(pod_request(&nvidia, &config).unwrap(), None);
    let other = pod(
        json!({}),
        json!([limits(
            "main",
            json!({"example.com/gpu": "1", "example.com/gpucores": "50"})
        )]),
    );
    assert_eq!(
        only(pod_request(&other, &config).unwrap()),
        app(1, MemoryRequest::Percent(100), 50)
    );
}

#[test]
fn pods_without_vgpus_have_no_request() {
    let cases = [
        json!([{"name": "main"}]),
        json!([limits("main", json!({"cpu": "1", "memory": "1Gi"}))]),
        json!([limits("main", json!({"nvidia.com/gpu": "0"}))]),
    ];
    for containers in cases {
        let p = pod(json!({}), containers.clone());
        assert_eq!(
            pod_request(&p, &RequestConfig::default()),
            Ok(None),
            "{containers}"
        );
        assert!(!carries_vgpu_resources(
            &p,
            &ResourceNames::new("nvidia.com")
        ));
    }
    // A pod without vGPUs keeps whatever annotations it has.
    let p = pod(
        json!({GPU_POLICY: "whatever", USE_GPUTYPE: ""}),
        json!([{"name": "main"}]),
    );
    assert_eq!(pod_request(&p, &RequestConfig::default()), Ok(None));
}

#[test]
fn every_container_is_its_own_request_init_containers_first() {
    let p = pod_with_init(
        json!({}),
        json!([
            limits("warmup", json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"})),
            {"name": "proxy", "restartPolicy": "Always",
             "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10"}}},
        ]),
        json!([
            limits("main", json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2048"})),
            {"name": "logger"},
        ]),
    );
    let request = pod_request(&p, &RequestConfig::default()).unwrap().unwrap();
    let summary: Vec<(&str, ContainerKind, u32)> = request
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.kind, c.count))
        .collect();
    assert_eq!(
        summary,
        [
            ("warmup", ContainerKind::Init, 1),
            ("proxy", ContainerKind::Sidecar, 1),
            ("main", ContainerKind::App, 2),
        ]
    );
    assert_eq!(request.vgpus(), 4);
}

#[test]
fn annotations_give_selectors_and_policies() {
    let p = pod(
        json!({
            USE_GPUTYPE: "A100, H100",
            NOUSE_GPUTYPE: "MIG",
            USE_GPUUUID: "GPU-1,GPU-2,GPU-3",
            NOUSE_GPUUUID: "GPU-3",
            GPU_POLICY: "binpack",
            NODE_POLICY: "spread",
        }),
        json!([limits("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    let request = pod_request(&p, &RequestConfig::default()).unwrap().unwrap();
    assert_eq!(request.gpu_policy, Some(Policy::Binpack));
    assert_eq!(request.node_policy, Some(Policy::Spread));
    let s = &request.selectors;
    assert_eq!(s.use_types, ["A100", "H100"]);
    // (uuid, model, allowed)
    let cases = [
        ("GPU-1", "NVIDIA A100-SXM4-80GB", true),
        ("GPU-2", "nvidia h100 80gb hbm3", true),
        ("GPU-2", "NVIDIA L40S", false),
        ("GPU-1", "NVIDIA A100 MIG 1g.10gb", false),
        ("GPU-3", "NVIDIA A100", false),
        ("GPU-9", "NVIDIA A100", false),
    ];
    for (uuid, model, allowed) in cases {
        assert_eq!(s.allows(uuid, model), allowed, "{uuid} {model}");
    }
    // By model alone, the UUID lists aside.
    let by_model = [
        ("NVIDIA A100", true),
        ("NVIDIA A100 MIG 1g.10gb", false),
        ("NVIDIA L40S", false),
    ];
    for (model, allowed) in by_model {
        assert_eq!(s.allows_model(model), allowed, "{model}");
    }
}

#[test]
fn policies_default_to_the_engines_own_or_as_configured() {
    let p = pod(
        json!({}),
        json!([limits("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    let request = pod_request(&p, &RequestConfig::default()).unwrap().unwrap();
    assert_eq!((request.gpu_policy, request.node_policy), (None, None));
    assert!(!request.selectors.is_set());
    let hamis = RequestConfig {
        default_gpu_policy: Some(Policy::Spread),
        default_node_policy: Some(Policy::Binpack),
        ..RequestConfig::default()
    };
    let request = pod_request(&p, &hamis).unwrap().unwrap();
    assert_eq!(
        (request.gpu_policy, request.node_policy),
        (Some(Policy::Spread), Some(Policy::Binpack))
    );
}

#[test]
fn bad_input_is_a_specific_error() {
    let gpu1 = |extra: Value| {
        let mut l = json!({"nvidia.com/gpu": "1"});
        for (k, v) in extra.as_object().unwrap() {
            l[k] = v.clone();
        }
        l
    };
    // (case, annotations, limits of container "main", the whole message)
    let cases = [
        (
            "cores above 100",
            json!({}),
            gpu1(json!({"nvidia.com/gpucores": "150"})),
            "container \"main\": nvidia.com/gpucores is 150, above 100 (% of the GPU's SMs)",
        ),
        (
            "percentage and memory",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem": "1024", "nvidia.com/gpumem-percentage": "50"})),
            "container \"main\": nvidia.com/gpumem and nvidia.com/gpumem-percentage together; ask for one of them",
        ),
        (
            "memory without a count",
            json!({}),
            json!({"nvidia.com/gpumem": "1024"}),
            "container \"main\": nvidia.com/gpumem without nvidia.com/gpu; add nvidia.com/gpu: 1 (HAMi adds it silently, Tessera asks you to write it)",
        ),
        (
            "cores with a zero count",
            json!({}),
            json!({"nvidia.com/gpu": "0", "nvidia.com/gpucores": "10"}),
            "container \"main\": nvidia.com/gpu is 0 but nvidia.com/gpucores is set; ask for at least 1",
        ),
        (
            "fractional count",
            json!({}),
            json!({"nvidia.com/gpu": "500m"}),
            "container \"main\": nvidia.com/gpu \"500m\" is not a whole number",
        ),
        (
            "fractional memory",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem": "0.5"})),
            "container \"main\": nvidia.com/gpumem \"0.5\" is not a whole number",
        ),
        (
            "negative cores",
            json!({}),
            gpu1(json!({"nvidia.com/gpucores": "-10"})),
            "container \"main\": nvidia.com/gpucores \"-10\" is negative",
        ),
        (
            "not a quantity",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem": "lots"})),
            "container \"main\": nvidia.com/gpumem \"lots\" is not a quantity (missing number)",
        ),
        (
            "memory with a binary unit",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem": "10Gi"})),
            "container \"main\": nvidia.com/gpumem \"10Gi\" has a unit; it counts MiB (write 10240 for 10 GiB)",
        ),
        (
            "zero memory",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem": "0"})),
            "container \"main\": nvidia.com/gpumem is 0; leave it out to get the default memory",
        ),
        (
            "percentage 0",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem-percentage": "0"})),
            "container \"main\": nvidia.com/gpumem-percentage is 0, not between 1 and 100",
        ),
        (
            "percentage 101",
            json!({}),
            gpu1(json!({"nvidia.com/gpumem-percentage": "101"})),
            "container \"main\": nvidia.com/gpumem-percentage is 101, not between 1 and 100",
        ),
        (
            "absurd count",
            json!({}),
            json!({"nvidia.com/gpu": "1M"}),
            "container \"main\": nvidia.com/gpu is 1000000, more than 1024",
        ),
        (
            "unknown gpu policy",
            json!({GPU_POLICY: "topology-aware"}),
            gpu1(json!({})),
            "annotation hami.io/gpu-scheduler-policy: \"topology-aware\" is not a policy (binpack or spread)",
        ),
        (
            "unknown node policy",
            json!({NODE_POLICY: "Binpack"}),
            gpu1(json!({})),
            "annotation hami.io/node-scheduler-policy: \"Binpack\" is not a policy (binpack or spread)",
        ),
        (
            "empty type list",
            json!({USE_GPUTYPE: ""}),
            gpu1(json!({})),
            "annotation nvidia.com/use-gputype: \"\" lists nothing; remove the annotation or name at least one",
        ),
        (
            "empty uuid entry",
            json!({NOUSE_GPUUUID: "GPU-1,,GPU-2"}),
            gpu1(json!({})),
            "annotation nvidia.com/nouse-gpuuuid: \"GPU-1,,GPU-2\" has an empty entry",
        ),
    ];
    for (name, annotations, limits_json, message) in cases {
        let p = pod(annotations, json!([limits("main", limits_json)]));
        let err = pod_request(&p, &RequestConfig::default())
            .expect_err(name)
            .to_string();
        assert_eq!(err, message, "{name}");
    }
}

#[test]
fn the_webhook_checks_only_pods_with_vgpu_shares() {
    let names = ResourceNames::new(DEFAULT_PREFIX);
    let whole = pod(
        json!({}),
        json!([limits("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    assert!(!carries_vgpu_resources(&whole, &names));
    let init_share = pod_with_init(
        json!({}),
        json!([limits("init", json!({"nvidia.com/gpucores": "10"}))]),
        json!([{"name": "main"}]),
    );
    assert!(carries_vgpu_resources(&init_share, &names));
}

#[test]
fn percentages_round_down_like_hami() {
    assert_eq!(MemoryRequest::Percent(25).mib_on(40_960), 10_240);
    assert_eq!(MemoryRequest::Percent(33).mib_on(1_000), 330);
    assert_eq!(MemoryRequest::Percent(1).mib_on(99), 0);
    assert_eq!(MemoryRequest::Mib(512).mib_on(99), 512);
}
