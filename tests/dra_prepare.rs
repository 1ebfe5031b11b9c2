//! NodePrepareResources / NodeUnprepareResources against the API-server double and the
//! fake GPUs: MIG instances created on demand and destroyed on unprepare, one CDI spec per
//! claim, the checkpoint's phases, idempotent retries, and clear per-claim errors (also
//! for claims on GPUs or devices the driver does not own or publish).

mod support;

use std::sync::Arc;

use serde_json::json;
use support::apiserver::ApiServer;
use tessera::deviceplugin::allocate::AllocateSettings;
use tessera::dra::checkpoint::{Phase, Store};
use tessera::dra::node::NodePreparer;
use tessera::dra::owned::{GpuSplit, OwnedDevices};
use tessera::dra::plugin::{ClaimPreparer, ClaimRef};
use tessera::dra::status_queue::StatusWriter;
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";

fn claim(name: &str, uid: &str, results: serde_json::Value) -> serde_json::Value {
    support::dra_agent::allocated_claim(name, uid, "gpu.tessera.io", results)
}

fn r(device: &str) -> serde_json::Value {
    json!({"request": "gpu", "driver": "gpu.tessera.io", "pool": "node-a", "device": device})
}

#[tokio::test]
async fn prepares_mig_and_vgpu_claims_and_undoes_them() {
    let api = ApiServer::empty().await;
    let mut vgpu = r("gpu-1-vgpu");
    vgpu["consumedCapacity"] = json!({"memory": "16Gi", "cores": "25"});
    api.put_object(
        CLAIMS,
        claim("train", "uid-1", json!([r("gpu-0-mig-3g-40gb-4"), vgpu])),
    );
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let c = ClaimRef {
        namespace: "ml".into(),
        name: "train".into(),
        uid: "uid-1".into(),
    };
    let out = p.prepare(vec![c.clone()]).await;
    let devices = out["uid-1"].as_ref().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(
        devices[0].cdi_device_ids,
        vec!["tessera.io/gpu=uid-1-gpu-0-mig-3g-40gb-4"]
    );

    // The MIG instance exists and the CDI spec points the container at it.
    let inv = backend.inventory().unwrap();
    let mig = &inv.gpus[0].mig_devices;
    assert_eq!(mig.len(), 1);
    assert_eq!((mig[0].profile.as_str(), mig[0].start), ("3g.40gb", 4));
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(tmp.path().join("cdi/tessera.io-claim-uid-1.json")).unwrap(),
    )
    .unwrap();
    let env: Vec<&str> = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let visible = format!(
        "NVIDIA_VISIBLE_DEVICES={},{}",
        mig[0].uuid, inv.gpus[1].uuid
    );
    assert!(env.contains(&visible.as_str()), "{env:?}");
    assert!(
        env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_1=16384m"),
        "{env:?}"
    );
    // The MIG device carries its GPU-instance and compute-instance access nodes (driver
    // table: 3 + 135 x GPU minor + 9 x GI id, the CI 1 + CI id after it).
    let gi_minor = 3 + 135 * inv.gpus[0].minor + 9 * mig[0].gi_id;
    let nodes = &spec["devices"][0]["containerEdits"]["deviceNodes"];
    assert_eq!(
        nodes,
        &json!([
            {"path": format!("/dev/nvidia{}", inv.gpus[0].minor)},
            {"path": format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"), "type": "c", "major": 508, "minor": gi_minor},
            {"path": format!("/dev/nvidia-caps/nvidia-cap{}", gi_minor + 1 + mig[0].ci_id), "type": "c", "major": 508, "minor": gi_minor + 1 + mig[0].ci_id},
        ])
    );
    assert_eq!(
        spec["devices"][1]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "no caps for a vGPU slice"
    );
    // The claim's vGPU limits: an agent-written read-only file the CDI spec mounts.
    let claim_dir = tmp.path().join("state/vgpu/claim-uid-1");
    let limits = std::fs::read_to_string(claim_dir.join("limits")).unwrap();
    assert!(
        limits.contains("CUDA_DEVICE_MEMORY_LIMIT_1=16384m\n"),
        "{limits}"
    );
    let mounts = &spec["containerEdits"]["mounts"];
    assert!(
        mounts
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["containerPath"] == "/etc/tessera"
                && m["hostPath"] == claim_dir.to_str().unwrap()
                && m["options"][0] == "ro"),
        "{mounts}"
    );
    let cp = p.checkpoint.read().unwrap();
    assert_eq!(cp.claims["uid-1"].phase, Phase::Completed);

    // A retry is answered from the checkpoint: no second instance.
    let again = p.prepare(vec![c.clone()]).await;
    assert_eq!(again["uid-1"].as_ref().unwrap(), devices);
    assert_eq!(backend.inventory().unwrap().gpus[0].mig_devices.len(), 1);

    // Unprepare removes the instance, the spec and the record; twice is fine.
    for _ in 0..2 {
        let u = p.unprepare(vec![c.clone()]).await;
        assert!(u["uid-1"].is_ok(), "{u:?}");
    }
    assert!(backend.inventory().unwrap().gpus[0].mig_devices.is_empty());
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-1.json").exists());
    assert!(
        !claim_dir.exists(),
        "the claim's limits and accounting go with it"
    );
    assert!(p.checkpoint.read().unwrap().claims.is_empty());
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn a_vgpu_claim_is_refused_without_the_installed_shim() {
    let api = ApiServer::empty().await;
    let mut vgpu = r("gpu-1-vgpu");
    vgpu["consumedCapacity"] = json!({"memory": "16Gi", "cores": "25"});
    api.put_object(CLAIMS, claim("infer", "uid-9", json!([vgpu])));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend, tmp.path(), "boot-1");
    std::fs::remove_file(&p.settings.shim.host_path).unwrap();
    let c = ClaimRef {
        namespace: "ml".into(),
        name: "infer".into(),
        uid: "uid-9".into(),
    };
    let out = p.prepare(vec![c]).await;
    let e = out["uid-9"].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("vGPU refused") && e.contains("not installed"),
        "{e}"
    );
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-9.json").exists());
}

