//! Tests for the MIG catalog: table invariants, documented layouts, refusals with their
//! reasons, product-name lookup, named layouts, and a property test of `place`.

use super::*;
use proptest::prelude::*;

fn model(name: &str) -> &'static ModelCatalog {
    all_models()
        .iter()
        .find(|m| m.model == name)
        .unwrap_or_else(|| panic!("model {name} missing from the catalog"))
}

fn starts(placements: &[Placement]) -> Vec<(&'static str, u8)> {
    placements
        .iter()
        .map(|p| (p.profile.name, p.start))
        .collect()
}

// ------------------------------------------------------------------ table invariants

#[test]
fn every_model_required_by_the_issue_is_present() {
    let want = [
        "A30",
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "H100-94GB",
        "H200-141GB",
        "B200",
        "GB200",
    ];
    let have: Vec<&str> = all_models().iter().map(|m| m.model).collect();
    assert_eq!(have, want);
}

#[test]
fn tables_are_self_consistent() {
    for m in all_models() {
        let mut names = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::new();
        for p in m.profiles {
            let ctx = format!("{} {}", m.model, p.name);
            assert!(names.insert(p.name), "{ctx}: duplicate name");
            assert!(ids.insert(p.gi_profile_id), "{ctx}: duplicate GI id");
            assert_eq!(p.memory_slices, p.size, "{ctx}: size is in memory slices");
            assert!(p.compute_slices <= m.compute_slices, "{ctx}");
            assert!(
                p.memory_mib < m.memory_mib,
                "{ctx}: instance larger than GPU"
            );
            assert!(p.sm_count <= m.total_sms, "{ctx}: more SMs than the GPU");
            assert!(!p.placements.is_empty(), "{ctx}: no placement");
            for &s in p.placements {
                assert!(s + p.size <= m.total_slots, "{ctx}: start {s} overruns");
            }
            // The name's `Ng` is the compute slice count.
            let g: u8 = p.name[..p.name.find('g').expect("Ng prefix")]
                .parse()
                .expect("numeric g");
            assert_eq!(g, p.compute_slices, "{ctx}");
            assert_eq!(p.media_extensions, p.name.ends_with("+me"), "{ctx}");
        }
        for (name, _) in m.balanced {
            assert!(
                m.profile(name).is_some(),
                "{}: balanced uses {name}",
                m.model
            );
        }
    }
}

#[test]
fn every_profile_fits_exactly_max_instances_times() {
    for m in all_models() {
        for p in m.profiles {
            let max = usize::from(p.max_instances);
            let fits = m.place(&vec![p.name; max]);
            assert!(fits.is_ok(), "{} {}x{}: {fits:?}", m.model, max, p.name);
            let over = m.place(&vec![p.name; max + 1]);
            assert_eq!(
                over,
                Err(LayoutError::TooManyInstances {
                    model: m.model.to_string(),
                    profile: p.name.to_string(),
                    requested: max + 1,
                    max: p.max_instances,
                }),
                "{} {}",
                m.model,
                p.name
            );
        }
    }
}

// ------------------------------------------------------------------ documented layouts

