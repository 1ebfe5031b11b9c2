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