#[tokio::test]
async fn bad_claims_get_per_claim_errors_and_change_nothing() {
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        claim(
            "other-node",
            "uid-2",
            json!([{"request": "gpu",
        "driver": "gpu.tessera.io", "pool": "node-b", "device": "gpu-0"}]),
        ),
    );
    api.put_object(CLAIMS, claim("good", "uid-3", json!([r("gpu-1")])));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let refs = |name: &str, uid: &str| ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let out = p
        .prepare(vec![
            refs("other-node", "uid-2"),
            refs("missing", "uid-9"),
            refs("good", "uid-wrong"),
            refs("good", "uid-3"),
        ])
        .await;
    assert!(out["uid-2"]
        .as_ref()
        .unwrap_err()
        .contains("not this node's"));
    assert!(out["uid-9"]
        .as_ref()
        .unwrap_err()
        .contains("cannot read claim ml/missing"));
    assert!(out["uid-wrong"]
        .as_ref()
        .unwrap_err()
        .contains("does not match"));
    assert_eq!(
        out["uid-3"].as_ref().unwrap().len(),
        1,
        "good claims still prepare"
    );
    let cp = p.checkpoint.read().unwrap();
    assert_eq!(cp.claims.keys().collect::<Vec<_>>(), vec!["uid-3"]);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

fn preparer(
    api: &ApiServer,
    backend: Arc<FakeBackend>,
    root: &std::path::Path,
    boot: &str,
) -> NodePreparer {
    let settings = AllocateSettings {
        mig_caps: tessera::cdi::migcaps::write_synthetic(&root.join("proc"), 2, 508).unwrap(),
        ..AllocateSettings::with_state_dir(root.join("state"))
    };
    // A stand-in for the shim library the agent installs at start (vGPU needs one).
    let stand_in = root.join("libtessera_cuda.so");
    std::fs::write(&stand_in, b"stand-in for libtessera_cuda.so").unwrap();
    settings
        .shim
        .install(&stand_in, &settings.shim_container_path)
        .unwrap();
    NodePreparer {
        client: api.client(),
        node: "node-a".into(),
        checkpoint: Store::new(&root.join("state")),
        cdi_root: root.join("cdi"),
        settings,
        boot_id: boot.into(),
        // Every device of every GPU: these tests are about preparing, not the split.
        owned: OwnedDevices::every_device_of(&backend.inventory().unwrap()),
        backend,
        status: StatusWriter::new(api.client(), "node-a"),
    }
}

#[tokio::test]
async fn crash_between_steps_is_rolled_back_and_reboot_reprepares() {
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        claim("train", "uid-1", json!([r("gpu-0-mig-3g-40gb-4")])),
    );
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let c = ClaimRef {
        namespace: "ml".into(),
        name: "train".into(),
        uid: "uid-1".into(),
    };

    // Simulate a crash after the MIG instance was created but before Completed: prepare,
    // then rewrite the record as Started (what the file holds mid-prepare).
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    p.prepare(vec![c.clone()]).await["uid-1"].as_ref().unwrap();
    let mut data = p.checkpoint.read().unwrap();
    data.claims.get_mut("uid-1").unwrap().phase = Phase::Started;
    p.checkpoint.write(&data).unwrap();
    assert_eq!(backend.inventory().unwrap().gpus[0].mig_devices.len(), 1);

    // The restarted agent rolls it back: instance destroyed, spec removed, record gone.
    let restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let loaded = restarted.recover().unwrap();
    assert_eq!(loaded.rollback.len(), 1);
    assert!(backend.inventory().unwrap().gpus[0].mig_devices.is_empty());
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-1.json").exists());
    assert!(restarted.checkpoint.read().unwrap().claims.is_empty());

    // The kubelet retries: prepared again from scratch.
    restarted.prepare(vec![c.clone()]).await["uid-1"]
        .as_ref()
        .unwrap();
    assert_eq!(
        restarted.checkpoint.read().unwrap().claims["uid-1"].phase,
        Phase::Completed
    );

    // Reboot: MIG instances and /var/run/cdi are gone with it; the claim is kept and
    // prepared again on the next request instead of failing.
    let fresh_gpus = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    std::fs::remove_dir_all(tmp.path().join("cdi")).unwrap();
    let after_boot = preparer(&api, fresh_gpus.clone(), tmp.path(), "boot-2");
    let loaded = after_boot.recover().unwrap();
    assert!(loaded.rebooted);
    assert_eq!(loaded.data.claims["uid-1"].phase, Phase::NeedsReprepare);
    after_boot.prepare(vec![c.clone()]).await["uid-1"]
        .as_ref()
        .unwrap();
    assert_eq!(fresh_gpus.inventory().unwrap().gpus[0].mig_devices.len(), 1);
    assert!(tmp.path().join("cdi/tessera.io-claim-uid-1.json").exists());

    // A corrupt checkpoint is reported and replaced, not a crash loop.
    std::fs::write(tmp.path().join("state/checkpoint.json"), b"{ not json").unwrap();
    let loaded = preparer(&api, fresh_gpus, tmp.path(), "boot-2")
        .recover()
        .unwrap();
    assert!(loaded.data.claims.is_empty());
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// `status.devices` of claim `name` once `p`'s queued status writes are done (they are
/// written after the kubelet's answer).
async fn status_devices(p: &NodePreparer, api: &ApiServer, name: &str) -> Vec<serde_json::Value> {
    assert_eq!(p.status.flush(std::time::Duration::from_secs(10)).await, 0);
    stored_status_devices(api, name)
}

