//! The node config splits a node's GPUs between the device plugin and the DRA driver, end
//! to end: the agent runs both paths without `--dra-gpus` (the code behind `tessera node
//! --device-plugin --dra`), the node's `tessera.io/config` label picks a named config
//! whose `tessera.dra.gpus` says which GPUs go to DRA, with the device-plugin kubelet
//! emulator, the DRA kubelet emulator (real unix sockets) and the API-server double.
//!
//! A label change moves free GPUs at once and leaves unchanged GPUs alone; a GPU in use
//! (a prepared claim, a pod in the kubelet's device checkpoint) stays where it is, with a
//! `GpuMoveBlocked` Event on the Node naming the GPU and its holder, and moves once it is
//! released. A claim allocated on a GPU but not prepared yet holds it too. An invalid `tessera.dra` is rejected naming the field; the last good split
//! stays.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::apiserver::ApiServer;
use support::dra_agent::allocated_claim;
use support::dra_agent::{DraAgentBuilder, NodeDirs, NODE};
use support::dra_kubelet::{Claim, DraKubelet};
use support::dra_pool::{
    blocked_events, dra_devices, gpu_uuids, node, wait_blocked, wait_dp, wait_dra,
    write_kubelet_checkpoint, Node, Slices, DRIVER, GPU, SLICES, WAIT,
};
use support::kubelet::Kubelet;
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_config_splits_gpus_and_moves_only_free_ones() {
    // Cluster-wide LIST of ResourceClaims, as the API server answers it.
    let (n, backend) = node("5xL4").await;
    let Node {
        api,
        dirs,
        plugins,
        kubelet,
        uuids,
        ..
    } = n;
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[
            ("default", "version: v1\n"),
            ("split", "tessera: { dra: { gpus: { index: [2, 3] } } }\n"),
            ("swap", "tessera: { dra: { gpus: { index: [0, 1, 3] } } }\n"),
        ])
        .both_paths()
        .events_on_node(&api)
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;

    // No label: the default config has no `tessera.dra`: every GPU on the device plugin.
    wait_dp(&plugins, &uuids, &[0, 1, 2, 3, 4]).await;
    wait_dra(&api, &[], Slices::MayBeAbsent).await;

    // Label the node: GPUs 2 and 3 go to DRA.
    api.set_label("tessera.io/config", Some("split"));
    wait_dp(&plugins, &uuids, &[0, 1, 4]).await;
    wait_dra(&api, &["gpu-2", "gpu-3"], Slices::MayBeAbsent).await;

    // GPU 2 gets a prepared claim; a pod holds GPU 1 through the device plugin.
    api.put_object(
        CLAIMS,
        allocated_claim(
            "train",
            "uid-train",
            "gpu.tessera.io",
            json!([
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-2"}]),
        ),
    );
    let claim = Claim::new("ml", "train", "uid-train");
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out[&claim.uid].is_ok(), "{out:?}");
    write_kubelet_checkpoint(&dirs, &[("pod-uid-1", &uuids[1])]);
    let gpu4_lists_before = plugins.state(GPU).unwrap().lists.len();

    // The swap config wants 0, 1 and 3 on DRA: 0 moves (free), 1 stays on the device
    // plugin (a pod holds it), 2 stays on DRA (a claim holds it), 3 and 4 do not change.
    api.set_label("tessera.io/config", Some("swap"));
    wait_dra(&api, &["gpu-0", "gpu-2", "gpu-3"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[1, 4]).await;
    let start = Instant::now();
    while blocked_events(&api).len() < 2 {
        assert!(start.elapsed() < WAIT, "events: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let events = blocked_events(&api);
    assert!(
        events.iter().any(|e| e.contains("GPU 1 ")
            && e.contains(&uuids[1])
            && e.contains("pod pod-uid-1")
            && e.contains("stays with the device plugin")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.contains("GPU 2 ")
            && e.contains("claim ml/train (uid uid-train)")
            && e.contains("stays with the DRA driver")),
        "{events:?}"
    );
    // The claim is untouched: still prepared, its CDI spec in place.
    assert!(dirs.claim_spec(&claim.uid).exists());
    // GPU 4 (unchanged) was in every list the device plugin sent.
    let lists = plugins.state(GPU).unwrap().lists;
    assert!(lists[gpu4_lists_before - 1..]
        .iter()
        .all(|l| l.iter().any(|d| d.id == uuids[4] && d.health == "Healthy")));

    // An invalid `tessera.dra` in the node's config is rejected naming the field; the
    // split stays. (Another node's bad config would not touch this node at all.)
    let broken = dirs.config.join("broken");
    std::fs::write(
        &broken,
        "tessera: { dra: { gpus: { index: [0], uuid: [x] } } }\n",
    )
    .unwrap();
    api.set_label("tessera.io/config", Some("broken"));
    let start = Instant::now();
    let rejected = loop {
        let notes: Vec<String> = api
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "ConfigRejected")
            .filter_map(|e| e["note"].as_str().map(String::from))
            .collect();
        if let Some(n) = notes.into_iter().next() {
            break n;
        }
        assert!(start.elapsed() < WAIT, "no ConfigRejected event");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(rejected.contains("tessera.dra.gpus"), "{rejected}");
    api.set_label("tessera.io/config", Some("swap"));
    std::fs::remove_file(&broken).unwrap();

    // Released: the claim is deallocated (Kubernetes does that once its pod is gone) and
    // unprepared, the pod's entry leaves the kubelet's checkpoint; the blocked moves
    // happen (no restart, no reload by hand).
    assert!(api.delete_object(CLAIMS, "train"));
    let un = kubelet
        .unprepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(un.values().all(|r| r.is_ok()), "{un:?}");
    wait_dra(&api, &["gpu-0", "gpu-3"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[1, 2, 4]).await;
    write_kubelet_checkpoint(&dirs, &[]);
    wait_dra(&api, &["gpu-0", "gpu-1", "gpu-3"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[2, 4]).await;
    assert_eq!(
        blocked_events(&api).len(),
        2,
        "each blocked move reported once"
    );
    support::schema::validate_all(&api.objects(SLICES), &["1.34.0", "1.35.0"]);

    // A claim the scheduler allocated on GPU 3 that the kubelet has not prepared yet also
    // holds it: back to the default config (no DRA), GPU 3 stays on DRA, the rest move.
    api.put_object(
        CLAIMS,
        allocated_claim(
            "serve",
            "uid-serve",
            "gpu.tessera.io",
            json!([
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}]),
        ),
    );
    api.set_label("tessera.io/config", None);
    wait_dra(&api, &["gpu-3"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[0, 1, 2, 4]).await;
    wait_blocked(&api, 3, "claim ml/serve (uid uid-serve, allocated)").await;
    // The claim goes away; the next reload (here: the ConfigMap rewritten) moves GPU 3.
    assert!(api.delete_object(CLAIMS, "serve"));
    std::fs::write(dirs.config.join("default"), "version: v1\n").unwrap();
    wait_dra(&api, &[], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[0, 1, 2, 3, 4]).await;
    agent.shutdown().await;
}

/// A free GPU the config moves from the device plugin to the DRA driver loses the device
/// plugin's MIG instances (the driver creates its own per claim); the other GPU's
/// instances stay exactly as they were, and a MIG claim on the moved GPU prepares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_moving_to_dra_loses_the_device_plugins_mig_layout_only() {
    const RULES: &str = "flags: { migStrategy: mixed }\ntessera:\n  gpus: [ { match: all, mode: mig, mig: { layout: balanced } } ]\n";
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let plugins = Kubelet::start(&dirs.kubelet_dir.join("device-plugins")).await;
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let dra_one = format!("{RULES}  dra: {{ gpus: {{ index: [1] }} }}\n");
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[("default", RULES), ("dra-one", &dra_one)])
        .both_paths()
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    let migs = |gpu: usize| -> Vec<String> {
        backend.inventory().unwrap().gpus[gpu]
            .mig_devices
            .iter()
            .map(|m| m.uuid.clone())
            .collect()
    };
    plugins
        .wait_until(WAIT, "MIG devices advertised", |m| {
            m.keys().any(|k| k.starts_with("nvidia.com/mig-"))
        })
        .await;
    let gpu0 = migs(0);
    assert!(!gpu0.is_empty() && !migs(1).is_empty());

    api.set_label("tessera.io/config", Some("dra-one"));
    let start = Instant::now();
    while !dra_devices(&api).is_some_and(|d| d.iter().any(|n| n.starts_with("gpu-1-mig-"))) {
        assert!(start.elapsed() < WAIT, "no partitionable devices for GPU 1");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names = dra_devices(&api).unwrap();
    assert!(names.iter().all(|n| n.starts_with("gpu-1")), "{names:?}");
    assert!(
        migs(1).is_empty(),
        "the device plugin's instances on GPU 1 are gone"
    );
    assert_eq!(migs(0), gpu0, "GPU 0's instances are untouched");
    // The device plugin advertises GPU 0's MIG devices only.
    let advertised: BTreeSet<String> = plugins
        .resources()
        .iter()
        .filter(|r| r.starts_with("nvidia.com/mig-"))
        .flat_map(|r| {
            plugins
                .state(r)
                .unwrap()
                .lists
                .last()
                .cloned()
                .unwrap_or_default()
        })
        .map(|d| d.id)
        .collect();
    assert_eq!(advertised, gpu0.iter().cloned().collect());

    // A claim for a MIG device of GPU 1 creates its instance on demand.
    api.put_object(
        CLAIMS,
        allocated_claim("mig", "uid-mig", "mig.gpu.tessera.io", json!([
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1-mig-3g-40gb-4"}])),
    );
    let claim = Claim::new("ml", "mig", "uid-mig");
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out[&claim.uid].is_ok(), "{out:?}");
    assert_eq!(migs(1).len(), 1);
    assert_eq!(migs(0), gpu0);
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// A claim the scheduler allocated `devices` of this node's DRA pool.
fn put_claim(api: &ApiServer, name: &str, devices: &[&str]) -> Claim {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d}))
        .collect();
    let uid = format!("uid-{name}");
    api.put_object(
        CLAIMS,
        allocated_claim(name, &uid, "gpu.tessera.io", json!(results)),
    );
    Claim::new("ml", name, &uid)
}

/// After a reload moved GPU 1 to the device plugin, a claim the scheduler allocated on it
/// (from the slices before the reload) is refused, as are devices the driver does not
/// publish; nothing is created for them, the checkpoint stays as it was, the other claims
/// of the request are prepared, and a prepared claim is prepared again (also by a
/// restarted agent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_on_gpus_the_driver_gave_up_or_never_published_are_refused() {
    // Cluster-wide LIST of ResourceClaims, as the API server answers it.
    let (n, backend) = node("4xA100-80GB").await;
    let Node {
        api,
        dirs,
        plugins,
        kubelet,
        uuids,
        ..
    } = n;
    let configs = [
        ("default", "version: v1\n"),
        (
            "split",
            "tessera: { dra: { gpus: { index: [1, 2, 3] } } }\n",
        ),
        ("moved", "tessera: { dra: { gpus: { index: [2, 3] } } }\n"),
    ];
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&configs)
        .both_paths()
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    api.set_label("tessera.io/config", Some("split"));
    wait_dra(&api, &["gpu-1", "gpu-2", "gpu-3"], Slices::MayBeAbsent).await;
    let pinned = put_claim(&api, "pinned", &["gpu-2"]);
    let first = kubelet
        .prepare(DRIVER, std::slice::from_ref(&pinned))
        .await
        .unwrap();
    assert!(first[&pinned.uid].is_ok(), "{first:?}");

    api.set_label("tessera.io/config", Some("moved"));
    wait_dra(&api, &["gpu-2", "gpu-3"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[0, 1]).await;
    // The scheduler allocated GPU 1 from the slices before the reload, after the agent's
    // LIST of allocated claims (the window docs/dra.md names).
    let late = put_claim(&api, "late", &["gpu-1"]);

    let typo = put_claim(&api, "typo", &["gpu-3-mig-1g.10gb-0"]);
    // A MIG placement of GPU 3, which is published whole only.
    let placement = put_claim(&api, "placement", &["gpu-3-mig-3g-40gb-4"]);
    let half = put_claim(&api, "half", &["gpu-3", "gpu-1"]);
    let checkpoint = checkpoint_files(&dirs);
    let before = checkpoint();
    let refused = [late.clone(), typo, placement, half];
    let out = kubelet.prepare(DRIVER, &refused).await.unwrap();
    let err = |c: &Claim| out[&c.uid].as_ref().unwrap_err().clone();
    let late_err = err(&refused[0]);
    assert!(
        late_err.contains(&format!(
            "device gpu-1: {} (GPU 1) is served by the device-plugin path since the config reload applied at ",
        uuids[1])) && late_err.contains("(config \"moved\")"),
        "{late_err}"
    );
    assert!(
        err(&refused[1]).contains("device gpu-3-mig-1g.10gb-0 is not published by this node"),
        "{out:?}"
    );
    assert!(
        err(&refused[2]).contains("device gpu-3-mig-3g-40gb-4 is not published by this node"),
        "{out:?}"
    );
    assert!(err(&refused[3]).contains("device gpu-1: "), "{out:?}");
    assert!(
        checkpoint() == before,
        "checkpoint unchanged (snapshot and log)"
    );
    for c in &refused {
        assert!(!dirs.claim_spec(&c.uid).exists(), "{}", c.uid);
    }
    assert!(backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .all(|g| g.mig_devices.is_empty()));

    // In one request with a refused claim, a claim on a device the driver owns prepares;
    // a prepared claim is answered again.
    let fine = put_claim(&api, "fine", &["gpu-3"]);
    let out = kubelet
        .prepare(DRIVER, &[late.clone(), fine.clone(), pinned.clone()])
        .await
        .unwrap();
    assert!(out[&late.uid].is_err(), "{out:?}");
    assert!(out[&fine.uid].is_ok(), "{out:?}");
    assert_eq!(out[&pinned.uid], first[&pinned.uid]);
    assert!(dirs.claim_spec(&fine.uid).exists());
    let prepared = |dirs: &NodeDirs| -> Vec<String> {
        tessera::dra::checkpoint::Store::new(&dirs.checkpoint_dir())
            .read()
            .unwrap()
            .claims
            .into_keys()
            .collect()
    };
    assert_eq!(prepared(&dirs), ["uid-fine", "uid-pinned"]);

    // A restarted agent prepares the prepared claims again and still refuses the late one:
    // the kubelet's checkpoint records GPU 1 as the device plugin's (as the kubelet writes
    // it after each device list), so the claim allocated on it is not taken for one the
    // scheduler made while the agent was down.
    let registered = json!({"Data": {"PodDeviceEntries": null,
        "RegisteredDevices": {"nvidia.com/gpu": [uuids[0], uuids[1]]}}, "Checksum": 0});
    std::fs::write(
        dirs.kubelet_dir
            .join("device-plugins/kubelet_internal_checkpoint"),
        registered.to_string(),
    )
    .unwrap();
    agent.shutdown().await;
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&configs)
        .both_paths()
        .start(&api);
    kubelet.wait_registered(DRIVER, 2, WAIT).await;
    wait_dra(&api, &["gpu-2", "gpu-3"], Slices::MayBeAbsent).await;
    let out = kubelet
        .prepare(DRIVER, &[pinned.clone(), fine.clone(), late.clone()])
        .await
        .unwrap();
    assert_eq!(out[&pinned.uid], first[&pinned.uid]);
    assert!(out[&fine.uid].is_ok(), "{out:?}");
    assert!(
        out[&late.uid]
            .as_ref()
            .unwrap_err()
            .contains("is served by the device-plugin path"),
        "{out:?}"
    );
    assert_eq!(prepared(&dirs), ["uid-fine", "uid-pinned"]);
    agent.shutdown().await;
}

/// The fake GPUs, with a one-shot stall: once armed, the next `inventory()` call tells the
/// test it arrived and waits until the test lets it go. The preparer reads the inventory
/// right after admitting a claim and before writing its `Started` record: the moment the
/// claim holds its GPU only in memory.
struct StallingBackend {
    inner: FakeBackend,
    armed: std::sync::Mutex<Option<Stall>>,
}

struct Stall {
    arrived: tokio::sync::oneshot::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

impl tessera::gpu::GpuBackend for StallingBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn inventory(&self) -> tessera::gpu::Result<tessera::gpu::Inventory> {
        let stall = self.armed.lock().unwrap().take();
        if let Some(s) = stall {
            let _ = s.arrived.send(());
            let _ = s.release.recv_timeout(WAIT);
        }
        self.inner.inventory()
    }
    fn watch_health(&self, tx: tessera::gpu::HealthSender) -> tessera::gpu::Result<()> {
        self.inner.watch_health(tx)
    }
    fn apply_mig_layout(
        &self,
        gpu_uuid: &str,
        layout: &[(String, u8)],
    ) -> tessera::gpu::Result<Vec<tessera::gpu::MigDeviceInfo>> {
        self.inner.apply_mig_layout(gpu_uuid, layout)
    }
    fn set_time_slice(
        &self,
        gpu_uuid: &str,
        interval: tessera::gpu::TimeSlice,
    ) -> tessera::gpu::Result<()> {
        self.inner.set_time_slice(gpu_uuid, interval)
    }
}

/// A reload that would move GPU 1 to the device plugin while a claim on it is being
/// prepared (admitted, its checkpoint record not written yet) leaves GPU 1 with the
/// driver, reports the claim as its holder, and never lets the device plugin advertise
/// it; the claim prepares. Once the claim is gone, GPU 1 moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_a_claim_is_being_prepared_on_does_not_go_to_the_device_plugin() {
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let plugins = Kubelet::start(&dirs.kubelet_dir.join("device-plugins")).await;
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(StallingBackend {
        inner: FakeBackend::from_spec("3xL4").unwrap(),
        armed: std::sync::Mutex::new(None),
    });
    let uuids = gpu_uuids(backend.as_ref());
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[
            ("default", "version: v1\n"),
            ("split", "tessera: { dra: { gpus: { index: [1, 2] } } }\n"),
            ("moved", "tessera: { dra: { gpus: { index: [2] } } }\n"),
        ])
        .both_paths()
        .events_on_node(&api)
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    api.set_label("tessera.io/config", Some("split"));
    wait_dra(&api, &["gpu-1", "gpu-2"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[0]).await;
    // The claim on GPU 1; the stall below keeps its prepare between admission and record.
    let racer = put_claim(&api, "racer", &["gpu-1"]);

    let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *backend.armed.lock().unwrap() = Some(Stall {
        arrived: arrived_tx,
        release: release_rx,
    });
    let lists_before = plugins.state(GPU).unwrap().lists.len();
    let prepare = kubelet.prepare(DRIVER, std::slice::from_ref(&racer));
    let reload = async {
        tokio::time::timeout(WAIT, arrived).await.unwrap().unwrap();
        // Admitted, no record yet: only the driver's memory says the claim holds GPU 1.
        let recorded = tessera::dra::checkpoint::Store::new(&dirs.checkpoint_dir())
            .read()
            .unwrap();
        assert!(!recorded.claims.contains_key("uid-racer"), "{recorded:?}");
        // The claim is deallocated from the API server's view, so only the driver knows.
        assert!(api.delete_object(CLAIMS, "racer"));
        api.set_label("tessera.io/config", Some("moved"));
        let start = Instant::now();
        while !blocked_events(&api).iter().any(|e| {
            e.contains("GPU 1 ")
                && e.contains("claim ml/racer (uid uid-racer, preparing)")
                && e.contains("stays with the DRA driver")
        }) {
            assert!(start.elapsed() < WAIT, "events: {:?}", blocked_events(&api));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        release.send(()).unwrap();
    };
    let (out, ()) = tokio::join!(prepare, reload);
    let out = out.unwrap();
    // The GET happened before the delete: the claim prepares.
    assert!(out[&racer.uid].is_ok(), "{out:?}");
    assert!(dirs.claim_spec(&racer.uid).exists());
    wait_dra(&api, &["gpu-1", "gpu-2"], Slices::MayBeAbsent).await;
    let lists = plugins.state(GPU).unwrap().lists;
    assert!(
        lists[lists_before - 1..]
            .iter()
            .all(|l| l.iter().all(|d| d.id != uuids[1])),
        "the device plugin never advertised GPU 1"
    );

    // Unprepared: GPU 1 is free and moves.
    let un = kubelet
        .unprepare(DRIVER, std::slice::from_ref(&racer))
        .await
        .unwrap();
    assert!(un.values().all(|r| r.is_ok()), "{un:?}");
    wait_dra(&api, &["gpu-2"], Slices::MayBeAbsent).await;
    wait_dp(&plugins, &uuids, &[0, 1]).await;
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// The bytes of the DRA checkpoint's files (snapshot, log), read when called.
fn checkpoint_files(dirs: &NodeDirs) -> impl Fn() -> Vec<Vec<u8>> {
    let dir = dirs.checkpoint_dir();
    move || {
        ["checkpoint.json", "checkpoint.log"]
            .iter()
            .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
            .collect()
    }
}
