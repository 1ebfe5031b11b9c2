//! The device-plugin flow end to end over real unix sockets: registration, ListAndWatch,
//! Allocate, GetPreferredAllocation, kubelet restarts and shutdown.

mod support;

use std::time::{Duration, Instant};

use support::agent::AgentBuilder;
use support::kubelet::Kubelet;
use tessera::gpu::GpuBackend;
use tessera::proto::deviceplugin as pb;

const MIXED: &str = r#"
version: v1
flags: { migStrategy: mixed }
tessera:
  gpus:
  - match: { index: [0] }
    mode: mig
    mig: { layout: all-1g.10gb }
  - match: { index: [1] }
    mode: timeslice
    timeslice: { replicas: 4 }
"#;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_every_resource_to_the_kubelet() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config(MIXED)
        .root(tmp.path().to_path_buf())
        .start();

    let mig = kubelet.devices("nvidia.com/mig-1g.10gb").await;
    assert_eq!(mig.len(), 7);
    assert!(mig.iter().all(|d| d.health == "Healthy"));
    assert!(mig.iter().all(|d| d.id.starts_with("MIG-")));
    assert_eq!(mig[0].topology.as_ref().unwrap().nodes[0].id, 0);
    let gpu = kubelet.devices("nvidia.com/gpu").await;
    assert_eq!(gpu.len(), 4, "GPU 1 as 4 replicas");
    assert!(gpu
        .iter()
        .all(|d| d.id.ends_with(&format!("::{}", &d.id[d.id.len() - 1..]))));
    let st = kubelet.state("nvidia.com/gpu").unwrap();
    assert!(st.options.unwrap().get_preferred_allocation_available);
    assert_eq!(kubelet.resources().len(), 2);

    // Allocate a MIG device: visible device, CDI name, and the CDI spec that defines it.
    let mut client = kubelet.client("nvidia.com/mig-1g.10gb").await;
    let resp = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![mig[3].id.clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], mig[3].id);
    // Its GPU-instance and compute-instance access nodes (driver table: 3 + 135 x GPU
    // minor + 9 x GI id; the compute instance's 1 + CI id after it).
    let inv = agent.backend.inventory().unwrap();
    let (parent, m) = inv
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(move |m| (g, m)))
        .find(|(_, m)| m.uuid == mig[3].id)
        .unwrap();
    let gi_minor = 3 + 135 * parent.minor + 9 * m.gi_id;
    let caps: Vec<(&str, &str, &str)> = c
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    let gi = format!("/dev/nvidia-caps/nvidia-cap{gi_minor}");
    let ci = format!("/dev/nvidia-caps/nvidia-cap{}", gi_minor + 1 + m.ci_id);
    assert_eq!(
        caps,
        vec![
            (gi.as_str(), gi.as_str(), "rw"),
            (ci.as_str(), ci.as_str(), "rw")
        ]
    );
    assert_eq!(
        c.cdi_devices[0].name,
        format!("tessera.io/gpu={}", mig[3].id)
    );
    let spec = std::fs::read_to_string(agent.cdi_root.join("tessera.io-gpu.json")).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(spec["kind"], "tessera.io/gpu");
    assert!(spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["name"] == mig[3].id.as_str()));

    // Unknown IDs are refused with a clear error, nothing allocated.
    let err = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec!["MIG-nope".into()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("unknown device \"MIG-nope\""),
        "{}",
        err.message()
    );

    // Without the driver's MIG capability table a MIG device is refused, naming it.
    let table = agent
        .cdi_root
        .parent()
        .unwrap()
        .join("proc/driver/nvidia-caps/mig-minors");
    std::fs::remove_file(&table).unwrap();
    let err = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![mig[3].id.clone()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains(&mig[3].id) && err.message().contains("mig-minors"),
        "{}",
        err.message()
    );

    // Preferred allocation of replicas.
    let mut client = kubelet.client("nvidia.com/gpu").await;
    let ids: Vec<String> = gpu.iter().map(|d| d.id.clone()).collect();
    let pref = client
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.clone(),
                must_include_device_i_ds: vec![ids[2].clone()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let chosen = &pref.container_responses[0].device_i_ds;
    assert_eq!(chosen.len(), 2);
    assert_eq!(chosen[0], ids[2]);
    let bad = client
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: -1,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vgpu_allocation_writes_read_only_limits_and_refuses_without_the_shim() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("1xH100-80GB")
        .config("tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 4, memory: 16g, cores: 25 } } ] }")
        .root(tmp.path().to_path_buf())
        .start();
    let devs = kubelet.devices("nvidia.com/vgpu").await;
    assert!(agent.events.0.lock().unwrap().is_empty());
    assert_eq!(devs.len(), 4);
    let mut client = kubelet.client("nvidia.com/vgpu").await;
    let request = |id: &str| pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest {
            devices_ids: vec![id.to_string()],
        }],
    };
    let resp = client
        .allocate(request(&devs[0].id))
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    // The HAMi-core variables stay for tools; the shim reads the read-only limits file.
    assert_eq!(c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "16384m");
    assert_eq!(c.envs["CUDA_DEVICE_SM_LIMIT_0"], "25");
    assert!(!c.envs.contains_key("LD_PRELOAD"), "preloaded by file");
    let mount = |path: &str| {
        c.mounts
            .iter()
            .find(|m| m.container_path == path)
            .unwrap_or_else(|| panic!("no mount at {path}: {:?}", c.mounts))
    };
    let limits = mount("/etc/tessera");
    assert!(limits.read_only);
    let alloc_dir = std::path::Path::new(&limits.host_path);
    assert!(alloc_dir.starts_with(&agent.state_dir));
    let text = std::fs::read_to_string(alloc_dir.join("limits")).unwrap();
    assert!(
        text.contains("CUDA_DEVICE_MEMORY_LIMIT_0=16384m\n"),
        "{text}"
    );
    assert!(text.contains("CUDA_DEVICE_SM_LIMIT_0=25\n"), "{text}");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&alloc_dir.join("limits")), 0o444);
    let acct = mount("/var/run/tessera");
    assert!(!acct.read_only);
    assert_eq!(
        std::path::Path::new(&acct.host_path),
        alloc_dir.join("acct")
    );
    assert_eq!(
        mode(&alloc_dir.join("acct")),
        0o1733,
        "not world-listable, sticky"
    );
    assert_eq!(
        mode(alloc_dir.parent().unwrap()),
        0o700,
        "host users cannot reach it"
    );
    let preload = mount("/etc/ld.so.preload");
    assert!(preload.read_only);
    assert_eq!(
        std::fs::read_to_string(&preload.host_path).unwrap(),
        "/usr/local/tessera/lib/libtessera_cuda.so\n"
    );
    let lib = mount("/usr/local/tessera/lib/libtessera_cuda.so");
    assert!(lib.read_only && std::path::Path::new(&lib.host_path).is_file());

    // The kubelet's checkpoint holds the container: its directory stays; once the pod is
    // gone from the checkpoint, the directory goes.
    let dirs = tessera::shimfiles::AllocDirs::new(alloc_dir.parent().unwrap());
    let id = c.annotations[tessera::shimfiles::ALLOCATION_ANNOTATION].clone();
    let checkpoint = tmp.path().join("kubelet_internal_checkpoint");
    let entry = {
        use base64::Engine as _;
        use prost::Message as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.encode_to_vec());
        format!(
            r#"{{"PodUID":"p1","ContainerName":"c","ResourceName":"nvidia.com/vgpu","DeviceIDs":{{"-1":["{}"]}},"AllocResp":"{b64}"}}"#,
            devs[0].id
        )
    };
    std::fs::write(
        &checkpoint,
        format!(
            r#"{{"Data":{{"PodDeviceEntries":[{entry}],"RegisteredDevices":{{}}}},"Checksum":1}}"#
        ),
    )
    .unwrap();
    let removed =
        tessera::shimfiles::reconcile_device_plugin(&dirs, &checkpoint, Duration::ZERO).unwrap();
    assert!(removed.is_empty() && alloc_dir.is_dir(), "{removed:?}");
    std::fs::write(
        &checkpoint,
        r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1}"#,
    )
    .unwrap();
    let removed =
        tessera::shimfiles::reconcile_device_plugin(&dirs, &checkpoint, Duration::ZERO).unwrap();
    assert_eq!(removed, vec![id]);
    assert!(!alloc_dir.exists());

    // The library removed from the host: a vGPU is refused with the reason, not handed a
    // mount of nothing.
    std::fs::remove_file(&lib.host_path).unwrap();
    let refused = client.allocate(request(&devs[1].id)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("not installed") && refused.message().contains(&lib.host_path),
        "{}",
        refused.message()
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_when_the_kubelet_comes_up_later() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = AgentBuilder::new("2xA100-80GB")
        .root(tmp.path().to_path_buf())
        .start();
    // The agent serves before any kubelet exists.
    let deadline = Instant::now() + WAIT;
    while agent.sockets().is_empty() {
        assert!(Instant::now() < deadline, "no socket");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kubelet = Kubelet::start(&agent.plugin_dir).await;
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_re_registers_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config(MIXED)
        .root(tmp.path().to_path_buf())
        .start();
    kubelet.devices("nvidia.com/gpu").await;
    kubelet.devices("nvidia.com/mig-1g.10gb").await;

    for round in 0..3 {
        let t0 = Instant::now();
        kubelet.restart().await;
        kubelet
            .wait_until(WAIT, "re-registration", |m| {
                m.len() == 2 && m.values().all(|s| !s.lists.is_empty())
            })
            .await;
        let took = t0.elapsed();
        // The benchmark measures this precisely; here only guard against polling loops.
        assert!(took < Duration::from_secs(2), "round {round}: {took:?}");
        assert_eq!(agent.sockets().len(), 2);
        assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 4);
    }
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_sockets_and_ends_streams() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .root(tmp.path().to_path_buf())
        .start();
    kubelet.devices("nvidia.com/gpu").await;
    let plugin_dir = agent.plugin_dir.clone();
    agent.shutdown().await;
    let left: Vec<_> = std::fs::read_dir(&plugin_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("tessera-"))
        .collect();
    assert!(left.is_empty(), "orphaned sockets: {left:?}");
    kubelet
        .wait_until(WAIT, "stream end", |m| m["nvidia.com/gpu"].stream_ended)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_ids_are_stable_across_agent_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let config = r#"
flags: { migStrategy: mixed }
tessera:
  gpus:
  - { match: { index: [0] }, mode: mig, mig: { layout: balanced } }
  - { match: { index: [1] }, mode: vgpu, vgpu: { count: 3, memory: 10g, cores: 30 } }
  - { match: all, mode: timeslice, timeslice: { replicas: 2, rename: nvidia.com/gpu.shared } }
"#;
    let ids = |lists: Vec<Vec<pb::Device>>| -> Vec<String> {
        let mut v: Vec<String> = lists.into_iter().flatten().map(|d| d.id).collect();
        v.sort();
        v
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let agent = AgentBuilder::new("3xH100-80GB")
            .config(config)
            .root(tmp.path().to_path_buf())
            .start();
        let mut lists = Vec::new();
        for r in [
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/vgpu",
            "nvidia.com/gpu.shared",
        ] {
            lists.push(kubelet.devices(r).await);
        }
        seen.push(ids(lists));
        agent.shutdown().await;
        kubelet
            .wait_until(WAIT, "streams closed", |m| {
                m.values().all(|s| s.stream_ended)
            })
            .await;
    }
    assert!(!seen[0].is_empty());
    assert_eq!(seen[0], seen[1], "device IDs changed across a restart");
}
