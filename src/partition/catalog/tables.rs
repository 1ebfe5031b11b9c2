//! The MIG profile tables, one `ModelCatalog` per GPU model: pure data, no logic.
//!
//! Sources (read 2026-11, see `docs/mig-catalog.md` for the full list):
//! - Profile names, instance counts, memory/SM fractions: NVIDIA MIG User Guide,
//!   "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html).
//! - GI profile ids, memory (GiB as `nvidia-smi mig -lgip` prints it, here × 1024 = MiB)
//!   and SM counts: `nvidia-smi mig -lgip` transcripts posted in NVIDIA/mig-parted and
//!   NVIDIA/gpu-operator pull requests and issues (A100: mig-parted README / public
//!   transcripts; H100 NVL: gpu-operator#900; H200: mig-parted#120; B200:
//!   mig-parted#166 / gpu-operator#1242; GB200 production boards: mig-parted#227).
//! - Placements: `nvidia-smi mig -lgipp` transcripts (A100, H100, H100 NVL, A30):
//!   8 memory-slice slots; 1g `{0..6}:1`, 1g.2x `{0,2,4,6}:2`, 2g `{0,2,4}:2`,
//!   3g `{0,4}:4`, 4g `{0}:4`, 7g `{0}:8`; A30 has 4 slots.
//! - Balanced layouts: NVIDIA mig-parted `deployments/systemd/config-default.yaml`
//!   (`all-balanced`), GB200 names as fixed by mig-parted#228.
//!
//! Memory sizes move by ±0.25 GiB between driver releases; the values below are one
//! published transcript each. B200/GB200 3g/4g/7g memory and SM counts were not in any
//! transcript found: they are ESTIMATES (marked), derived from the documented fractions.

use super::{MigProfile, ModelCatalog};

/// Start slots (memory-slice index) of each placement family on the 8-slot models.
const P1G: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const P1G_2X: &[u8] = &[0, 2, 4, 6];
const P2G: &[u8] = &[0, 2, 4];
const P3G: &[u8] = &[0, 4];
const P_FULL: &[u8] = &[0];

/// A30: four slots.
const A30_P1G: &[u8] = &[0, 1, 2, 3];
const A30_P2G: &[u8] = &[0, 2];

/// `GiB` as `nvidia-smi mig -lgip` prints it (two decimals, in hundredths: `975` =
/// 9.75 GiB) back to MiB. The driver sizes GPU instances in 1/16 GiB (64 MiB) steps and
/// nvidia-smi rounds those to two decimals (5.8125 -> 5.81), so round to the nearest 64 MiB.
const fn gib(hundredths: u64) -> u64 {
    (hundredths * 16 + 50) / 100 * 64
}

/// Shorthand constructor so each table row reads like an `nvidia-smi mig -lgip` line.
#[allow(clippy::too_many_arguments)]
const fn p(
    name: &'static str,
    gi_profile_id: u32,
    compute_slices: u8,
    size: u8,
    memory_mib: u64,
    sm_count: u32,
    max_instances: u8,
    placements: &'static [u8],
) -> MigProfile {
    MigProfile {
        name,
        compute_slices,
        memory_slices: size,
        memory_mib,
        sm_count,
        size,
        placements,
        max_instances,
        media_extensions: has_me_suffix(name),
        gi_profile_id,
    }
}

const fn has_me_suffix(name: &str) -> bool {
    let b = name.as_bytes();
    let n = b.len();
    n >= 3 && b[n - 3] == b'+' && b[n - 2] == b'm' && b[n - 1] == b'e'
}

// ---------------------------------------------------------------- A30 (24 GB)
// lgip (public transcript): 1g.6gb 14 4/4 5.81 SM14; 1g.6gb+me 21 1/1; 2g.12gb 5 2/2
// 11.69 SM28; 2g.12gb+me 6 1/1 (R525+); 4g.24gb 0 1/1 23.44 SM56.
// lgipp: 14 {0,1,2,3}:1, 21 {0,1,2,3}:1, 5 {0,2}:2, 0 {0}:4.
const A30: &[MigProfile] = &[
    p("1g.6gb", 14, 1, 1, gib(581), 14, 4, A30_P1G),
    p("1g.6gb+me", 21, 1, 1, gib(581), 14, 1, A30_P1G),
    p("2g.12gb", 5, 2, 2, gib(1169), 28, 2, A30_P2G),
    p("2g.12gb+me", 6, 2, 2, gib(1169), 28, 1, A30_P2G),
    p("4g.24gb", 0, 4, 4, gib(2344), 56, 1, P_FULL),
];

