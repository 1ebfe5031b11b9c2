//! NodePrepareResources / NodeUnprepareResources against the API-server double and the
//! fake GPUs: MIG instances created on demand and destroyed on unprepare, one CDI spec per
//! claim, the checkpoint's phases, idempotent retries, and clear per-claim errors.

mod support;

use std::sync::Arc;

use serde_json::json;
use support::apiserver::ApiServer;
use tessera::deviceplugin::allocate::AllocateSettings;
use tessera::dra::checkpoint::{Phase, Store};
use tessera::dra::node::NodePreparer;
use tessera::dra::plugin::{ClaimPreparer, ClaimRef};
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";

fn claim(name: &str, uid: &str, results: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    })
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
    assert!(p.checkpoint.read().unwrap().claims.is_empty());
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
}

fn preparer(
    api: &ApiServer,
    backend: Arc<FakeBackend>,
    root: &std::path::Path,
    boot: &str,
) -> NodePreparer {
    NodePreparer {
        client: api.client(),
        node: "node-a".into(),
        backend,
        checkpoint: Store::new(&root.join("state")),
        cdi_root: root.join("cdi"),
        settings: AllocateSettings::with_state_dir(root.join("state")),
        boot_id: boot.into(),
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
}