fn stored_status_devices(api: &ApiServer, name: &str) -> Vec<serde_json::Value> {
    api.objects(CLAIMS)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .and_then(|o| o["status"]["devices"].as_array().cloned())
        .unwrap_or_default()
}

fn ready(entry: &serde_json::Value) -> (&str, &str) {
    let c = &entry["conditions"][0];
    assert_eq!(c["type"], "Ready");
    (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
}

#[tokio::test]
async fn claim_status_devices_are_reported_kept_for_others_and_cleared() {
    let api = ApiServer::empty().await;
    let nic =
        json!({"request": "nic", "driver": "nic.example.com", "pool": "node-a", "device": "eth1"});
    let mut vgpu = r("gpu-1-vgpu");
    vgpu["consumedCapacity"] = json!({"memory": "8Gi", "cores": "20"});
    vgpu["shareID"] = json!("8e7acdf9-0290-4ecd-a801-a654b021d2b7");
    let mut object = claim(
        "mixed",
        "uid-s",
        json!([r("gpu-0-mig-1g-10gb-6"), vgpu, nic]),
    );
    object["spec"]["devices"]["requests"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}));
    // Another driver already reported its device.
    let nic_status = json!({"driver": "nic.example.com", "pool": "node-a", "device": "eth1",
        "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.7/24"]}});
    object["status"]["devices"] = json!([nic_status]);
    api.put_object(CLAIMS, object);
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let c = ClaimRef {
        namespace: "ml".into(),
        name: "mixed".into(),
        uid: "uid-s".into(),
    };
    p.prepare(vec![c.clone()]).await["uid-s"].as_ref().unwrap();
    let devices = status_devices(&p, &api, "mixed").await;
    assert!(
        api.requests().iter().any(|r| r
            .starts_with("PUT /apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/mixed/status")),
        "written through the status subresource"
    );
    assert_eq!(devices.len(), 3, "{devices:#?}");
    assert_eq!(devices[0], nic_status, "the other driver's entry is kept");
    let mig = &devices[1];
    assert_eq!(ready(mig), ("True", "Prepared"));
    let created = &backend.inventory().unwrap().gpus[0].mig_devices[0];
    assert_eq!(mig["data"]["uuid"], created.uuid.as_str());
    assert_eq!(mig["data"]["profile"], "1g.10gb");
    let v = &devices[2];
    assert_eq!(v["shareID"], "8e7acdf9-0290-4ecd-a801-a654b021d2b7");
    assert_eq!(v["data"]["memory"], "8192Mi");
    assert_eq!(v["data"]["cores"], 20);
    assert!(v.get("networkData").is_none());

    // What the driver wrote is a valid ResourceClaim for both supported versions.
    let stored = api
        .objects(CLAIMS)
        .into_iter()
        .find(|o| o["metadata"]["name"] == "mixed")
        .unwrap();
    support::schema::validate(&stored, &["1.34.0", "1.35.0"]);

    // Unprepare withdraws only ours.
    p.unprepare(vec![c]).await["uid-s"].as_ref().unwrap();
    assert_eq!(status_devices(&p, &api, "mixed").await, vec![nic_status]);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn failed_prepare_reports_ready_false_and_gate_off_is_survived() {
    let api = ApiServer::empty().await;
    // A MIG placement the A100 does not have (never published): refused after the claim
    // was read.
    api.put_object(
        CLAIMS,
        claim("bad", "uid-b", json!([r("gpu-0-mig-3g-40gb-1")])),
    );
    api.put_object(CLAIMS, claim("fine", "uid-f", json!([r("gpu-1")])));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend, tmp.path(), "boot-1");
    let refs = |name: &str, uid: &str| ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let out = p.prepare(vec![refs("bad", "uid-b")]).await;
    let err = out["uid-b"].as_ref().unwrap_err();
    let devices = status_devices(&p, &api, "bad").await;
    assert_eq!(devices.len(), 1);
    assert_eq!(ready(&devices[0]), ("False", "PrepareFailed"));
    assert_eq!(devices[0]["conditions"][0]["message"], err.as_str());
    let stored = api
        .objects(CLAIMS)
        .into_iter()
        .find(|o| o["metadata"]["name"] == "bad")
        .unwrap();
    support::schema::validate(&stored, &["1.34.0", "1.35.0"]);

    // An API server with DRAResourceClaimDeviceStatus off drops the field: the claim is
    // still prepared.
    api.drop_field("status.devices");
    let out = p.prepare(vec![refs("fine", "uid-f")]).await;
    assert_eq!(out["uid-f"].as_ref().unwrap().len(), 1);
    assert!(status_devices(&p, &api, "fine").await.is_empty());
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

