//! Every ResourceSlice the DRA driver would publish is valid against the official
//! Kubernetes schemas: the 1.34 layout (counters beside devices) for 1.34, the 1.35+
//! layout (counters in their own slices) for 1.35.

mod support;

use tessera::dra::slices::{build_slices, CounterLayout, SliceOptions};
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;
use tessera::partition::{config, layout};

const MIXED: &str = r#"
flags: { migStrategy: mixed }
tessera:
  gpus:
  - { match: { index: [0, 1] }, mode: mig, mig: { layout: balanced } }
  - { match: { index: [2] }, mode: vgpu, vgpu: { count: 4, memory: 16g, cores: 25 } }
  - { match: all, mode: whole }
"#;

#[test]
fn slices_validate_against_the_official_schemas() {
    let inv = FakeBackend::from_spec("8xH100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let cfg = config::parse_config("mixed", MIXED).unwrap();
    let plan = layout::plan(&inv, &cfg).unwrap();
    for (layout, versions) in [
        (CounterLayout::Inline, &["1.34.0"][..]),
        (CounterLayout::Separate, &["1.35.0"][..]),
    ] {
        let mut opts = SliceOptions::new("gpu-node-1");
        opts.counters = layout;
        let slices = build_slices(&inv, &plan, &opts).unwrap();
        assert!(
            slices.len() >= 2,
            "MIG devices of 2 GPUs exceed one slice's 64"
        );
        let names: std::collections::BTreeSet<String> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect();
        let total: usize = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        assert_eq!(names.len(), total, "device names unique in the pool");
        let objects: Vec<serde_json::Value> = slices
            .iter()
            .map(|s| serde_json::to_value(s).unwrap())
            .collect();
        for json in &objects {
            assert_eq!(json["apiVersion"], "resource.k8s.io/v1");
            assert_eq!(json["kind"], "ResourceSlice");
        }
        support::schema::validate_all(&objects, versions);
    }
}
