//! Every CDI spec Tessera writes — the device-plugin path's node spec (`src/cdi`) and the
//! DRA driver's per-claim specs — is valid against the CDI schema
//! (`tests/schemas/cdi-spec.schema.json`, checked with Python `jsonschema`) and declares
//! exactly the minimum `cdiVersion` its fields need (`tests/py/validate_cdi.py`).

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use support::apiserver::ApiServer;
use tessera::cdi;
use tessera::deviceplugin::allocate::{AllocateSettings, PreloadMode};
use tessera::dra::checkpoint::Store;
use tessera::dra::node::NodePreparer;
use tessera::dra::owned::OwnedDevices;
use tessera::dra::plugin::{ClaimPreparer, ClaimRef};
use tessera::dra::status_queue::StatusWriter;
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";

/// Run the validator on `files`: `Ok(true)` valid, `Err` carries its report. `Ok(false)`:
/// not checked, because python jsonschema is missing — a failure under `CI=true`, else a
/// `SKIPPED-CHECK` line that `hack/test.sh` counts (`support::skip`).
fn validate(files: &[PathBuf]) -> Result<bool, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .arg(root.join("tests/py/validate_cdi.py"))
        .arg(root.join("tests/schemas/cdi-spec.schema.json"))
        .args(files)
        .output()
        .expect("python3");
    match out.status.code() {
        Some(0) => Ok(true),
        Some(3) => {
            support::skip::tool_missing("python3 jsonschema", "pip install jsonschema");
            Ok(false)
        }
        _ => Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn device_plugin_node_specs_are_valid() {
    let yaml = r#"
gpus:
  - { model: A100-80GB, count: 2, migEnabled: true, mig: [3g.40gb, 2g.20gb, 1g.10gb] }
  - { model: L4 }
"#;
    let inv = FakeBackend::from_yaml(yaml).unwrap().inventory().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (stem, dev_root) in [("plain", "/dev"), ("host-dev", "/host/dev")] {
        let paths = cdi::migcaps::write_synthetic(&dir.path().join(stem), 3, 508).unwrap();
        let paths = cdi::migcaps::MigCapsPaths {
            host_dev_dir: format!("{dev_root}/nvidia-caps"),
            ..paths
        };
        let caps = cdi::migcaps::MigCaps::load(&paths).unwrap();
        let spec = cdi::node_spec_with(&inv, dev_root, Some(&caps));
        // Every MIG device: its GPU node and the two access nodes.
        let mig = spec.devices.iter().filter(|d| d.name.starts_with("MIG-"));
        assert_eq!(mig.clone().count(), 6);
        for d in mig {
            let nodes = &d.container_edits.device_nodes;
            assert_eq!(nodes.len(), 3, "{d:?}");
            assert!(
                nodes[1..]
                    .iter()
                    .all(|n| n.path.starts_with("/dev/nvidia-caps/nvidia-cap")
                        && n.major == Some(508))
            );
        }
        files.push(cdi::write_spec(dir.path(), stem, &spec).unwrap());
    }
    let read = |f: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap()
    };
    assert_eq!(read(&files[0])["cdiVersion"], "0.3.0");
    assert_eq!(read(&files[1])["cdiVersion"], "0.5.0", "hostPath");
    validate(&files).unwrap();
}

fn claim(name: &str, uid: &str, results: serde_json::Value) -> serde_json::Value {
    support::dra_agent::allocated_claim(name, uid, "gpu.tessera.io", results)
}

fn r(device: &str) -> serde_json::Value {
    json!({"request": "gpu", "driver": "gpu.tessera.io", "pool": "node-a", "device": device})
}

fn vgpu(device: &str, memory: &str, cores: &str) -> serde_json::Value {
    let mut d = r(device);
    d["consumedCapacity"] = json!({"memory": memory, "cores": cores});
    d
}