/// Layouts NVIDIA documents as valid (MIG user guide placement diagrams, mig-parted
/// configs, public `nvidia-smi mig -lgi` transcripts).
const FITTING: &[(&str, &[&str])] = &[
    ("A30", &["1g.6gb", "1g.6gb", "1g.6gb", "1g.6gb"]),
    ("A30", &["2g.12gb", "2g.12gb"]),
    ("A30", &["2g.12gb", "1g.6gb", "1g.6gb"]),
    ("A30", &["2g.12gb+me", "1g.6gb", "1g.6gb"]),
    ("A30", &["4g.24gb"]),
    ("A100-40GB", &["1g.5gb"; 7]),
    ("A100-40GB", &["4g.20gb", "2g.10gb", "1g.5gb"]),
    ("A100-40GB", &["3g.20gb", "3g.20gb"]),
    ("A100-40GB", &["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]),
    ("A100-40GB", &["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"]),
    ("A100-80GB", &["1g.10gb"; 7]),
    (
        "A100-80GB",
        &[
            "1g.10gb+me",
            "1g.10gb",
            "1g.10gb",
            "1g.10gb",
            "1g.10gb",
            "1g.10gb",
            "1g.10gb",
        ],
    ),
    ("A100-80GB", &["3g.40gb", "3g.40gb"]),
    ("A100-80GB", &["4g.40gb", "3g.40gb"]),
    ("A100-80GB", &["1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb"]),
    ("A100-80GB", &["7g.80gb"]),
    ("H100-80GB", &["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
    (
        "H100-80GB",
        &[
            "1g.20gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb",
        ],
    ),
    ("H100-94GB", &["1g.12gb"; 7]),
    ("H100-94GB", &["3g.47gb", "3g.47gb"]),
    ("H200-141GB", &["1g.18gb"; 7]),
    ("H200-141GB", &["4g.71gb", "3g.71gb"]),
    ("B200", &["1g.23gb"; 7]),
    ("B200", &["4g.90gb", "2g.45gb", "1g.23gb"]),
    ("GB200", &["1g.23gb"; 7]),
    ("GB200", &["3g.93gb", "2g.47gb", "1g.23gb", "1g.23gb"]),
];

#[test]
fn documented_layouts_fit() {
    for (name, layout) in FITTING {
        let m = model(name);
        let placed = m.place(layout);
        assert!(placed.is_ok(), "{name} {layout:?}: {placed:?}");
        let placed = placed.unwrap_or_default();
        assert_eq!(placed.len(), layout.len());
        for (p, want) in placed.iter().zip(layout.iter()) {
            assert_eq!(p.profile.name, *want, "result keeps the input order");
        }
    }
}

#[test]
fn balanced_layout_is_mig_parted_mix_and_fits() {
    let cases: &[(&str, &[&str])] = &[
        ("A30", &["1g.6gb", "1g.6gb", "2g.12gb"]),
        ("A100-40GB", &["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]),
        ("A100-80GB", &["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        ("H100-80GB", &["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        ("H100-94GB", &["1g.12gb", "1g.12gb", "2g.24gb", "3g.47gb"]),
        ("H200-141GB", &["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]),
        ("B200", &["1g.23gb", "1g.23gb", "2g.45gb", "3g.90gb"]),
        ("GB200", &["1g.23gb", "1g.23gb", "2g.47gb", "3g.93gb"]),
    ];
    for (name, want) in cases {
        let m = model(name);
        assert_eq!(m.named_layout("balanced").as_deref(), Ok(*want), "{name}");
        assert_eq!(
            m.named_layout("all-balanced").as_deref(),
            Ok(*want),
            "{name}"
        );
    }
}

// ------------------------------------------------------------------ placements

#[test]
fn placements_match_nvidia_smi_transcripts() {
    // `nvidia-smi mig -lgi` on an H100 80GB (NVIDIA/DCGM#138): 2g.20gb 0:2,
    // 1g.10gb 2:1 and 3:1, 3g.40gb 4:4.
    let h100 = model("H100-80GB");
    let placed = h100
        .place(&["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
        .expect("documented layout");
    assert_eq!(
        starts(&placed),
        [
            ("1g.10gb", 2),
            ("1g.10gb", 3),
            ("2g.20gb", 0),
            ("3g.40gb", 4)
        ]
    );
    // Two 3g instances sit at 0:4 and 4:4 (-lgi transcripts on A100 and H100 NVL).
    let a100 = model("A100-80GB");
    let placed = a100.place(&["3g.40gb", "3g.40gb"]).expect("fits");
    assert_eq!(starts(&placed), [("3g.40gb", 0), ("3g.40gb", 4)]);
    assert_eq!(placed[1].slots(), 4..8);
    // 4g has the single placement {0}:4, so a 3g beside it must take 4:4.
    let placed = a100.place(&["3g.40gb", "4g.40gb"]).expect("fits");
    assert_eq!(starts(&placed), [("3g.40gb", 4), ("4g.40gb", 0)]);
    // 7g occupies all 8 memory slices; A30's 4g all 4.
    assert_eq!(a100.place(&["7g.80gb"]).expect("fits")[0].slots(), 0..8);
    let a30 = model("A30");
    assert_eq!(a30.place(&["4g.24gb"]).expect("fits")[0].slots(), 0..4);
}

#[test]
fn search_finds_a_fit_the_given_order_would_miss() {
    // Greedy in input order would put the 3g at 0:4 and leave only slots 4..6 for the
    // four 1g instances; the search moves the 3g to 4:4.
    let m = model("A100-80GB");
    let placed = m
        .place(&["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"])
        .expect("fits with 3g at 4");
    assert_eq!(placed[0].start, 4);
}

// ------------------------------------------------------------------ refusals

#[test]
fn refusals_name_the_reason() {
    let a100 = model("A100-80GB");
    assert!(matches!(
        a100.place(&["4g.40gb", "4g.40gb"]),
        Err(LayoutError::TooManyInstances { ref profile, max: 1, requested: 2, .. }) if profile == "4g.40gb"
    ));
    assert!(matches!(
        model("H100-80GB").place(&["1g.20gb"; 5]),
        Err(LayoutError::TooManyInstances {
            max: 4,
            requested: 5,
            ..
        })
    ));
    assert_eq!(
        a100.place(&["3g.40gb", "3g.40gb", "1g.10gb"]),
        Err(LayoutError::OutOfMemorySlices {
            model: "A100-80GB".into(),
            profiles: "2x 3g.40gb + 1x 1g.10gb".into(),
            requested: 9,
            available: 8,
        })
    );
    assert_eq!(
        a100.place(&["7g.80gb", "1g.10gb"]),
        Err(LayoutError::OutOfComputeSlices {
            model: "A100-80GB".into(),
            profiles: "1x 7g.80gb + 1x 1g.10gb".into(),
            requested: 8,
            available: 7,
        })
    );
    assert!(matches!(
        model("A30").place(&["1g.6gb+me", "2g.12gb+me"]),
        Err(LayoutError::TooManyMediaExtensions {
            requested: 2,
            max: 1,
            ..
        })
    ));
}

#[test]
fn unknown_profile_lists_the_valid_ones() {
    let err = model("A100-80GB")
        .place(&["1g.10gb", "1g.5gb"])
        .expect_err("1g.5gb is a 40GB profile");
    let msg = err.to_string();
    assert!(msg.contains("A100-80GB"), "{msg}");
    assert!(msg.contains("\"1g.5gb\""), "{msg}");
    assert!(
        msg.contains("1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
        "{msg}"
    );
}

#[test]
fn no_valid_placement_when_start_slots_collide() {
    // A synthetic model (the real tables never hit this): two 1-slot profiles that may
    // only start at slot 0 fit the budgets but not the geometry.
    static ONLY_ZERO: &[MigProfile] = &[MigProfile {
        name: "1g.1gb",
        compute_slices: 1,
        memory_slices: 1,
        memory_mib: 1024,
        sm_count: 1,
        size: 1,
        placements: &[0],
        max_instances: 2,
        media_extensions: false,
        gi_profile_id: 1,
    }];
    let m = ModelCatalog {
        model: "TEST",
        total_slots: 2,
        compute_slices: 2,
        total_sms: 2,
        memory_mib: 2048,
        max_media_instances: 1,
        profiles: ONLY_ZERO,
        balanced: &[],
        name_keys: &[],
        memory_range_mib: (0, 0),
    };
    let err = m
        .place(&["1g.1gb", "1g.1gb"])
        .expect_err("both want slot 0");
    assert_eq!(
        err,
        LayoutError::NoValidPlacement {
            model: "TEST".into(),
            profiles: "2x 1g.1gb".into()
        }
    );
    assert!(err.to_string().contains("TEST"));
}

#[test]
fn empty_layout_is_valid() {
    assert_eq!(model("H100-80GB").place(&[]), Ok(vec![]));
}

// ------------------------------------------------------------------ names

#[test]
fn profile_accepts_resource_and_nvidia_smi_spellings() {
    let m = model("A100-80GB");
    for spelling in ["1g.10gb", "mig-1g.10gb", "MIG 1g.10gb", " 1G.10GB "] {
        assert_eq!(
            m.profile(spelling).map(|p| p.gi_profile_id),
            Some(19),
            "{spelling}"
        );
    }
    assert_eq!(
        m.profile("mig-1g.10gb+me").map(|p| p.gi_profile_id),
        Some(20)
    );
    assert!(m.profile("1g.5gb").is_none());
    assert!(m.profile("").is_none());
}

#[test]
fn lookup_matches_nvml_product_names_and_short_names() {
    let cases: &[(&str, u64, Option<&str>)] = &[
        ("NVIDIA A100-SXM4-80GB", 81920, Some("A100-80GB")),
        ("NVIDIA A100-SXM4-40GB", 40960, Some("A100-40GB")),
        ("NVIDIA A100-PCIE-40GB", 40960, Some("A100-40GB")),
        ("NVIDIA A100 80GB PCIe", 81920, Some("A100-80GB")),
        ("NVIDIA A100-SXM4-80GB", 0, Some("A100-80GB")),
        // Memory decides when the name does not say.
        ("NVIDIA A100", 81920, Some("A100-80GB")),
        ("NVIDIA A100", 40960, Some("A100-40GB")),
        ("NVIDIA A30", 24576, Some("A30")),
        ("NVIDIA H100 80GB HBM3", 81559, Some("H100-80GB")),
        ("NVIDIA H100 PCIe", 81559, Some("H100-80GB")),
        ("NVIDIA H100 NVL", 95830, Some("H100-94GB")),
        ("NVIDIA H100 NVL", 0, Some("H100-94GB")),
        ("NVIDIA H200", 143771, Some("H200-141GB")),
        ("NVIDIA H200 NVL", 143771, Some("H200-141GB")),
        ("NVIDIA B200", 183359, Some("B200")),
        ("NVIDIA GB200", 189471, Some("GB200")),
        ("A100-80GB", 0, Some("A100-80GB")),
        ("h100-80gb", 0, Some("H100-80GB")),
        ("H100-94GB", 0, Some("H100-94GB")),
        ("H100-NVL", 0, Some("H100-94GB")),
        ("H200-141GB", 0, Some("H200-141GB")),
        ("H200", 0, Some("H200-141GB")),
        ("NVIDIA L4", 23034, None),
        ("Tesla T4", 15360, None),
        ("NVIDIA A10", 23028, None),
        ("", 0, None),
    ];
    for (name, mem, want) in cases {
        assert_eq!(lookup(name, *mem).map(|m| m.model), *want, "{name:?} {mem}");
    }
}

#[test]
fn named_layouts() {
    let cases: &[(&str, &str, &str, usize)] = &[
        ("A100-80GB", "all-1g.10gb", "1g.10gb", 7),
        ("A100-80GB", "all-1g.10gb.me", "1g.10gb+me", 1),
        ("A100-80GB", "all-1g.10gb+me", "1g.10gb+me", 1),
        ("A100-80GB", "all-1g.20gb", "1g.20gb", 4),
        ("A100-80GB", "all-2g.20gb", "2g.20gb", 3),
        ("A100-80GB", "all-3g.40gb", "3g.40gb", 2),
        ("A100-80GB", "ALL-mig-4g.40gb", "4g.40gb", 1),
        ("A100-40GB", "all-1g.10gb", "1g.10gb", 4),
        ("A30", "all-1g.6gb", "1g.6gb", 4),
        ("A30", "all-2g.12gb", "2g.12gb", 2),
        ("H200-141GB", "all-1g.35gb", "1g.35gb", 4),
        ("B200", "all-7g.180gb", "7g.180gb", 1),
    ];
    for (m, layout, profile, count) in cases {
        assert_eq!(
            model(m).named_layout(layout),
            Ok(vec![*profile; *count]),
            "{m} {layout}"
        );
    }
    let err = model("A100-80GB")
        .named_layout("half")
        .expect_err("not a layout");
    assert!(matches!(err, LayoutError::UnknownLayout { .. }));
    assert!(err.to_string().contains("all-1g.10gb"), "{err}");
    let err = model("A100-80GB")
        .named_layout("all-1g.5gb")
        .expect_err("40GB profile");
    assert!(matches!(err, LayoutError::UnknownProfile { .. }), "{err}");
}

// ------------------------------------------------------------------ property test

/// Reference: plain exhaustive search in input order, no ordering heuristics and no
/// symmetry breaking. `place` must agree with it on every input that passes the budgets.
fn brute_force_fits(m: &ModelCatalog, profiles: &[&'static MigProfile], used: u32) -> bool {
    let Some((first, rest)) = profiles.split_first() else {
        return true;
    };
    first.placements.iter().any(|&s| {
        let mask = ((1u32 << first.size) - 1) << s;
        u32::from(s + first.size) <= u32::from(m.total_slots)
            && used & mask == 0
            && brute_force_fits(m, rest, used | mask)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn place_never_overlaps_or_exceeds_budgets(
        model_idx in 0usize..8,
        picks in proptest::collection::vec(0usize..16, 0..10),
    ) {
        let m = &all_models()[model_idx % all_models().len()];
        let names: Vec<&str> = picks
            .iter()
            .map(|i| m.profiles[i % m.profiles.len()].name)
            .collect();
        match m.place(&names) {
            Ok(placed) => {
                prop_assert_eq!(placed.len(), names.len());
                let mut used = 0u32;
                let (mut compute, mut memory) = (0u32, 0u32);
                for p in &placed {
                    prop_assert!(p.profile.placements.contains(&p.start));
                    prop_assert!(p.slots().end <= m.total_slots);
                    let mask = ((1u32 << p.profile.size) - 1) << p.start;
                    prop_assert_eq!(used & mask, 0, "overlap in {:?}", starts(&placed));
                    used |= mask;
                    compute += u32::from(p.profile.compute_slices);
                    memory += u32::from(p.profile.memory_slices);
                }
                prop_assert!(compute <= u32::from(m.compute_slices));
                prop_assert!(memory <= u32::from(m.total_slots));
                for prof in m.profiles {
                    let n = placed.iter().filter(|p| p.profile.name == prof.name).count();
                    prop_assert!(n <= usize::from(prof.max_instances));
                }
                let me = placed.iter().filter(|p| p.profile.media_extensions).count();
                prop_assert!(me <= usize::from(m.max_media_instances));
            }
            Err(LayoutError::NoValidPlacement { .. }) => {
                let resolved: Vec<&'static MigProfile> =
                    names.iter().filter_map(|n| m.profile(n)).collect();
                prop_assert!(
                    !brute_force_fits(m, &resolved, 0),
                    "refused a layout that fits: {:?}", names
                );
            }
            Err(_) => {
                // Budget refusals: the budgets are necessary conditions, so the
                // exhaustive search must not find a fit either when it is within slots.
                let resolved: Vec<&'static MigProfile> =
                    names.iter().filter_map(|n| m.profile(n)).collect();
                let over_limits = m.profiles.iter().any(|prof| {
                    resolved.iter().filter(|r| r.name == prof.name).count()
                        > usize::from(prof.max_instances)
                }) || resolved.iter().filter(|r| r.media_extensions).count()
                    > usize::from(m.max_media_instances);
                if !over_limits {
                    prop_assert!(!brute_force_fits(m, &resolved, 0), "{:?}", names);
                }
            }
        }
    }
}

// ------------------------------------------------------------------ incremental placement

#[test]
fn place_around_keeps_existing_instances_in_place() {
    let m = model("H100-80GB");
    // A 3g at 0:4 is already there; two 2g instances fit only at 4 (and 6 is 1 slot).
    let existing = m.place(&["3g.40gb"]).expect("fits");
    assert_eq!(existing[0].start, 0);
    let added = m
        .place_around(&existing, &["2g.20gb", "1g.10gb"])
        .expect("fits beside the 3g");
    assert_eq!(starts(&added), [("2g.20gb", 4), ("1g.10gb", 6)]);
    // A second 2g no longer fits with the 3g pinned at 0, although the same four
    // profiles fit on an empty GPU (3g at 4): pinned instances are never moved.
    assert!(m.place(&["3g.40gb", "2g.20gb", "2g.20gb"]).is_ok());
    assert_eq!(
        m.place_around(&existing, &["2g.20gb", "2g.20gb"]),
        Err(LayoutError::NoValidPlacement {
            model: "H100-80GB".into(),
            profiles: "1x 3g.40gb + 2x 2g.20gb".into(),
        })
    );
    // 4g's only start slot (0) is taken by the pinned 3g.
    assert!(matches!(
        m.place_around(&existing, &["4g.40gb"]),
        Err(LayoutError::NoValidPlacement { .. })
    ));
    // Budgets include the existing instances.
    assert!(matches!(
        m.place_around(&existing, &["3g.40gb", "1g.10gb"]),
        Err(LayoutError::OutOfMemorySlices { requested: 9, .. })
    ));
    assert!(matches!(
        m.place_around(&existing, &["3g.40gb", "3g.40gb"]),
        Err(LayoutError::TooManyInstances {
            requested: 3,
            max: 2,
            ..
        })
    ));
}

#[test]
fn place_around_rejects_impossible_existing_instances() {
    let m = model("A100-80GB");
    let three_g = m.profile("3g.40gb").expect("profile");
    let bad_start = [Placement {
        profile: three_g,
        start: 2,
    }];
    assert_eq!(
        m.place_around(&bad_start, &[]),
        Err(LayoutError::InvalidExisting {
            model: "A100-80GB".into(),
            profile: "3g.40gb".into(),
            start: 2
        })
    );
    let one_g = m.profile("1g.10gb").expect("profile");
    let overlapping = [
        Placement {
            profile: three_g,
            start: 0,
        },
        Placement {
            profile: one_g,
            start: 3,
        },
    ];
    assert!(matches!(
        m.place_around(&overlapping, &[]),
        Err(LayoutError::InvalidExisting { start: 3, .. })
    ));
    // A profile from another model's table is refused by name.
    let other = model("A100-40GB").profile("1g.5gb").expect("profile");
    assert!(matches!(
        m.place_around(
            &[Placement {
                profile: other,
                start: 0
            }],
            &[]
        ),
        Err(LayoutError::UnknownProfile { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn place_around_never_moves_or_overlaps_existing(
        model_idx in 0usize..8,
        first in proptest::collection::vec(0usize..16, 0..5),
        second in proptest::collection::vec(0usize..16, 0..5),
    ) {
        let m = &all_models()[model_idx % all_models().len()];
        let pick = |v: &[usize]| -> Vec<&'static str> {
            v.iter().map(|i| m.profiles[i % m.profiles.len()].name).collect()
        };
        let Ok(existing) = m.place(&pick(&first)) else {
            return Ok(());
        };
        let mut fixed = 0u32;
        for p in &existing {
            fixed |= ((1u32 << p.profile.size) - 1) << p.start;
        }
        match m.place_around(&existing, &pick(&second)) {
            Ok(added) => {
                let mut used = fixed;
                for p in &added {
                    prop_assert!(p.profile.placements.contains(&p.start));
                    let mask = ((1u32 << p.profile.size) - 1) << p.start;
                    prop_assert_eq!(used & mask, 0);
                    used |= mask;
                }
            }
            Err(LayoutError::NoValidPlacement { .. }) => {
                let resolved: Vec<&'static MigProfile> =
                    pick(&second).iter().filter_map(|n| m.profile(n)).collect();
                prop_assert!(!brute_force_fits(m, &resolved, fixed));
            }
            Err(_) => {}
        }
    }
}

// ------------------------------------------------------------------ docs stay in sync

/// One row of the profile table in `docs/mig-catalog.md`.
fn doc_row(m: &ModelCatalog, p: &MigProfile) -> String {
    let starts: Vec<String> = p.placements.iter().map(u8::to_string).collect();
    format!(
        "| {} | {} | {} | {} | {}/{} | {} | {} | {} | {{{}}}:{} |",
        m.model,
        p.name,
        p.gi_profile_id,
        p.compute_slices,
        p.memory_slices,
        m.total_slots,
        p.memory_mib,
        p.sm_count,
        p.max_instances,
        starts.join(","),
        p.size
    )
}

#[test]
fn docs_table_matches_the_catalog() {
    let doc = include_str!("../../../docs/mig-catalog.md");
    let mut missing = Vec::new();
    for m in all_models() {
        for p in m.profiles {
            let row = doc_row(m, p);
            if !doc.contains(&row) {
                missing.push(row);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/mig-catalog.md is out of date; expected rows:\n{}",
        missing.join("\n")
    );
}
