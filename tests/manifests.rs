//! The shipped manifests stay in step with the code: every named layout in the example
//! ConfigMap parses and lays out on real GPU models.

use serde::Deserialize;
use tessera::agent;
use tessera::gpu::fake::FakeBackend;
use tessera::partition::config::parse_config;

#[test]
fn example_configmap_layouts_are_valid() {
    let text = std::fs::read_to_string("daemonset/node/configmap.yaml").unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let data = doc["data"].as_mapping().unwrap();
    assert!(data.contains_key("default"), "a default config must exist");
    for (name, body) in data {
        let name = name.as_str().unwrap();
        let cfg = parse_config(name, body.as_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
        for gpus in ["8xA100-80GB", "8xH100-80GB", "4xA30"] {
            let backend = FakeBackend::from_spec(gpus).unwrap();
            agent::build(&backend, &cfg).unwrap_or_else(|e| panic!("{name} on {gpus}: {e}"));
        }
    }
}

#[test]
fn example_layout_files_are_valid() {
    for entry in std::fs::read_dir("daemonset/examples").unwrap() {
        let path = entry.unwrap().path();
        // `claims/` holds Kubernetes objects (checked below and by the manifest script).
        if path.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg =
            parse_config("example", &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let backend = FakeBackend::from_spec("4xA100-80GB").unwrap();
        agent::build(&backend, &cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Each DeviceClass selects a device type the driver actually publishes.
#[test]
fn device_classes_select_published_types() {
    use tessera::dra::slices::{build_slices, SliceOptions};
    use tessera::gpu::GpuBackend;
    use tessera::partition::layout;
    let text = std::fs::read_to_string("daemonset/dra/deviceclasses.yaml").unwrap();
    let inv = FakeBackend::from_spec("3xA100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let cfg = parse_config(
        "t",
        "tessera: { gpus: [ { match: { index: [0] }, mode: mig, mig: { layout: balanced } }, \
         { match: { index: [1] }, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 50 } } ] }",
    )
    .unwrap();
    let plan = layout::plan(&inv, &cfg).unwrap();
    let slices = build_slices(&inv, &plan, &SliceOptions::new("n")).unwrap();
    let published: std::collections::BTreeSet<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| d.attributes.as_ref()?.get("type")?.string.clone())
        .collect();
    let mut classes = 0;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        let expr = v["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap();
        let want = expr
            .split("type == \"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            published.contains(want),
            "class selects type {want}, published: {published:?}"
        );
        assert!(expr.contains("device.driver == \"gpu.tessera.io\""));
        classes += 1;
    }
    assert_eq!(classes, 3);
}

/// Every example claim names a shipped DeviceClass, and what it selects (MIG profile,
/// vGPU capacity) is something the driver publishes.
#[test]
fn example_claims_use_shipped_classes_and_published_devices() {
    use tessera::dra::slices::{build_slices, SliceOptions};
    use tessera::gpu::GpuBackend;
    use tessera::partition::layout;
    let classes = std::fs::read_to_string("daemonset/dra/deviceclasses.yaml").unwrap();
    let class_names: Vec<String> = serde_yaml::Deserializer::from_str(&classes)
        .map(|d| {
            serde_yaml::Value::deserialize(d).unwrap()["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let inv = FakeBackend::from_spec("3xA100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let cfg = parse_config(
        "t",
        "tessera: { gpus: [ { match: { index: [0] }, mode: mig, mig: { layout: balanced } }, \
         { match: { index: [1] }, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 50 } } ] }",
    )
    .unwrap();
    let plan = layout::plan(&inv, &cfg).unwrap();
    let devices: Vec<_> = build_slices(&inv, &plan, &SliceOptions::new("n"))
        .unwrap()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect();
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("daemonset/examples/claims").unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_yaml::Value::deserialize(doc).unwrap();
            let spec = match v["kind"].as_str() {
                Some("ResourceClaimTemplate") => &v["spec"]["spec"],
                Some("ResourceClaim") => &v["spec"],
                _ => continue,
            };
            for r in spec["devices"]["requests"].as_sequence().unwrap() {
                let class = r["exactly"]["deviceClassName"].as_str().unwrap();
                assert!(
                    class_names.iter().any(|c| c == class),
                    "{}: {class}",
                    path.display()
                );
                kinds.insert(class.to_string());
                for sel in r["exactly"]["selectors"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                {
                    let expr = sel["cel"]["expression"].as_str().unwrap();
                    if let Some(profile) = expr.split("profile == \"").nth(1) {
                        let profile = profile.split('"').next().unwrap();
                        assert!(
                            devices.iter().any(|d| d
                                .attributes
                                .as_ref()
                                .unwrap()
                                .get("profile")
                                .and_then(|a| a.string.as_deref())
                                == Some(profile)),
                            "{}: MIG profile {profile} is never published",
                            path.display()
                        );
                    }
                }
                if let Some(caps) = r["exactly"]["capacity"]["requests"].as_mapping() {
                    let vgpu = devices
                        .iter()
                        .find(|d| d.allow_multiple_allocations == Some(true))
                        .unwrap();
                    for key in caps.keys() {
                        let key = key.as_str().unwrap();
                        assert!(
                            vgpu.capacity.as_ref().unwrap().contains_key(key),
                            "capacity {key}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(
        kinds.len(),
        3,
        "an example for every DeviceClass: {kinds:?}"
    );
}

/// Every TESSERA_* variable the DaemonSet sets is one `tessera node` reads.
#[test]
fn daemonset_env_is_read_by_the_agent() {
    let text = std::fs::read_to_string("daemonset/node/daemonset.yaml").unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let mut checked = 0;
    for e in env {
        let name = e["name"].as_str().unwrap();
        if name.starts_with("TESSERA_") {
            assert!(
                help.contains(&format!("env: {name}=")),
                "{name} is not a flag's env"
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "DaemonSet sets the path variables");
}

/// The committed CRDs are exactly what `tessera controller crds` generates from the types.
#[test]
fn committed_crds_match_the_generated_ones() {
    let committed = std::fs::read_to_string("daemonset/controller/crds.yaml").unwrap();
    let generated = tessera::controller::crd::crds_yaml().unwrap();
    assert!(
        committed == generated,
        "daemonset/controller/crds.yaml is stale: run `tessera controller crds > daemonset/controller/crds.yaml`"
    );
}