#[tokio::test]
async fn dra_claim_specs_are_valid_with_their_minimum_version() {
    let api = ApiServer::empty().await;
    let claims = [
        (
            "whole",
            "a1b2c3d4-0000-4000-8000-000000000001",
            json!([r("gpu-0")]),
        ),
        (
            "mig",
            "1f2e3d4c-0000-4000-8000-000000000002",
            json!([r("gpu-1-mig-3g-40gb-4"), r("gpu-1-mig-1g-10gb-0")]),
        ),
        (
            "vgpu",
            "b0000000-0000-4000-8000-000000000003",
            json!([
                vgpu("gpu-2-vgpu", "16Gi", "25"),
                vgpu("gpu-3-vgpu", "8Gi", "10")
            ]),
        ),
        (
            "mixed",
            "20000000-0000-4000-8000-000000000004",
            json!([r("gpu-0"), vgpu("gpu-2-vgpu", "1Gi", "5")]),
        ),
    ];
    for (name, uid, results) in &claims {
        api.put_object(CLAIMS, claim(name, uid, results.clone()));
    }
    let yaml = "gpus: [ { model: A100-80GB, count: 4 } ]";
    for preload in [PreloadMode::Env, PreloadMode::File] {
        let tmp = tempfile::tempdir().unwrap();
        let mut settings = AllocateSettings::with_state_dir(tmp.path().join("state"));
        settings.mig_caps =
            tessera::cdi::migcaps::write_synthetic(&tmp.path().join("proc"), 4, 508).unwrap();
        settings.preload = preload;
        // A stand-in for the shim library the agent installs at start (vGPU needs one).
        let stand_in = tmp.path().join("libtessera_cuda.so");
        std::fs::write(&stand_in, b"stand-in for libtessera_cuda.so").unwrap();
        settings
            .shim
            .install(&stand_in, &settings.shim_container_path)
            .unwrap();
        let backend = Arc::new(FakeBackend::from_yaml(yaml).unwrap());
        let p = NodePreparer {
            client: api.client(),
            node: "node-a".into(),
            owned: OwnedDevices::every_device_of(&backend.inventory().unwrap()),
            backend,
            checkpoint: Store::new(&tmp.path().join("state")),
            cdi_root: tmp.path().join("cdi"),
            settings,
            boot_id: "boot-1".into(),
            status: StatusWriter::new(api.client(), "node-a"),
        };
        let refs: Vec<ClaimRef> = claims
            .iter()
            .map(|(name, uid, _)| ClaimRef {
                namespace: "ml".into(),
                name: name.to_string(),
                uid: uid.to_string(),
            })
            .collect();
        let out = p.prepare(refs).await;
        assert!(out.values().all(|r| r.is_ok()), "{out:?}");
        let files = json_files(&tmp.path().join("cdi"));
        assert_eq!(files.len(), claims.len());
        for f in &files {
            let spec: serde_json::Value =
                serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let starts_with_digit = spec["devices"][0]["name"]
                .as_str()
                .unwrap()
                .starts_with(|c: char| c.is_ascii_digit());
            let want = if starts_with_digit { "0.5.0" } else { "0.3.0" };
            assert_eq!(spec["cdiVersion"], want, "{}", f.display());
            let nodes = spec["containerEdits"]["deviceNodes"].to_string();
            assert!(
                nodes.contains("/dev/nvidiactl") && nodes.contains("/dev/nvidia-uvm"),
                "{nodes}"
            );
            for d in spec["devices"].as_array().unwrap() {
                let n = d["containerEdits"]["deviceNodes"].as_array().unwrap();
                let caps = n
                    .iter()
                    .filter(|n| {
                        n["path"]
                            .as_str()
                            .unwrap()
                            .starts_with("/dev/nvidia-caps/nvidia-cap")
                            && n["type"] == "c"
                            && n["major"] == 508
                    })
                    .count();
                let is_mig = d["name"].as_str().unwrap().contains("-mig-");
                assert_eq!(caps, if is_mig { 2 } else { 0 }, "{d}");
            }
        }
        validate(&files).unwrap();
        specs_are_restored_byte_identical(&p, &files);
    }
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// The periodic check of the per-claim specs: with every claim's spec intact nothing is
/// rewritten; a corrupted (MIG), edited (vGPU) and deleted (whole) spec is rewritten
/// byte for byte as prepare wrote it; a spec of another driver in the same directory is
/// left alone.
fn specs_are_restored_byte_identical(p: &NodePreparer, files: &[PathBuf]) {
    let written: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let first = p.verify_claim_specs().unwrap();
    assert_eq!(first, Default::default(), "all intact");
    let root = files[0].parent().unwrap();
    let other = root.join("nic.example.com-claim-1234.json");
    std::fs::write(&other, b"{\"kind\": \"nic.example.com/nic\", broken").unwrap();
    let find = |uid: &str| {
        files
            .iter()
            .position(|f| f.ends_with(format!("tessera.io-claim-{uid}.json")))
            .unwrap()
    };
    let mig = find("1f2e3d4c-0000-4000-8000-000000000002");
    let vgpu = find("b0000000-0000-4000-8000-000000000003");
    let whole = find("a1b2c3d4-0000-4000-8000-000000000001");
    std::fs::write(&files[mig], b"{ not json").unwrap();
    let edited = String::from_utf8(written[vgpu].clone()).unwrap().replace(
        "CUDA_DEVICE_MEMORY_LIMIT_0=16384m",
        "CUDA_DEVICE_MEMORY_LIMIT_0=81920m",
    );
    assert_ne!(edited.as_bytes(), &written[vgpu][..]);
    std::fs::write(&files[vgpu], edited).unwrap();
    std::fs::remove_file(&files[whole]).unwrap();
    let check = p.verify_claim_specs().unwrap();
    assert_eq!(check.repaired.len(), 3, "{check:?}");
    assert!(check.unchecked.is_empty(), "{check:?}");
    for (f, bytes) in files.iter().zip(&written) {
        assert_eq!(&std::fs::read(f).unwrap(), bytes, "{}", f.display());
    }
    assert_eq!(
        std::fs::read(&other).unwrap(),
        b"{\"kind\": \"nic.example.com/nic\", broken"
    );
    assert_eq!(p.verify_claim_specs().unwrap(), Default::default());
}

#[test]
fn the_validator_rejects_what_it_must() {
    let inv = FakeBackend::from_spec("1xL4").unwrap().inventory().unwrap();
    let good = serde_json::to_value(cdi::node_spec(&inv, "/dev")).unwrap();
    type Mutation = fn(&mut serde_json::Value);
    let cases: [(&str, Mutation, &str); 8] = [
        (
            "no-kind",
            |s| {
                s.as_object_mut().unwrap().remove("kind");
            },
            "'kind' is a required property",
        ),
        ("bad-kind", |s| s["kind"] = json!("tessera.io"), "kind"),
        (
            "bad-name",
            |s| s["devices"][0]["name"] = json!("gpu/0"),
            "devices/0/name",
        ),
        (
            "unknown-field",
            |s| s["devices"][0]["containerEdits"]["envs"] = json!([]),
            "Additional properties",
        ),
        (
            "bad-env",
            |s| s["devices"][0]["containerEdits"]["env"] = json!(["NOEQUALS"]),
            "env/0",
        ),
        (
            "relative-path",
            |s| s["containerEdits"]["deviceNodes"][0]["path"] = json!("dev/nvidiactl"),
            "deviceNodes/0/path",
        ),
        (
            "version-too-low",
            |s| s["containerEdits"]["deviceNodes"][0]["hostPath"] = json!("/host/dev/nvidiactl"),
            "need exactly 0.5.0",
        ),
        (
            "version-too-high",
            |s| s["cdiVersion"] = json!("0.6.0"),
            "need exactly 0.3.0",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("good.json");
    std::fs::write(&ok, serde_json::to_vec(&good).unwrap()).unwrap();
    validate(std::slice::from_ref(&ok)).unwrap();
    for (name, mutate, want) in cases {
        let mut spec = good.clone();
        mutate(&mut spec);
        let f = dir.path().join(format!("{name}.json"));
        std::fs::write(&f, serde_json::to_vec(&spec).unwrap()).unwrap();
        match validate(std::slice::from_ref(&f)) {
            Ok(false) => {} // not checked: reported by `validate`
            Ok(true) => panic!("{name}: accepted"),
            Err(report) => assert!(report.contains(want), "{name}: {report}"),
        }
    }
}

/// With the driver in a container (`--driver-root /run/nvidia/driver`, which has a `dev`
/// directory), every device node of a claim's spec (the GPU, its MIG access nodes, the
/// control nodes) and of the node spec names its host path under the driver root; the
/// shim and accounting mounts keep their own host paths; `cdiVersion` is 0.5.0.
#[tokio::test]
async fn device_nodes_get_host_paths_under_the_driver_root() {
    use tessera::cdi::devroot::DevRoot;
    let api = ApiServer::empty().await;
    let claims = [
        ("mig", "mig-0001", json!([r("gpu-1-mig-3g-40gb-4")])),
        (
            "vgpu",
            "vgpu-0002",
            json!([vgpu("gpu-2-vgpu", "8Gi", "20")]),
        ),
    ];
    for (name, uid, results) in &claims {
        api.put_object(CLAIMS, claim(name, uid, results.clone()));
    }
    let tmp = tempfile::tempdir().unwrap();
    let driver_root = tmp.path().join("run/nvidia/driver");
    std::fs::create_dir_all(driver_root.join("dev")).unwrap();
    let root = DevRoot::from_driver_root(&driver_root);
    assert!(!root.is_host());
    let state = tmp.path().join("state");
    let mut settings = AllocateSettings::with_state_dir(&state);
    settings.mig_caps =
        tessera::cdi::migcaps::write_synthetic(&tmp.path().join("proc"), 4, 508).unwrap();
    // What `tessera node --driver-root` sets.
    settings.mig_caps.host_dev_dir = root.caps_dir();
    settings.host_dev = root.clone();
    // A stand-in for the shim library the agent installs at start (vGPU needs one).
    let stand_in = tmp.path().join("libtessera_cuda.so");
    std::fs::write(&stand_in, b"stand-in for libtessera_cuda.so").unwrap();
    settings
        .shim
        .install(&stand_in, &settings.shim_container_path)
        .unwrap();
    let backend =
        Arc::new(FakeBackend::from_yaml("gpus: [ { model: A100-80GB, count: 4 } ]").unwrap());
    let p = NodePreparer {
        client: api.client(),
        node: "node-a".into(),
        owned: OwnedDevices::every_device_of(&backend.inventory().unwrap()),
        backend: backend.clone(),
        checkpoint: Store::new(&state),
        cdi_root: tmp.path().join("cdi"),
        settings: settings.clone(),
        boot_id: "boot-1".into(),
        status: StatusWriter::new(api.client(), "node-a"),
    };
    let refs: Vec<ClaimRef> = claims
        .iter()
        .map(|(name, uid, _)| ClaimRef {
            namespace: "ml".into(),
            name: name.to_string(),
            uid: uid.to_string(),
        })
        .collect();
    let out = p.prepare(refs).await;
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    // The device plugin's node spec, as the agent writes it.
    let inv = backend.inventory().unwrap();
    let caps = tessera::cdi::migcaps::MigCaps::load(&settings.mig_caps).unwrap();
    let node_spec =
        cdi::devroot::with_host_dev(cdi::node_spec_with(&inv, "/dev", Some(&caps)), &root);
    cdi::write_spec(&tmp.path().join("cdi"), "tessera.io-gpu", &node_spec).unwrap();

    let files = json_files(&tmp.path().join("cdi"));
    assert_eq!(files.len(), 3);
    let prefix = driver_root.display().to_string();
    let mut caps_nodes = 0;
    for f in &files {
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
        assert_eq!(spec["cdiVersion"], "0.5.0", "{}", f.display());
        let mut edits = vec![spec["containerEdits"].clone()];
        edits.extend(
            spec["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["containerEdits"].clone()),
        );
        for e in &edits {
            for n in e["deviceNodes"].as_array().into_iter().flatten() {
                let path = n["path"].as_str().unwrap();
                assert!(path.starts_with("/dev/nvidia"), "{n}");
                assert_eq!(n["hostPath"], format!("{prefix}{path}"), "{}", f.display());
                caps_nodes += path.starts_with("/dev/nvidia-caps/") as usize;
            }
            for m in e["mounts"].as_array().into_iter().flatten() {
                let host = m["hostPath"].as_str().unwrap();
                assert!(host.starts_with(&state.display().to_string()), "{m}");
            }
        }
    }
    // The MIG instance's GPU-instance and compute-instance nodes, in the claim's spec and
    // in the node spec (built here from the whole inventory, the instance included).
    assert_eq!(caps_nodes, 4);
    let vgpu_spec =
        std::fs::read_to_string(tmp.path().join("cdi/tessera.io-claim-vgpu-0002.json")).unwrap();
    assert!(
        vgpu_spec.contains("libtessera_cuda.so"),
        "the shim mount is there"
    );
    validate(&files).unwrap();
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}