// ---------------------------------------------------------------- A100 40 GB
// lgip: 1g.5gb 19 7/7 4.75 SM14; +me 20 1/1; 1g.10gb 15 4/4 9.62 SM14; 2g.10gb 14 3/3
// 9.62 SM28; 3g.20gb 9 2/2 19.50 SM42; 4g.20gb 5 1/1 19.50 SM56; 7g.40gb 0 1/1 39.25 SM98.
const A100_40GB: &[MigProfile] = &[
    p("1g.5gb", 19, 1, 1, gib(475), 14, 7, P1G),
    p("1g.5gb+me", 20, 1, 1, gib(475), 14, 1, P1G),
    p("1g.10gb", 15, 1, 2, gib(962), 14, 4, P1G_2X),
    p("2g.10gb", 14, 2, 2, gib(962), 28, 3, P2G),
    p("3g.20gb", 9, 3, 4, gib(1950), 42, 2, P3G),
    p("4g.20gb", 5, 4, 4, gib(1950), 56, 1, P_FULL),
    p("7g.40gb", 0, 7, 8, gib(3925), 98, 1, P_FULL),
];

// ---------------------------------------------------------------- A100 80 GB
// lgip: 1g.10gb 19 7/7 9.50 SM14; +me 20 1/1 9.50; 1g.20gb 15 4/4 19.50 SM14;
// 2g.20gb 14 3/3 19.50 SM28; 3g.40gb 9 2/2 39.25 SM42; 4g.40gb 5 1/1 39.25 SM56;
// 7g.80gb 0 1/1 79.00 SM98.
const A100_80GB: &[MigProfile] = &[
    p("1g.10gb", 19, 1, 1, gib(950), 14, 7, P1G),
    p("1g.10gb+me", 20, 1, 1, gib(950), 14, 1, P1G),
    p("1g.20gb", 15, 1, 2, gib(1950), 14, 4, P1G_2X),
    p("2g.20gb", 14, 2, 2, gib(1950), 28, 3, P2G),
    p("3g.40gb", 9, 3, 4, gib(3925), 42, 2, P3G),
    p("4g.40gb", 5, 4, 4, gib(3925), 56, 1, P_FULL),
    p("7g.80gb", 0, 7, 8, gib(7900), 98, 1, P_FULL),
];

// ---------------------------------------------------------------- H100 80 GB (SXM5 / PCIe)
// lgip (H100 80GB HBM3): 1g.10gb 19 7/7 9.75 SM16; +me 20 1/1; 1g.20gb 15 4/4 19.62
// SM26; 2g.20gb 14 3/3 19.62 SM32; 3g.40gb 9 2/2 39.50 SM60; 4g.40gb 5 1/1 39.50 SM64;
// 7g.80gb 0 1/1 79.25 SM132. (H100 PCIe has 114 SMs; its per-profile SM counts are
// lower and not tabulated here.)
const H100_80GB: &[MigProfile] = &[
    p("1g.10gb", 19, 1, 1, gib(975), 16, 7, P1G),
    p("1g.10gb+me", 20, 1, 1, gib(975), 16, 1, P1G),
    p("1g.20gb", 15, 1, 2, gib(1962), 26, 4, P1G_2X),
    p("2g.20gb", 14, 2, 2, gib(1962), 32, 3, P2G),
    p("3g.40gb", 9, 3, 4, gib(3950), 60, 2, P3G),
    p("4g.40gb", 5, 4, 4, gib(3950), 64, 1, P_FULL),
    p("7g.80gb", 0, 7, 8, gib(7925), 132, 1, P_FULL),
];

