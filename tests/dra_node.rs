//! `tessera node` with the DRA path, end to end: the agent (in-process, the code behind
//! `tessera node --dra`) on fake GPUs, the DRA kubelet emulator over real unix sockets
//! (socket-path `:authority`), and the API-server double.
//!
//! Slices published and schema-valid, claims prepared through the sockets (CDI spec on
//! disk, IDs returned), both paths side by side on disjoint GPUs, a crash injected between
//! prepare steps, a reboot, 100 concurrent claims, and slices republished after deletion,
//! a kubelet restart and a node-label change.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::apiserver::ApiServer;
use support::dra_agent::{DraAgentBuilder, NodeDirs, NODE};
use support::dra_kubelet::{Claim, DraKubelet};
use support::dra_pool::{complete_pool, device_names, gpu_uuids, our_slices, DRIVER, SLICES};
use support::kubelet::Kubelet;
use tessera::dra::checkpoint::{Phase, Store};
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::{GpuBackend, HealthSender, Inventory, MigDeviceInfo};

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";
const WAIT: Duration = Duration::from_secs(5);

const MIG_AND_VGPU: &str = "tessera: { gpus: [ \
    { match: { index: [0] }, mode: mig, mig: { layout: balanced } }, \
    { match: { index: [1] }, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 50 } } ] }";
const ALL_MIG: &str = "tessera: { gpus: [ { match: all, mode: mig, mig: { layout: balanced } } ] }";

fn claim_object(name: &str, uid: &str, results: serde_json::Value) -> serde_json::Value {
    support::dra_agent::allocated_claim(name, uid, "gpu.tessera.io", results)
}

fn result(device: &str) -> Value {
    json!({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device})
}

/// Put an allocated claim with these devices into the API server; the kubelet's name for it.
fn allocate(api: &ApiServer, name: &str, devices: &[Value]) -> Claim {
    let uid = format!("uid-{name}");
    api.put_object(CLAIMS, claim_object(name, &uid, json!(devices)));
    Claim::new("ml", name, &uid)
}

async fn wait_for(what: &str, timeout: Duration, cond: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

fn mig_count(backend: &dyn GpuBackend) -> usize {
    backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.mig_devices.len())
        .sum()
}