fn time_sliced(
    name: &str,
    uid: &str,
    device: serde_json::Value,
    interval: &str,
) -> serde_json::Value {
    let mut c = claim(name, uid, json!([device]));
    c["status"]["allocation"]["devices"]["config"] = json!([
        {"source": "FromClass", "opaque": {"driver": "gpu.tessera.io", "parameters":
            {"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuConfig",
             "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}}},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.tessera.io", "parameters":
            {"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuConfig",
             "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}}}}
    ]);
    c
}

#[tokio::test]
async fn time_slicing_is_applied_recorded_checked_and_restored() {
    use tessera::gpu::TimeSlice;
    let api = ApiServer::empty().await;
    let vgpu = |n: &str| {
        let mut d = r("gpu-1-vgpu");
        d["consumedCapacity"] = json!({"memory": n, "cores": "10"});
        d
    };
    api.put_object(CLAIMS, time_sliced("shared", "uid-t", r("gpu-0"), "Short"));
    api.put_object(CLAIMS, time_sliced("v1", "uid-v1", vgpu("4Gi"), "Medium"));
    api.put_object(CLAIMS, time_sliced("v2", "uid-v2", vgpu("4Gi"), "Medium"));
    api.put_object(CLAIMS, time_sliced("v3", "uid-v3", vgpu("4Gi"), "Long"));
    api.put_object(CLAIMS, time_sliced("typo", "uid-x", r("gpu-0"), "Shrot"));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xL4").unwrap());
    let gpus = backend.inventory().unwrap().gpus;
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let refs = |name: &str, uid: &str| ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };

    // Three pods share claim "shared": the kubelet prepares it once per pod start; the
    // first sets the interval (the claim's entry beats the class's), the rest are answered
    // from the checkpoint.
    let first = p.prepare(vec![refs("shared", "uid-t")]).await;
    for _ in 0..2 {
        let again = p.prepare(vec![refs("shared", "uid-t")]).await;
        assert_eq!(again["uid-t"], first["uid-t"]);
    }
    assert_eq!(backend.time_slice(&gpus[0].uuid), TimeSlice::Short);
    let cp = p.checkpoint.read().unwrap();
    let rec = cp.claims["uid-t"].devices[0].time_slice.clone().unwrap();
    assert_eq!(
        (rec.gpu_uuid.as_str(), rec.interval),
        (gpus[0].uuid.as_str(), TimeSlice::Short)
    );
    assert_eq!(
        status_devices(&p, &api, "shared").await[0]["data"]["timeSlice"],
        "Short"
    );

    // Two vGPU claims on one GPU agreeing on the interval; a third disagreeing is refused
    // before any side effect.
    let out = p
        .prepare(vec![
            refs("v1", "uid-v1"),
            refs("v2", "uid-v2"),
            refs("v3", "uid-v3"),
        ])
        .await;
    assert!(out["uid-v1"].is_ok() && out["uid-v2"].is_ok(), "{out:?}");
    let e = out["uid-v3"].as_ref().unwrap_err();
    assert!(e.contains("time-sliced Medium by claim ml/v"), "{e}");
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-v3.json").exists());
    assert_eq!(backend.time_slice(&gpus[1].uuid), TimeSlice::Medium);

    // A typo in the interval: a per-claim error naming the field, nothing prepared.
    let out = p.prepare(vec![refs("typo", "uid-x")]).await;
    let e = out["uid-x"].as_ref().unwrap_err();
    assert!(
        e.contains("config[1]") && e.contains("timeSlicing.interval") && e.contains("Shrot"),
        "{e}"
    );
    assert!(!p.checkpoint.read().unwrap().claims.contains_key("uid-x"));
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-x.json").exists());
    assert_eq!(
        ready(&status_devices(&p, &api, "typo").await[0]),
        ("False", "PrepareFailed")
    );

    // The default comes back only when the last claim time-slicing the GPU is unprepared.
    p.unprepare(vec![refs("v1", "uid-v1")]).await["uid-v1"]
        .as_ref()
        .unwrap();
    assert_eq!(backend.time_slice(&gpus[1].uuid), TimeSlice::Medium);
    p.unprepare(vec![refs("v2", "uid-v2")]).await["uid-v2"]
        .as_ref()
        .unwrap();
    assert_eq!(backend.time_slice(&gpus[1].uuid), TimeSlice::Default);
    // Now the third claim fits.
    assert!(p.prepare(vec![refs("v3", "uid-v3")]).await["uid-v3"].is_ok());
    assert_eq!(backend.time_slice(&gpus[1].uuid), TimeSlice::Long);

    // A crash after the interval was set is rolled back to the default.
    let mut data = p.checkpoint.read().unwrap();
    data.claims.get_mut("uid-t").unwrap().phase = Phase::Started;
    p.checkpoint.write(&data).unwrap();
    preparer(&api, backend.clone(), tmp.path(), "boot-1")
        .recover()
        .unwrap();
    assert_eq!(backend.time_slice(&gpus[0].uuid), TimeSlice::Default);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn time_slicing_a_mig_device_is_refused() {
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        time_sliced("m", "uid-m", r("gpu-0-mig-1g-10gb-0"), "Short"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("1xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let out = p
        .prepare(vec![ClaimRef {
            namespace: "ml".into(),
            name: "m".into(),
            uid: "uid-m".into(),
        }])
        .await;
    let e = out["uid-m"].as_ref().unwrap_err();
    assert!(
        e.contains("MIG device") && e.contains("time-slicing"),
        "{e}"
    );
    assert!(backend.inventory().unwrap().gpus[0].mig_devices.is_empty());
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn status_write_retries_conflicts_and_keeps_concurrent_writes() {
    let api = ApiServer::empty().await;
    api.put_object(CLAIMS, claim("busy", "uid-c", json!([r("gpu-0")])));
    // Two other clients write the claim between the driver's read and its status PUT: a
    // NIC driver adds its entry, then someone labels the claim.
    let nic = json!({"driver": "nic.example.com", "pool": "node-a", "device": "eth1"});
    let nic2 = nic.clone();
    api.before_next_status_put(move |o| o["status"]["devices"] = json!([nic2]));
    api.before_next_status_put(|o| o["metadata"]["labels"] = json!({"team": "ml"}));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("1xL4").unwrap());
    let p = preparer(&api, backend, tmp.path(), "boot-1");
    let c = ClaimRef {
        namespace: "ml".into(),
        name: "busy".into(),
        uid: "uid-c".into(),
    };
    p.prepare(vec![c]).await["uid-c"].as_ref().unwrap();
    let devices = status_devices(&p, &api, "busy").await;
    let puts = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains("/busy/status"))
        .count();
    assert_eq!(puts, 3, "two conflicts, then success");
    assert_eq!(devices.len(), 2, "{devices:#?}");
    assert_eq!(devices[0], nic, "the concurrent entry survived the retry");
    assert_eq!(ready(&devices[1]), ("True", "Prepared"));
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn mig_claim_without_the_driver_caps_table_fails_clearly() {
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        claim("train", "uid-1", json!([r("gpu-0-mig-1g-10gb-0")])),
    );
    api.put_object(CLAIMS, claim("whole", "uid-2", json!([r("gpu-1")])));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    std::fs::remove_file(&p.settings.mig_caps.mig_minors).unwrap();
    let refs = ["train", "whole"].map(|n| ClaimRef {
        namespace: "ml".into(),
        name: n.into(),
        uid: if n == "train" { "uid-1" } else { "uid-2" }.into(),
    });
    let out = p.prepare(refs.to_vec()).await;
    let e = out["uid-1"].as_ref().unwrap_err();
    assert!(
        e.contains("capability") && e.contains("mig-minors"),
        "names the missing table: {e}"
    );
    // Nothing half-done: no instance, no spec; a whole-GPU claim still prepares.
    assert!(backend.inventory().unwrap().gpus[0].mig_devices.is_empty());
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-1.json").exists());
    assert!(out["uid-2"].is_ok(), "{out:?}");
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn start_destroys_unowned_mig_on_dra_gpus_and_recover_keeps_an_unchanged_file() {
    use std::os::unix::fs::MetadataExt;
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        claim("train", "uid-1", json!([r("gpu-0-mig-3g-40gb-4")])),
    );
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    p.prepare(vec![ClaimRef {
        namespace: "ml".into(),
        name: "train".into(),
        uid: "uid-1".into(),
    }])
    .await["uid-1"]
        .as_ref()
        .unwrap();
    let uuids: Vec<String> = backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    // Left behind by someone else (an earlier device-plugin layout): one more instance on
    // DRA GPU 0 next to the claim's, and one on GPU 1, which DRA does not own here.
    let mut gpu0: Vec<(String, u8)> = vec![("3g.40gb".into(), 4), ("1g.10gb".into(), 0)];
    backend.apply_mig_layout(&uuids[0], &gpu0).unwrap();
    backend
        .apply_mig_layout(&uuids[1], &[("7g.80gb".into(), 0)])
        .unwrap();
    let migs = |i: usize| -> Vec<(String, u8)> {
        backend.inventory().unwrap().gpus[i]
            .mig_devices
            .iter()
            .map(|m| (m.profile.clone(), m.start))
            .collect()
    };
    assert_eq!(migs(0).len(), 2);

    // The first start folds the prepare's log records into the snapshot; the next one,
    // with nothing changed, rewrites neither file.
    let first = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    first.recover().unwrap();
    drop(first);
    let restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let file = tmp.path().join("state/checkpoint.json");
    let log = tmp.path().join("state/checkpoint.log");
    let inode = std::fs::metadata(&file).unwrap().ino();
    let log_before = std::fs::read(&log).unwrap();
    let loaded = restarted.recover().unwrap();
    assert!(loaded.rollback.is_empty() && !loaded.rebooted);
    assert_eq!(
        std::fs::metadata(&file).unwrap().ino(),
        inode,
        "nothing changed: the checkpoint is not rewritten"
    );
    assert_eq!(std::fs::read(&log).unwrap(), log_before, "nor its log");
    let dra: std::collections::BTreeSet<String> = [uuids[0].clone()].into();
    assert_eq!(restarted.destroy_unowned_migs(&dra).unwrap(), 1);
    gpu0.truncate(1);
    assert_eq!(migs(0), gpu0, "the claim's instance stays");
    assert_eq!(migs(1), vec![("7g.80gb".to_string(), 0)], "not a DRA GPU");
    assert_eq!(restarted.destroy_unowned_migs(&dra).unwrap(), 0);

    // A new boot ID does change the checkpoint: it is written.
    let rebooted = preparer(&api, backend.clone(), tmp.path(), "boot-2");
    assert!(rebooted.recover().unwrap().rebooted);
    assert_ne!(std::fs::metadata(&file).unwrap().ino(), inode);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn a_lost_started_record_leaves_nothing_behind_after_the_start_up_sweep() {
    // The `Started` record is written but not fsynced, the directory not fsynced after a
    // rename: a power loss can take the newest records with it. What their prepares left
    // on disk or on the GPUs is found at start without them: CDI specs of claims the
    // checkpoint does not hold as Completed, MIG instances no claim owns.
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        claim("train", "uid-1", json!([r("gpu-0-mig-3g-40gb-4")])),
    );
    api.put_object(CLAIMS, claim("keep", "uid-2", json!([r("gpu-1")])));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let refs = |name: &str, uid: &str| ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    assert!(p.prepare(vec![refs("keep", "uid-2")]).await["uid-2"].is_ok());
    let file = tmp.path().join("state/checkpoint.json");
    let log = tmp.path().join("state/checkpoint.log");
    let before_train = (std::fs::read(&file).unwrap(), std::fs::read(&log).unwrap());
    assert!(p.prepare(vec![refs("train", "uid-1")]).await["uid-1"].is_ok());
    drop(p);
    // The records of "train" are lost; its instance and spec are not.
    std::fs::write(&file, before_train.0).unwrap();
    std::fs::write(&log, before_train.1).unwrap();
    let cdi = tmp.path().join("cdi");
    std::fs::write(cdi.join("tessera.io-gpu.json"), "{}").unwrap();
    std::fs::write(cdi.join("vendor.example.com-nic.json"), "{}").unwrap();
    std::fs::write(cdi.join(".tessera.io-claim-uid-7.json.tmp"), "{").unwrap();

    let restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    restarted.recover().unwrap();
    let gpus: std::collections::BTreeSet<String> = support::dra_pool::gpu_uuids(backend.as_ref())
        .into_iter()
        .collect();
    assert_eq!(restarted.destroy_unowned_migs(&gpus).unwrap(), 1);
    assert!(backend.inventory().unwrap().gpus[0].mig_devices.is_empty());
    let mut left: Vec<String> = std::fs::read_dir(&cdi)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "tessera.io-claim-uid-2.json",
            "tessera.io-gpu.json",
            "vendor.example.com-nic.json"
        ],
        "only the orphans are removed"
    );
    // The kubelet retries "train": prepared again from scratch.
    assert!(restarted.prepare(vec![refs("train", "uid-1")]).await["uid-1"].is_ok());
    assert_eq!(backend.inventory().unwrap().gpus[0].mig_devices.len(), 1);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn concurrent_prepares_lose_no_entry_and_create_no_instance_twice() {
    let api = ApiServer::empty().await;
    // 2 GPUs × 7 one-slice MIG placements, and the same claim asked for 4 more times.
    let mut refs = Vec::new();
    for i in 0..14u32 {
        let (name, uid) = (format!("c{i}"), format!("uid-c{i}"));
        let device = format!("gpu-{}-mig-1g-10gb-{}", i / 7, i % 7);
        api.put_object(CLAIMS, claim(&name, &uid, json!([r(&device)])));
        refs.push(ClaimRef {
            namespace: "ml".into(),
            name,
            uid,
        });
    }
    for _ in 0..4 {
        refs.push(refs[0].clone());
    }
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = Arc::new(preparer(&api, backend.clone(), tmp.path(), "boot-1"));
    let calls = refs.iter().cloned().map(|c| {
        let p = p.clone();
        tokio::spawn(async move { p.prepare(vec![c]).await })
    });
    let mut answers = std::collections::BTreeMap::new();
    for out in futures::future::join_all(calls).await {
        for (uid, r) in out.unwrap() {
            let devices = r.unwrap();
            if let Some(earlier) = answers.insert(uid, devices.clone()) {
                assert_eq!(earlier, devices, "the same claim gets the same answer");
            }
        }
    }
    assert_eq!(answers.len(), 14);
    let cp = p.checkpoint.read().unwrap();
    assert_eq!(cp.claims.len(), 14, "no lost checkpoint entry");
    assert!(cp.claims.values().all(|c| c.phase == Phase::Completed));
    let inv = backend.inventory().unwrap();
    let instances: Vec<usize> = inv.gpus.iter().map(|g| g.mig_devices.len()).collect();
    assert_eq!(instances, [7, 7], "one instance per claim, none twice");
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// What the driver owns as the agent sets it after a reload: GPU 0 on the DRA driver
/// (partitionable, two placements published), GPU 1 moved to the device plugin.
fn owned_after_reload(inv: &tessera::gpu::Inventory) -> OwnedDevices {
    let split = |gpu1_dra: bool| {
        vec![
            GpuSplit {
                index: 0,
                uuid: inv.gpus[0].uuid.clone(),
                dra: true,
            },
            GpuSplit {
                index: 1,
                uuid: inv.gpus[1].uuid.clone(),
                dra: gpu1_dra,
            },
        ]
    };
    let owned = OwnedDevices::new();
    owned.set_split(&split(true), "the agent's start (config \"a\")");
    owned.set_split(
        &split(false),
        "the config reload applied at T (config \"b\")",
    );
    owned.publish(["gpu-0", "gpu-0-mig-3g-40gb-4", "gpu-0-mig-1g-10gb-0"].map(String::from));
    owned
}

#[tokio::test]
async fn claims_outside_the_drivers_gpus_or_slices_are_refused_and_change_nothing() {
    let api = ApiServer::empty().await;
    for (name, uid, devices) in [
        ("kept", "uid-k", vec!["gpu-0-mig-1g-10gb-0"]),
        ("moved", "uid-m", vec!["gpu-1"]),
        ("typo", "uid-t", vec!["gpu-3-mig-1g.10gb-0"]),
        ("stale", "uid-s", vec!["gpu-0-mig-3g-40gb-0"]),
        ("half", "uid-h", vec!["gpu-0-mig-3g-40gb-4", "gpu-1"]),
        ("fresh", "uid-f", vec!["gpu-0-mig-3g-40gb-4"]),
        ("late", "uid-l", vec!["gpu-0"]),
    ] {
        let results: Vec<_> = devices.into_iter().map(r).collect();
        api.put_object(CLAIMS, claim(name, uid, json!(results)));
    }
    let refs = |list: &[(&str, &str)]| -> Vec<ClaimRef> {
        list.iter()
            .map(|(name, uid)| ClaimRef {
                namespace: "ml".into(),
                name: name.to_string(),
                uid: uid.to_string(),
            })
            .collect()
    };
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let inv = backend.inventory().unwrap();
    let mut p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    p.owned = owned_after_reload(&inv);
    let out = p.prepare(refs(&[("kept", "uid-k")])).await;
    assert!(out["uid-k"].is_ok(), "{out:?}");
    let checkpoint = || {
        ["checkpoint.json", "checkpoint.log"]
            .map(|f| std::fs::read(tmp.path().join("state").join(f)).unwrap())
    };
    let before = checkpoint();

    // Refused, each with its reason; nothing created, the checkpoint file untouched.
    let out = p
        .prepare(refs(&[
            ("moved", "uid-m"),
            ("typo", "uid-t"),
            ("stale", "uid-s"),
            ("half", "uid-h"),
        ]))
        .await;
    let err = |uid: &str| out[uid].as_ref().unwrap_err().clone();
    let moved = format!(
        "claim ml/moved: device gpu-1: {} (GPU 1) is served by the device-plugin path since the config reload applied at T (config \"b\")",
        inv.gpus[1].uuid
    );
    assert!(err("uid-m").starts_with(&moved), "{}", err("uid-m"));
    assert!(
        err("uid-t").contains("device gpu-3-mig-1g.10gb-0 is not published by this node"),
        "{}",
        err("uid-t")
    );
    assert!(
        err("uid-s").contains(&format!(
            "device gpu-0-mig-3g-40gb-0 is not published by this node (GPU 0 ({}) has no such device in its current layout)",
            inv.gpus[0].uuid
        )),
        "{}",
        err("uid-s")
    );
    assert!(err("uid-h").contains("device gpu-1: "), "{}", err("uid-h"));
    assert!(checkpoint() == before, "snapshot and log unchanged");
    for uid in ["uid-m", "uid-t", "uid-s", "uid-h"] {
        assert!(!tmp
            .path()
            .join(format!("cdi/tessera.io-claim-{uid}.json"))
            .exists());
    }
    let migs = |b: &FakeBackend| -> Vec<usize> {
        b.inventory()
            .unwrap()
            .gpus
            .iter()
            .map(|g| g.mig_devices.len())
            .collect()
    };
    assert_eq!(migs(&backend), [1, 0], "only the kept claim's instance");

    // A refused claim does not hold back the others of its request.
    let out = p
        .prepare(refs(&[("moved", "uid-m"), ("fresh", "uid-f")]))
        .await;
    assert!(out["uid-m"].is_err());
    assert_eq!(out["uid-f"].as_ref().unwrap().len(), 1);
    let cp = p.checkpoint.read().unwrap();
    assert_eq!(cp.claims.keys().collect::<Vec<_>>(), ["uid-f", "uid-k"]);
    assert_eq!(migs(&backend), [2, 0]);

    // Prepared claims are prepared again after a restart and after a reboot, whatever
    // the split says by then (a real agent keeps their GPU with the driver anyway); a
    // new claim is held to the split.
    let gone = OwnedDevices::new();
    gone.set_split(
        &[0, 1].map(|i| GpuSplit {
            index: i,
            uuid: inv.gpus[i as usize].uuid.clone(),
            dra: false,
        }),
        "later",
    );
    gone.publish(Vec::new());
    let mut restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    restarted.owned = gone.clone();
    restarted.recover().unwrap();
    let again = restarted.prepare(refs(&[("kept", "uid-k")])).await;
    assert!(again["uid-k"].is_ok(), "{again:?}");
    let fresh_gpus = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    std::fs::remove_dir_all(tmp.path().join("cdi")).unwrap();
    let mut rebooted = preparer(&api, fresh_gpus.clone(), tmp.path(), "boot-2");
    rebooted.owned = gone;
    assert!(rebooted.recover().unwrap().rebooted);
    let out = rebooted
        .prepare(refs(&[
            ("kept", "uid-k"),
            ("fresh", "uid-f"),
            ("late", "uid-l"),
        ]))
        .await;
    assert!(out["uid-k"].is_ok() && out["uid-f"].is_ok(), "{out:?}");
    assert!(out["uid-l"]
        .as_ref()
        .unwrap_err()
        .contains("is served by the device-plugin path since later"));
    assert_eq!(migs(&fresh_gpus), [2, 0]);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// Offsets just past each record of the checkpoint log under `state`.
fn log_record_ends(state: &std::path::Path) -> Vec<usize> {
    let bytes = std::fs::read(state.join("checkpoint.log")).unwrap();
    let mut out = Vec::new();
    let mut pos = tessera::dra::checkpoint::log::HEADER_LEN as usize;
    while bytes[pos] != 0 {
        pos += bytes[pos..].iter().position(|&b| b == b'\n').unwrap() + 1;
        out.push(pos);
    }
    out
}

#[tokio::test]
async fn a_torn_or_corrupt_log_record_is_recovered_from_at_start() {
    // The checkpoint's log after a crash: (1) the `Completed` record of a MIG claim torn
    // (the crash hit its write): the claim reads as `Started` and is rolled back, then
    // prepared again on the kubelet's retry; (2) a damaged record with good ones after it
    // (not a crash): reported, the checkpoint starts empty, and the start-up sweep removes
    // what no record holds (never a crash loop).
    let api = ApiServer::empty().await;
    api.put_object(
        CLAIMS,
        claim("train", "uid-1", json!([r("gpu-0-mig-3g-40gb-4")])),
    );
    api.put_object(CLAIMS, claim("keep", "uid-2", json!([r("gpu-1")])));
    let refs = |name: &str, uid: &str| ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let p = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    p.recover().unwrap();
    assert!(p.prepare(vec![refs("keep", "uid-2")]).await["uid-2"].is_ok());
    assert!(p.prepare(vec![refs("train", "uid-1")]).await["uid-1"].is_ok());
    drop(p);
    let ends = log_record_ends(&state);
    assert_eq!(ends.len(), 4, "Started + Completed per claim");
    let intact = std::fs::read(state.join("checkpoint.log")).unwrap();

    // (1) Torn: half of train's Completed record reached the file.
    let mut torn = intact.clone();
    torn[ends[2] + 40..ends[3] + 1].fill(0);
    std::fs::write(state.join("checkpoint.log"), &torn).unwrap();
    let restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let loaded = restarted.recover().unwrap();
    assert_eq!(loaded.rollback.len(), 1);
    assert_eq!(loaded.rollback[0].0, "uid-1");
    assert!(backend.inventory().unwrap().gpus[0].mig_devices.is_empty());
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-1.json").exists());
    assert!(tmp.path().join("cdi/tessera.io-claim-uid-2.json").exists());
    assert!(restarted.prepare(vec![refs("train", "uid-1")]).await["uid-1"].is_ok());
    assert_eq!(backend.inventory().unwrap().gpus[0].mig_devices.len(), 1);
    let cp = restarted.checkpoint.read().unwrap();
    assert_eq!(cp.claims["uid-1"].phase, Phase::Completed);
    assert_eq!(cp.claims["uid-2"].phase, Phase::Completed);
    drop(restarted);

    // (2) Corrupt: a flipped byte in the first record after the header, good records
    // after it.
    let restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    restarted.recover().unwrap();
    api.put_object(CLAIMS, claim("later", "uid-3", json!([r("gpu-1")])));
    // uid-2 holds gpu-1: unprepare it, prepare the later claim (two records).
    assert!(restarted.unprepare(vec![refs("keep", "uid-2")]).await["uid-2"].is_ok());
    assert!(restarted.prepare(vec![refs("later", "uid-3")]).await["uid-3"].is_ok());
    drop(restarted);
    let ends = log_record_ends(&state);
    assert!(ends.len() >= 2, "{ends:?}");
    let mut bytes = std::fs::read(state.join("checkpoint.log")).unwrap();
    bytes[ends[0] - 10] ^= 0x01;
    std::fs::write(state.join("checkpoint.log"), &bytes).unwrap();
    let e = restarted_read_error(&state);
    assert!(
        e.contains("checkpoint.log") && e.contains("is damaged"),
        "{e}"
    );
    let restarted = preparer(&api, backend.clone(), tmp.path(), "boot-1");
    let loaded = restarted.recover().unwrap();
    assert!(loaded.data.claims.is_empty(), "rebuilt: starts empty");
    let gpus: std::collections::BTreeSet<String> = support::dra_pool::gpu_uuids(backend.as_ref())
        .into_iter()
        .collect();
    assert_eq!(restarted.destroy_unowned_migs(&gpus).unwrap(), 1);
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-1.json").exists());
    assert!(!tmp.path().join("cdi/tessera.io-claim-uid-3.json").exists());
    // The files were replaced: a clean read, and the kubelet's retries prepare again.
    assert!(restarted.checkpoint.read().unwrap().claims.is_empty());
    assert!(restarted.prepare(vec![refs("train", "uid-1")]).await["uid-1"].is_ok());
    assert!(restarted.prepare(vec![refs("later", "uid-3")]).await["uid-3"].is_ok());
    assert_eq!(restarted.checkpoint.read().unwrap().claims.len(), 2);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

fn restarted_read_error(state: &std::path::Path) -> String {
    Store::new(state).read().unwrap_err().to_string()
}

fn status_puts(api: &ApiServer, name: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains(&format!("/{name}/status")))
        .count()
}

/// `status.devices` is written after the kubelet's answer, per claim in order: an
/// unprepare right after the prepare (its Ready write still queued, or in flight) ends
/// with the entries cleared, never with a Ready that landed after the clearing. With the
/// API server failing the status PUTs the Ready write is retrying with backoff when the
/// unprepare comes: the clear replaces it, and once the API server answers only the
/// clear is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_follow_the_answer_in_order_per_claim() {
    let api = ApiServer::empty().await;
    let nic = json!({"driver": "nic.example.com", "pool": "node-a", "device": "eth1"});
    for (name, uid) in [("quick", "uid-q"), ("flaky", "uid-f")] {
        let mut object = claim(name, uid, json!([r("gpu-0")]));
        object["status"]["devices"] = json!([nic]);
        api.put_object(CLAIMS, object);
    }
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("1xL4").unwrap());
    let p = preparer(&api, backend, tmp.path(), "boot-1");
    let c = |name: &str, uid: &str| ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };

    // Prepare, then unprepare at once, ten times over.
    for _ in 0..10 {
        p.prepare(vec![c("quick", "uid-q")]).await["uid-q"]
            .as_ref()
            .unwrap();
        p.unprepare(vec![c("quick", "uid-q")]).await["uid-q"]
            .as_ref()
            .unwrap();
        assert_eq!(status_devices(&p, &api, "quick").await, vec![nic.clone()]);
    }

    // The Ready write fails and is being retried when the unprepare comes.
    api.fail_requests(&["PUT"], &format!("{CLAIMS}/flaky/status"));
    p.prepare(vec![c("flaky", "uid-f")]).await["uid-f"]
        .as_ref()
        .unwrap();
    let start = std::time::Instant::now();
    while status_puts(&api, "flaky") < 2 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "no retry"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(stored_status_devices(&api, "flaky"), vec![nic.clone()]);
    let unprepared = {
        let p = p.clone();
        tokio::spawn(async move { p.unprepare(vec![c("flaky", "uid-f")]).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    api.stop_failing();
    unprepared.await.unwrap()["uid-f"].as_ref().unwrap();
    assert_eq!(status_devices(&p, &api, "flaky").await, vec![nic.clone()]);
    // Nothing lands later (the replaced Ready is never written).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(stored_status_devices(&api, "flaky"), vec![nic]);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// A status write the API server fails is retried with backoff until it lands; the
/// prepare was answered before it (and is not failed by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_status_write_is_retried_after_the_answer() {
    let api = ApiServer::empty().await;
    api.put_object(CLAIMS, claim("late", "uid-l", json!([r("gpu-0")])));
    let tmp = tempfile::tempdir().unwrap();
    let backend = Arc::new(FakeBackend::from_spec("1xL4").unwrap());
    let p = preparer(&api, backend, tmp.path(), "boot-1");
    api.fail_requests(&["PUT"], &format!("{CLAIMS}/late/status"));
    let out = p
        .prepare(vec![ClaimRef {
            namespace: "ml".into(),
            name: "late".into(),
            uid: "uid-l".into(),
        }])
        .await;
    assert_eq!(out["uid-l"].as_ref().unwrap().len(), 1);
    assert_eq!(p.status.pending(), 1, "the write is queued, not done");
    let start = std::time::Instant::now();
    while status_puts(&api, "late") < 3 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "no retries"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(stored_status_devices(&api, "late").is_empty());
    api.stop_failing();
    let devices = status_devices(&p, &api, "late").await;
    assert_eq!(devices.len(), 1, "{devices:#?}");
    assert_eq!(ready(&devices[0]), ("True", "Prepared"));
    assert_eq!(p.status.pending(), 0);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}