// ---------------------------------------------------------------- H100 NVL 94 GB
// lgip (gpu-operator#900): 1g.12gb 19 7/7 10.75 SM16; +me 20 1/1; 1g.24gb 15 4/4 21.62
// SM26; 2g.24gb 14 3/3 21.62 SM32; 3g.47gb 9 2/2 46.38 SM60; 4g.47gb 5 1/1 46.38 SM64;
// 7g.94gb 0 1/1 93.12 SM132. lgipp identical to A100/H100.
const H100_94GB: &[MigProfile] = &[
    p("1g.12gb", 19, 1, 1, gib(1075), 16, 7, P1G),
    p("1g.12gb+me", 20, 1, 1, gib(1075), 16, 1, P1G),
    p("1g.24gb", 15, 1, 2, gib(2162), 26, 4, P1G_2X),
    p("2g.24gb", 14, 2, 2, gib(2162), 32, 3, P2G),
    p("3g.47gb", 9, 3, 4, gib(4638), 60, 2, P3G),
    p("4g.47gb", 5, 4, 4, gib(4638), 64, 1, P_FULL),
    p("7g.94gb", 0, 7, 8, gib(9312), 132, 1, P_FULL),
];

// ---------------------------------------------------------------- H200 141 GB (SXM / NVL)
// lgip (mig-parted#120): 1g.18gb 19 7/7 16.00 SM16; +me 20 1/1; 1g.35gb 15 4/4 32.25
// SM26; 2g.35gb 14 3/3 32.25 SM32; 3g.71gb 9 2/2 69.50 SM60; 4g.71gb 5 1/1 69.50 SM64;
// 7g.141gb 0 1/1 139.75 SM132.
const H200_141GB: &[MigProfile] = &[
    p("1g.18gb", 19, 1, 1, gib(1600), 16, 7, P1G),
    p("1g.18gb+me", 20, 1, 1, gib(1600), 16, 1, P1G),
    p("1g.35gb", 15, 1, 2, gib(3225), 26, 4, P1G_2X),
    p("2g.35gb", 14, 2, 2, gib(3225), 32, 3, P2G),
    p("3g.71gb", 9, 3, 4, gib(6950), 60, 2, P3G),
    p("4g.71gb", 5, 4, 4, gib(6950), 64, 1, P_FULL),
    p("7g.141gb", 0, 7, 8, gib(13975), 132, 1, P_FULL),
];

// ---------------------------------------------------------------- B200 180 GB
// lgip (mig-parted#166 / gpu-operator#1242): 1g.23gb 19 7/7 22.00 SM18; +me 20 1/1;
// 1g.45gb 15 4/4 44.25 SM30; 2g.45gb 14 3/3 44.25 SM36. Docs: 3g.90gb 4/8 mem 3/7 SM ×2,
// 4g.90gb 4/8 mem 4/7 SM ×1, 7g.180gb full ×1.
// ESTIMATES: 3g/4g memory = 2 × the 2-slice value; 7g memory = 4 × the 2-slice value;
// SMs 3g = 3 × 18, 4g = 4 × 18, 7g = the whole GPU (148). Placements assumed equal to
// Hopper's (same 1/8 memory, 1/7 SM geometry and the same instance counts).
const B200: &[MigProfile] = &[
    p("1g.23gb", 19, 1, 1, gib(2200), 18, 7, P1G),
    p("1g.23gb+me", 20, 1, 1, gib(2200), 18, 1, P1G),
    p("1g.45gb", 15, 1, 2, gib(4425), 30, 4, P1G_2X),
    p("2g.45gb", 14, 2, 2, gib(4425), 36, 3, P2G),
    p("3g.90gb", 9, 3, 4, 2 * gib(4425), 54, 2, P3G),
    p("4g.90gb", 5, 4, 4, 2 * gib(4425), 72, 1, P_FULL),
    p("7g.180gb", 0, 7, 8, 4 * gib(4425), 148, 1, P_FULL),
];

// ---------------------------------------------------------------- GB200 (186 GB per GPU)
// lgip on production boards (mig-parted#227; names fixed by mig-parted#228):
// 1g.23gb 19 7/7 22.00 SM18; +me 20 1/1; 1g.47gb 15 4/4 45.50 SM32; 2g.47gb 14 3/3
// 45.50 SM38. ESTIMATES as for B200: 3g.93gb / 4g.93gb memory = 2 × 45.50 GiB,
// 7g.186gb = 4 × 45.50 GiB; SMs 3g = 3 × 18, 4g = 2 × 38, 7g = 152 (the whole GPU:
// GB200 has 152 SMs against B200's 148, as its larger 1g/2g SM counts suggest).
const GB200: &[MigProfile] = &[
    p("1g.23gb", 19, 1, 1, gib(2200), 18, 7, P1G),
    p("1g.23gb+me", 20, 1, 1, gib(2200), 18, 1, P1G),
    p("1g.47gb", 15, 1, 2, gib(4550), 32, 4, P1G_2X),
    p("2g.47gb", 14, 2, 2, gib(4550), 38, 3, P2G),
    p("3g.93gb", 9, 3, 4, 2 * gib(4550), 54, 2, P3G),
    p("4g.93gb", 5, 4, 4, 2 * gib(4550), 76, 1, P_FULL),
    p("7g.186gb", 0, 7, 8, 4 * gib(4550), 152, 1, P_FULL),
];