fn env_of(spec_path: &std::path::Path) -> Vec<String> {
    let spec: Value = serde_json::from_slice(&std::fs::read(spec_path).unwrap()).unwrap();
    spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_by_side_publishes_valid_slices_and_prepares_through_sockets() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let plugins = Kubelet::start(&dirs.kubelet_dir.join("device-plugins")).await;
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(FakeBackend::from_spec("4xA100-80GB").unwrap());
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[("default", MIG_AND_VGPU)])
        .side_by_side("0,1")
        .start(&api);

    // Registration: GetInfo over the socket-path authority, v1 chosen.
    let plugin = kubelet.wait_registered(DRIVER, 1, WAIT).await;
    assert_eq!(plugin.version, "v1");
    assert_eq!(
        plugin.endpoint,
        dirs.kubelet_dir.join("plugins/gpu.tessera.io/dra.sock")
    );

    // The DRA pool holds GPUs 0 (partitionable MIG) and 1 (vGPU), nothing else.
    wait_for("slices", WAIT, || complete_pool(&api).is_some()).await;
    let slices = our_slices(&api);
    let names = device_names(&slices);
    assert!(
        names.contains("gpu-0") && names.contains("gpu-0-mig-3g-40gb-4"),
        "{names:?}"
    );
    assert!(names.contains("gpu-1-vgpu"), "{names:?}");
    assert!(!names
        .iter()
        .any(|n| n.starts_with("gpu-2") || n.starts_with("gpu-3")));
    support::schema::validate_all(&slices, &["1.35.0"]);

    // The device plugin advertises the other two GPUs only: no GPU is on both paths.
    let inv = backend.inventory().unwrap();
    let dp: BTreeSet<String> = plugins
        .devices("nvidia.com/gpu")
        .await
        .into_iter()
        .map(|d| d.id)
        .collect();
    let want: BTreeSet<String> = [&inv.gpus[2].uuid, &inv.gpus[3].uuid]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(dp, want);

    // A MIG claim and a vGPU claim, prepared in one request through dra.sock.
    let mut vgpu = result("gpu-1-vgpu");
    vgpu["consumedCapacity"] = json!({"memory": "16Gi", "cores": "25"});
    let mig = allocate(&api, "train", &[result("gpu-0-mig-3g-40gb-4")]);
    let serve = allocate(&api, "serve", &[vgpu]);
    let out = kubelet
        .prepare(DRIVER, &[mig.clone(), serve.clone()])
        .await
        .unwrap();
    let train = out[&mig.uid].as_ref().unwrap();
    assert_eq!(
        train[0].cdi_device_ids,
        vec![format!("tessera.io/gpu={}-gpu-0-mig-3g-40gb-4", mig.uid)]
    );
    assert_eq!(train[0].pool_name, NODE);
    let served = out[&serve.uid].as_ref().unwrap();
    assert_eq!(served[0].device_name, "gpu-1-vgpu");

    // The CDI specs are on disk and define exactly the IDs returned.
    for (claim, devices) in [(&mig, train), (&serve, served)] {
        let path = dirs.claim_spec(&claim.uid);
        let spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(spec["kind"], "tessera.io/gpu");
        let defined: Vec<String> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| format!("tessera.io/gpu={}", d["name"].as_str().unwrap()))
            .collect();
        assert_eq!(defined, devices[0].cdi_device_ids);
    }
    let mig_uuid = backend.inventory().unwrap().gpus[0].mig_devices[0]
        .uuid
        .clone();
    assert!(
        env_of(&dirs.claim_spec(&mig.uid)).contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}"))
    );
    assert!(env_of(&dirs.claim_spec(&serve.uid))
        .contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=16384m".to_string()));

    // Unprepare: specs and the MIG instance are gone.
    let un = kubelet
        .unprepare(DRIVER, &[mig.clone(), serve.clone()])
        .await
        .unwrap();
    assert!(un.values().all(|r| r.is_ok()), "{un:?}");
    assert!(!dirs.claim_spec(&mig.uid).exists() && !dirs.claim_spec(&serve.uid).exists());
    assert_eq!(mig_count(backend.as_ref()), 0);
    agent.shutdown().await;
    assert!(!dirs
        .kubelet_dir
        .join("plugins/gpu.tessera.io/dra.sock")
        .exists());
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// The taints of device `name` in `slices`.
fn taints_of(slices: &[Value], name: &str) -> Value {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == name)
        .map_or(Value::Null, |d| d["taints"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_on_a_dra_gpu_is_reported_unhealthy_and_taints_its_devices() {
    use tessera::proto::dra_health::v1beta1::HealthStatus;
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(FakeBackend::from_spec("3xA100-80GB").unwrap());
    let uuids = gpu_uuids(backend.as_ref());
    let gpu0 = uuids[0].clone();
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[("default", ALL_MIG)])
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_for("slices", WAIT, || complete_pool(&api).is_some()).await;
    assert_eq!(taints_of(&our_slices(&api), "gpu-0"), Value::Null);

    let mut stream = kubelet.watch_health(DRIVER).await.unwrap();
    let status_of = |r: &tessera::proto::dra_health::v1beta1::NodeWatchResourcesResponse,
                     device: &str| {
        r.devices
            .iter()
            .find(|d| d.device.as_ref().is_some_and(|i| i.device_name == device))
            .map(|d| d.health)
    };
    // Healthy once the agent watches the backend (Unknown before).
    let deadline = Instant::now() + WAIT;
    loop {
        let r = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if status_of(&r, "gpu-0") == Some(HealthStatus::Healthy as i32) {
            break;
        }
        assert!(Instant::now() < deadline, "gpu-0 never healthy: {r:?}");
    }

    // XID 79 (fallen off the bus) on GPU 0: every device of GPU 0 goes Unhealthy, GPU 1's stay.
    backend.inject(tessera::gpu::HealthEvent::Xid {
        gpu_uuid: gpu0.clone(),
        xid: 79,
    });
    let r = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        status_of(&r, "gpu-0"),
        Some(HealthStatus::Unhealthy as i32),
        "{r:?}"
    );
    assert_eq!(
        status_of(&r, "gpu-0-mig-1g-10gb-0"),
        Some(HealthStatus::Unhealthy as i32)
    );
    assert_eq!(status_of(&r, "gpu-1"), Some(HealthStatus::Healthy as i32));
    let msg = &r
        .devices
        .iter()
        .find(|d| d.health == HealthStatus::Unhealthy as i32)
        .unwrap()
        .message;
    assert!(msg.contains("XID 79") && msg.contains(&gpu0), "{msg}");

    // The republished pool carries the taint on GPU 0's devices only, and is schema-valid.
    wait_for("tainted slices", WAIT, || {
        complete_pool(&api).is_some_and(|s| taints_of(&s, "gpu-0") != Value::Null)
    })
    .await;
    let slices = complete_pool(&api).unwrap();
    let t = taints_of(&slices, "gpu-0-mig-1g-10gb-0");
    assert_eq!(t[0]["key"], "gpu.tessera.io/xid", "{t}");
    assert_eq!(t[0]["value"], "79");
    assert_eq!(t[0]["effect"], "NoExecute");
    assert!(t[0]["timeAdded"].is_string(), "{t}");
    assert_eq!(taints_of(&slices, "gpu-1"), Value::Null);
    support::schema::validate_all(&slices, &["1.35.0"]);

    // An API server without DRADeviceTaints drops them: when GPU 1 fails too, the
    // tainted slices are withdrawn and the devices of unhealthy GPUs withheld instead.
    api.drop_field("spec.devices.*.taints");
    backend.inject(tessera::gpu::HealthEvent::Xid {
        gpu_uuid: uuids[1].clone(),
        xid: 74,
    });
    wait_for("withheld devices", WAIT, || {
        complete_pool(&api).is_some_and(|s| {
            let names = device_names(&s);
            !names
                .iter()
                .any(|n| n.starts_with("gpu-0") || n.starts_with("gpu-1"))
                && names.contains("gpu-2")
        })
    })
    .await;
    let slices = complete_pool(&api).unwrap();
    support::schema::validate_all(&slices, &["1.35.0"]);
    // The health stream still reports the withheld devices.
    let r = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(status_of(&r, "gpu-1"), Some(HealthStatus::Unhealthy as i32));
    assert_eq!(status_of(&r, "gpu-2"), Some(HealthStatus::Healthy as i32));
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1beta1_kubelet_gets_v1beta1() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start_with(&dirs.kubelet_dir, NODE, api.client(), &["v1beta1"]).await;
    let backend = Arc::new(FakeBackend::from_spec("1xL4").unwrap());
    let agent = DraAgentBuilder::new(&dirs, backend).start(&api);
    assert_eq!(
        kubelet.wait_registered(DRIVER, 1, WAIT).await.version,
        "v1beta1"
    );
    let c = allocate(&api, "infer", &[result("gpu-0")]);
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap();
    assert_eq!(out[&c.uid].as_ref().unwrap()[0].device_name, "gpu-0");
    assert!(dirs.claim_spec(&c.uid).is_file());
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// Fake GPUs whose next MIG creation "crashes" after the instance exists.
struct CrashingGpus {
    inner: FakeBackend,
    armed: AtomicBool,
}

impl GpuBackend for CrashingGpus {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn inventory(&self) -> tessera::gpu::Result<Inventory> {
        self.inner.inventory()
    }
    fn watch_health(&self, tx: HealthSender) -> tessera::gpu::Result<()> {
        self.inner.watch_health(tx)
    }
    fn apply_mig_layout(
        &self,
        gpu_uuid: &str,
        layout: &[(String, u8)],
    ) -> tessera::gpu::Result<Vec<MigDeviceInfo>> {
        let devices = self.inner.apply_mig_layout(gpu_uuid, layout)?;
        if self.armed.swap(false, Ordering::SeqCst) {
            return Err(tessera::gpu::Error::Mig {
                gpu: gpu_uuid.into(),
                reason: "injected crash after the instance was created".into(),
            });
        }
        Ok(devices)
    }
}

#[derive(Debug, Clone, Copy)]
enum CrashPoint {
    /// The MIG instance exists; nothing after it happened.
    AfterMigCreated,
    /// The CDI spec could not be written (the instance exists).
    WritingCdiSpec,
    /// Everything done but the `Completed` record.
    BeforeCompleted,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_prepare_steps_is_rolled_back_and_prepared_again() {
    for point in [
        CrashPoint::AfterMigCreated,
        CrashPoint::WritingCdiSpec,
        CrashPoint::BeforeCompleted,
    ] {
        let api = ApiServer::start(NODE).await;
        let tmp = tempfile::tempdir().unwrap();
        let dirs = NodeDirs::under(tmp.path());
        let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
        let gpus = Arc::new(CrashingGpus {
            inner: FakeBackend::from_spec("1xA100-80GB").unwrap(),
            armed: AtomicBool::new(matches!(point, CrashPoint::AfterMigCreated)),
        });
        let c = allocate(&api, "train", &[result("gpu-0-mig-3g-40gb-4")]);
        let agent = DraAgentBuilder::new(&dirs, gpus.clone())
            .configs(&[("default", ALL_MIG)])
            .start(&api);
        kubelet.wait_registered(DRIVER, 1, WAIT).await;
        if let CrashPoint::WritingCdiSpec = point {
            std::fs::write(&dirs.cdi_root, b"not a directory").unwrap();
        }
        let first = kubelet
            .prepare(DRIVER, std::slice::from_ref(&c))
            .await
            .unwrap();
        match point {
            CrashPoint::BeforeCompleted => {
                first[&c.uid].as_ref().unwrap();
            }
            _ => assert!(first[&c.uid].is_err(), "{point:?}: {first:?}"),
        }
        agent.kill().await;
        if let CrashPoint::BeforeCompleted = point {
            // What the checkpoint holds if the agent died right before writing Completed.
            let store = Store::new(&dirs.checkpoint_dir());
            let mut data = store.read().unwrap();
            data.claims.get_mut(&c.uid).unwrap().phase = Phase::Started;
            store.write(&data).unwrap();
        }
        if let CrashPoint::WritingCdiSpec = point {
            std::fs::remove_file(&dirs.cdi_root).unwrap();
        }
        assert_eq!(
            mig_count(gpus.as_ref()),
            1,
            "{point:?}: the crash left an instance"
        );
        let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
        assert_eq!(cp.claims[&c.uid].phase, Phase::Started, "{point:?}");

        // Restart: the half-prepared claim is rolled back before the socket is served.
        let agent = DraAgentBuilder::new(&dirs, gpus.clone())
            .configs(&[("default", ALL_MIG)])
            .start(&api);
        kubelet.wait_registered(DRIVER, 2, WAIT).await;
        assert_eq!(
            mig_count(gpus.as_ref()),
            0,
            "{point:?}: instance rolled back"
        );
        assert!(!dirs.claim_spec(&c.uid).exists(), "{point:?}");
        assert!(Store::new(&dirs.checkpoint_dir())
            .read()
            .unwrap()
            .claims
            .is_empty());

        // The kubelet retries and the claim is prepared from scratch.
        let again = kubelet
            .prepare(DRIVER, std::slice::from_ref(&c))
            .await
            .unwrap();
        again[&c.uid].as_ref().unwrap();
        assert_eq!(mig_count(gpus.as_ref()), 1, "{point:?}");
        assert!(dirs.claim_spec(&c.uid).is_file());
        let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
        assert_eq!(cp.claims[&c.uid].phase, Phase::Completed);
        agent.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_claims_are_prepared_again() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let mut kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let gpus = Arc::new(FakeBackend::from_spec("1xA100-80GB").unwrap());
    let c = allocate(&api, "train", &[result("gpu-0-mig-2g-20gb-0")]);
    let agent = DraAgentBuilder::new(&dirs, gpus.clone())
        .configs(&[("default", ALL_MIG)])
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    let before = kubelet
        .prepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap()[&c.uid]
        .clone()
        .unwrap();
    agent.kill().await;

    // Reboot: new boot ID, MIG instances and /var/run/cdi gone, the kubelet restarts too.
    let fresh = Arc::new(FakeBackend::from_spec("1xA100-80GB").unwrap());
    std::fs::remove_dir_all(&dirs.cdi_root).unwrap();
    kubelet.restart().await;
    let agent = DraAgentBuilder::new(&dirs, fresh.clone())
        .configs(&[("default", ALL_MIG)])
        .boot_id("boot-2")
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
    assert_eq!(cp.claims[&c.uid].phase, Phase::NeedsReprepare);
    assert_eq!(cp.boot_id, "boot-2");

    // The kubelet re-sends the running pod's claim: prepared again, same IDs.
    let after = kubelet
        .prepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap()[&c.uid]
        .clone()
        .unwrap();
    assert_eq!(after, before);
    assert_eq!(mig_count(fresh.as_ref()), 1);
    let mig_uuid = fresh.inventory().unwrap().gpus[0].mig_devices[0]
        .uuid
        .clone();
    assert!(
        env_of(&dirs.claim_spec(&c.uid)).contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}"))
    );
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_claims_get_distinct_devices_and_all_checkpointed() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = Arc::new(DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await);
    let gpus = Arc::new(FakeBackend::from_spec("15xA100-80GB").unwrap());
    let agent = DraAgentBuilder::new(&dirs, gpus.clone())
        .configs(&[("default", ALL_MIG)])
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    // 7 one-slice placements per GPU: 100 claims, one distinct MIG device each.
    let claims: Vec<Claim> = (0..100)
        .map(|i| {
            let device = format!("gpu-{}-mig-1g-10gb-{}", i / 7, i % 7);
            allocate(&api, &format!("c{i}"), &[result(&device)])
        })
        .collect();
    // One request per pod, all in flight at once.
    let calls = claims.iter().map(|c| {
        let kubelet = kubelet.clone();
        let c = c.clone();
        async move { kubelet.prepare(DRIVER, &[c]).await }
    });
    let results = futures::future::join_all(calls).await;
    let mut visible = BTreeSet::new();
    for (c, r) in claims.iter().zip(results) {
        let r = r.unwrap();
        r[&c.uid].as_ref().unwrap();
        let env = env_of(&dirs.claim_spec(&c.uid));
        let v = env
            .iter()
            .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .unwrap()
            .to_string();
        assert!(v.starts_with("MIG-"), "{v}");
        assert!(visible.insert(v.clone()), "device {v} handed out twice");
    }
    assert_eq!(visible.len(), 100);
    assert_eq!(mig_count(gpus.as_ref()), 100);
    let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
    assert_eq!(cp.claims.len(), 100, "no lost checkpoint entry");
    assert!(cp.claims.values().all(|c| c.phase == Phase::Completed));
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_come_back_after_deletion_kubelet_restart_and_follow_the_node_label() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let mut kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let agent = DraAgentBuilder::new(
        &dirs,
        Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap()),
    )
    .configs(&[("default", "version: v1\n"), ("mig", ALL_MIG)])
    .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_for("slices", WAIT, || complete_pool(&api).is_some()).await;
    let first = our_slices(&api);
    assert_eq!(
        device_names(&first),
        ["gpu-0", "gpu-1"].map(String::from).into()
    );
    let generation = first[0]["spec"]["pool"]["generation"].as_i64().unwrap();

    // Deleted behind the agent's back: republished well within 2 s.
    for s in &first {
        api.delete_object(SLICES, s["metadata"]["name"].as_str().unwrap());
    }
    let took = wait_for("republish", Duration::from_secs(2), || {
        complete_pool(&api).is_some_and(|p| p.len() == first.len())
    })
    .await;
    eprintln!("republished {took:?} after deletion");

    // Drift: an edit behind the agent's back is undone.
    let mut edited = our_slices(&api)[0].clone();
    edited["spec"]["devices"] = json!([{"name": "gpu-9"}]);
    api.put_object(SLICES, edited);
    wait_for("drift undone", Duration::from_secs(2), || {
        complete_pool(&api).is_some_and(|p| device_names(&p) == device_names(&first))
    })
    .await;

    // A kubelet restart wipes the node's slices; they come back, the driver re-registers.
    kubelet.restart().await;
    assert_eq!(kubelet.wipes(), 2);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_for(
        "republish after kubelet restart",
        Duration::from_secs(2),
        || complete_pool(&api).is_some_and(|p| p.len() == first.len()),
    )
    .await;

    // The node label picks the MIG config: partitionable devices, a newer pool generation.
    api.set_label("tessera.io/config", Some("mig"));
    // Wait for the whole pool: during an update, slices of two generations coexist.
    wait_for("MIG devices", WAIT, || {
        complete_pool(&api).is_some_and(|p| device_names(&p).contains("gpu-1-mig-1g-10gb-6"))
    })
    .await;
    let now = our_slices(&api);
    let generations: BTreeSet<i64> = now
        .iter()
        .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap())
        .collect();
    assert_eq!(generations.len(), 1, "one generation across the pool");
    assert!(*generations.first().unwrap() > generation);
    support::schema::validate_all(&now, &["1.35.0"]);
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// The real binary: `tessera node --dra` registers, publishes and prepares; SIGKILL and a
/// restart keep the prepared claim (answered from the checkpoint); SIGTERM cleans up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_dra_survives_sigkill_and_exits_cleanly() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let bin = env!("CARGO_BIN_EXE_tessera");
    let mut child = support::dra_agent::spawn_binary(bin, &dirs, &api, "2xA100-80GB", "boot-1");
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_for("slices", WAIT, || {
        complete_pool(&api).is_some_and(|p| device_names(&p).len() == 2)
    })
    .await;
    let c = allocate(&api, "infer", &[result("gpu-1")]);
    let first = kubelet
        .prepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap()[&c.uid]
        .clone()
        .unwrap();
    assert!(dirs.claim_spec(&c.uid).is_file());

    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let mut child = support::dra_agent::spawn_binary(bin, &dirs, &api, "2xA100-80GB", "boot-1");
    kubelet.wait_registered(DRIVER, 2, WAIT).await;
    let again = kubelet
        .prepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap()[&c.uid]
        .clone()
        .unwrap();
    assert_eq!(again, first, "answered from the checkpoint after SIGKILL");
    let un = kubelet
        .unprepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap();
    assert!(un[&c.uid].is_ok(), "{un:?}");
    assert!(!dirs.claim_spec(&c.uid).exists());
    // Prepared when SIGTERM comes: its records are in the checkpoint's log...
    let kept = allocate(&api, "kept", &[result("gpu-0")]);
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&kept))
        .await
        .unwrap();
    assert!(out[&kept.uid].is_ok(), "{out:?}");
    let snapshot_claims = || -> Value {
        let text = std::fs::read_to_string(dirs.checkpoint_dir().join("checkpoint.json")).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["data"]["claims"].clone()
    };
    assert!(
        snapshot_claims().get(&kept.uid).is_none(),
        "in the log only"
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    let log = support::dra_agent::binary_log(&dirs);
    assert!(status.success(), "exit status {status}: {log}");
    assert!(!log.contains("panicked"), "{log}");
    // ...and after SIGTERM in the snapshot, the one file a 0.2 release reads (rollback).
    assert_eq!(snapshot_claims()[&kept.uid]["phase"], "Completed", "{log}");
    for socket in [
        "plugins/gpu.tessera.io/dra.sock",
        "plugins_registry/gpu.tessera.io-reg.sock",
    ] {
        assert!(
            !dirs.kubelet_dir.join(socket).exists(),
            "{socket} left behind"
        );
    }
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[test]
fn path_flags_are_checked_before_anything_starts() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--dra", "--device-plugin=false", "--standalone"],
            "--dra needs",
        ),
        // Both paths without --dra-gpus: the node config splits the GPUs; DRA still
        // needs the API server.
        (&["--dra"], "--dra needs the API server"),
        (&["--dra=false", "--device-plugin=false"], "both off"),
        (&["--dra", "--dra-gpus", "3-1"], "backwards"),
    ];
    for (flags, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "node",
                "--gpu-backend",
                "fake",
                "--fake-gpus",
                "1xL4",
                "--node-name",
                NODE,
            ])
            .args(*flags)
            .arg("--kubelet-dir")
            .arg(tmp.path())
            .arg("--state-dir")
            .arg(tmp.path())
            .arg("--cdi-root")
            .arg(tmp.path())
            .env("KUBECONFIG", tmp.path().join("none"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
}

/// `status.devices` is written after NodePrepareResources answered; a graceful stop
/// (SIGTERM) flushes what is still queued before the agent returns. Here the status PUT
/// fails when the claim is prepared, so its write is retrying when the stop comes; the
/// API server answers again 300 ms into the shutdown and the agent returns only after the
/// Ready entry is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_flushes_queued_status_writes() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let gpus = Arc::new(FakeBackend::from_spec("1xL4").unwrap());
    let c = allocate(&api, "train", &[result("gpu-0")]);
    let agent = DraAgentBuilder::new(&dirs, gpus).start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    api.fail_requests(&["PUT"], &format!("{CLAIMS}/train/status"));
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&c))
        .await
        .unwrap();
    assert!(out[&c.uid].is_ok(), "{out:?}");
    let status = |api: &ApiServer| {
        api.objects(CLAIMS)
            .into_iter()
            .find(|o| o["metadata"]["name"] == "train")
            .and_then(|o| o["status"]["devices"].as_array().cloned())
            .unwrap_or_default()
    };
    assert!(status(&api).is_empty(), "written before the answer");
    let api2 = api.clone();
    let recover = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        api2.stop_failing();
    });
    agent.shutdown().await;
    recover.await.unwrap();
    let devices = status(&api);
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0]["conditions"][0]["reason"], "Prepared");
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}
