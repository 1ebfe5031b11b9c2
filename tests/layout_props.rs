//! Properties of the advertisement over random GPUs and configs: no device ID is ever
//! advertised twice or by two resources, a GPU in MIG mode is never also advertised
//! whole, MIG placements never overlap, and vGPU slices never oversubscribe a GPU.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessera::agent;
use tessera::gpu::fake::FakeBackend;
use tessera::partition::config::parse_config;
use tessera::partition::layout::{GpuPlan, Share, Target};

const MODELS: &[&str] = &[
    "A100-80GB",
    "A100-40GB",
    "H100-80GB",
    "A30",
    "L4",
    "H200-141GB",
];

fn rule() -> impl Strategy<Value = String> {
    let selector = prop_oneof![
        Just("all".to_string()),
        (0u32..6).prop_map(|i| format!("{{ index: [{i}] }}")),
        prop::sample::select(MODELS).prop_map(|m| format!("{{ model: {m} }}")),
    ];
    let mode = prop_oneof![
        Just("mode: whole".to_string()),
        prop::sample::select(vec![
            "all-1g.10gb",
            "all-balanced",
            "all-3g.40gb",
            "all-1g.5gb",
            "all-2g.20gb"
        ])
        .prop_map(|l| format!("mode: mig, mig: {{ layout: {l} }}")),
        prop::collection::vec(
            prop::sample::select(vec![
                "1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "1g.20gb", "7g.80gb"
            ]),
            1..4
        )
        .prop_map(|p| format!("mode: mig, mig: {{ profiles: [{}] }}", p.join(", "))),
        (1u32..6, any::<bool>()).prop_map(|(r, rename)| if rename {
            format!(
                "mode: timeslice, timeslice: {{ replicas: {r}, rename: nvidia.com/gpu.shared }}"
            )
        } else {
            format!("mode: timeslice, timeslice: {{ replicas: {r} }}")
        }),
        (1u32..5, 1u32..24, 1u32..40).prop_map(|(n, g, c)| format!(
            "mode: vgpu, vgpu: {{ count: {n}, memory: {g}g, cores: {c} }}"
        )),
        (1u32..12, any::<bool>()).prop_map(|(n, rename)| if rename {
            format!("mode: vgpu, vgpu: {{ split: {n}, resource: nvidia.com/vgpu-slot }}")
        } else {
            format!("mode: vgpu, vgpu: {{ split: {n} }}")
        }),
    ];
    (selector, mode).prop_map(|(s, m)| format!("  - {{ match: {s}, {m} }}"))
}

fn config() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["none", "single", "mixed"]),
        prop::option::of(1u32..4),
        prop::collection::vec(rule(), 0..4),
    )
        .prop_map(|(strategy, ts, rules)| {
            let mut y = format!("version: v1\nflags: {{ migStrategy: {strategy} }}\n");
            if let Some(r) = ts {
                y += &format!(
                    "sharing: {{ timeSlicing: {{ resources: [ {{ name: nvidia.com/gpu, replicas: {r} }} ] }} }}\n"
                );
            }
            if !rules.is_empty() {
                y += "tessera:\n  gpus:\n";
                y += &rules.join("\n");
                y += "\n";
            }
            y
        })
}

fn gpus() -> impl Strategy<Value = String> {
    prop::collection::vec((1u32..4, prop::sample::select(MODELS)), 1..3).prop_map(|v| {
        v.iter()
            .map(|(n, m)| format!("{n}x{m}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn advertisement_invariants(spec in gpus(), yaml in config()) {
        let cfg = match parse_config("p", &yaml) {
            Ok(c) => c,
            // Generated configs can be invalid (e.g. a rename clash); that is a clear error.
            Err(e) => { prop_assert!(!e.reason.is_empty()); return Ok(()); }
        };
        let backend = FakeBackend::from_spec(&spec).unwrap();
        let Ok((inv, plan, ad)) = agent::build(&backend, &cfg) else { return Ok(()); };

        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for r in &ad.resources {
            for d in &r.devices {
                prop_assert!(d.id.len() <= 63);
                if let Some(other) = seen.insert(&d.id, &r.name) {
                    prop_assert!(false, "{} advertised by {} and {}", d.id, other, r.name);
                }
            }
            // One kind of device per resource.
            let kinds: BTreeSet<&str> = r.devices.iter().map(|d| match d.share {
                Share::Exclusive => "exclusive",
                Share::Replica { .. } => "replica",
                Share::Vgpu { .. } => "vgpu",
                Share::Slot { .. } => "slot",
            }).collect();
            prop_assert!(kinds.len() <= 1, "{} mixes {:?}", r.name, kinds);
        }
        for g in &inv.gpus {
            let devices: Vec<_> = ad.resources.iter().flat_map(|r| &r.devices).filter(|d| d.gpu_uuid == g.uuid).collect();
            match &plan.gpus[&g.uuid] {
                GpuPlan::Mig { .. } => {
                    prop_assert!(devices.iter().all(|d| matches!(d.target, Target::Mig { .. })),
                        "GPU {} is in MIG mode but advertised whole", g.index);
                    let mut used = BTreeSet::new();
                    for m in &g.mig_devices {
                        for slot in m.start..m.start + m.size {
                            prop_assert!(used.insert(slot), "MIG overlap on GPU {}", g.index);
                        }
                    }
                }
                GpuPlan::Vgpu { slices, .. } => {
                    prop_assert!(slices.iter().map(|s| s.memory_mib).sum::<u64>() <= g.memory_mib);
                    prop_assert!(slices.iter().map(|s| s.cores).sum::<u32>() <= 100);
                    prop_assert_eq!(devices.len(), slices.len());
                }
                GpuPlan::VgpuSplit { split, .. } => {
                    prop_assert_eq!(devices.len(), *split as usize);
                }
                GpuPlan::Whole { replicas } => {
                    prop_assert_eq!(devices.len(), replicas.as_ref().map_or(1, |r| r.replicas as usize));
                }
            }
        }
    }
}

/// Guard against a vacuous property: most generated cases must reach the invariants.
#[test]
fn generated_cases_mostly_build() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut built, total) = (0, 200);
    for _ in 0..total {
        let spec = gpus().new_tree(&mut runner).unwrap().current();
        let yaml = config().new_tree(&mut runner).unwrap().current();
        let Ok(cfg) = parse_config("p", &yaml) else {
            continue;
        };
        let backend = FakeBackend::from_spec(&spec).unwrap();
        if agent::build(&backend, &cfg).is_ok() {
            built += 1;
        }
    }
    assert!(
        built * 100 / total >= 30,
        "only {built}/{total} generated cases build"
    );
}