/// Every model, in lookup tie-break order (first wins a tie).
pub(super) static MODELS: &[ModelCatalog] = &[
    ModelCatalog {
        model: "A30",
        total_slots: 4,
        compute_slices: 4,
        total_sms: 56,
        memory_mib: 24576,
        max_media_instances: 1,
        profiles: A30,
        balanced: &[("1g.6gb", 2), ("2g.12gb", 1)],
        name_keys: &[&["A30"]],
        memory_range_mib: (16 * 1024, 32 * 1024),
    },
    ModelCatalog {
        model: "A100-40GB",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 108,
        memory_mib: 40960,
        max_media_instances: 1,
        profiles: A100_40GB,
        balanced: &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
        name_keys: &[&["A100"], &["A100", "40GB"], &["A800"], &["A800", "40GB"]],
        memory_range_mib: (32 * 1024, 60 * 1024),
    },
    ModelCatalog {
        model: "A100-80GB",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 108,
        memory_mib: 81920,
        max_media_instances: 1,
        profiles: A100_80GB,
        balanced: &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        name_keys: &[&["A100"], &["A100", "80GB"], &["A800"], &["A800", "80GB"]],
        memory_range_mib: (60 * 1024, 88 * 1024),
    },
    ModelCatalog {
        model: "H100-80GB",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 132,
        memory_mib: 81559,
        max_media_instances: 1,
        profiles: H100_80GB,
        balanced: &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        name_keys: &[&["H100"], &["H100", "80GB"], &["H800"], &["H800", "80GB"]],
        memory_range_mib: (60 * 1024, 88 * 1024),
    },
    ModelCatalog {
        model: "H100-94GB",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 132,
        memory_mib: 95830,
        max_media_instances: 1,
        profiles: H100_94GB,
        balanced: &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.47gb", 1)],
        name_keys: &[
            &["H100"],
            &["H100", "NVL"],
            &["H100", "94GB"],
            &["H800", "NVL"],
            &["H800", "94GB"],
        ],
        memory_range_mib: (88 * 1024, 100 * 1024),
    },
    ModelCatalog {
        model: "H200-141GB",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 132,
        memory_mib: 143771,
        max_media_instances: 1,
        profiles: H200_141GB,
        balanced: &[("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)],
        name_keys: &[&["H200"], &["H200", "141GB"], &["H200", "NVL"]],
        memory_range_mib: (128 * 1024, 150 * 1024),
    },
    ModelCatalog {
        model: "B200",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 148,
        memory_mib: 183359,
        max_media_instances: 1,
        profiles: B200,
        balanced: &[("1g.23gb", 2), ("2g.45gb", 1), ("3g.90gb", 1)],
        name_keys: &[&["B200"], &["B200", "180GB"]],
        memory_range_mib: (150 * 1024, 200 * 1024),
    },
    ModelCatalog {
        model: "GB200",
        total_slots: 8,
        compute_slices: 7,
        total_sms: 152,
        memory_mib: 189471,
        max_media_instances: 1,
        profiles: GB200,
        balanced: &[("1g.23gb", 2), ("2g.47gb", 1), ("3g.93gb", 1)],
        name_keys: &[&["GB200"], &["GB200", "186GB"]],
        memory_range_mib: (150 * 1024, 200 * 1024),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gib_maps_nvidia_smi_rounding_back_to_64_mib_steps() {
        let cases = [
            (975, 9984),
            (1962, 20096),
            (4638, 47488),
            (9312, 95360),
            (581, 5952),
            (2344, 24000),
            (1169, 11968),
            (962, 9856),
            (1600, 16384),
        ];
        for (hundredths, mib) in cases {
            assert_eq!(gib(hundredths), mib, "gib({hundredths})");
        }
    }

    #[test]
    fn me_suffix_detection() {
        assert!(has_me_suffix("1g.10gb+me"));
        assert!(!has_me_suffix("1g.10gb"));
        assert!(!has_me_suffix("me"));
    }
}
