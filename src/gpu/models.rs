//! GPU model specs for the fake backend: what NVML would report for each known model
//! (product name, memory, SMs, compute capability, NVLink links), looked up by short
//! name, and the `--fake-gpus "8xH100-80GB"` / `"2xA100-80GB,1xL4"` spec parser.
//!
//! Memory is NVML's total in MiB as `nvidia-smi` prints it (the usable size, not the
//! marketing GB). Every value below was seen in a public `nvidia-smi` transcript except
//! where a comment says otherwise; the MIG geometry of the MIG-capable models lives in
//! [`crate::partition::catalog`] and is reached through [`GpuModel::mig_catalog`].

/// One GPU model as the NVML backend would describe it.
#[derive(Debug, PartialEq, Eq, serde::Serialize)]
pub struct GpuModel {
    /// Canonical short name used in specs and configs, e.g. `"H100-80GB"`.
    pub short_name: &'static str,
    /// Other accepted names (case-insensitive), e.g. `"H100-NVL"` for `"H100-94GB"`.
    pub aliases: &'static [&'static str],
    /// `nvmlDeviceGetName`, e.g. `"NVIDIA H100 80GB HBM3"`.
    pub product_name: &'static str,
    /// `nvmlDeviceGetMemoryInfo().total` in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub sm_count: u32,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// `"Ampere"`, `"Hopper"`, `"Blackwell"`, `"Ada Lovelace"`, `"Turing"`.
    pub architecture: &'static str,
    /// Whether the model supports MIG (it then has a MIG catalog, `partition::catalog`).
    pub mig_capable: bool,
    /// NVLink links per GPU (0: PCIe only). NVSwitch boards: all links to the switch.
    pub nvlink_links: u32,
}

impl GpuModel {
    fn answers_to(&self, name: &str) -> bool {
        self.short_name.eq_ignore_ascii_case(name)
            || self.product_name.eq_ignore_ascii_case(name)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }
}

/// Every known model; `short_name`s and aliases are unique (a test checks).
pub static MODELS: &[GpuModel] = &[
    GpuModel {
        short_name: "H100-80GB",
        aliases: &["H100", "H100-SXM", "H100-SXM5-80GB", "H100-80GB-HBM3"],
        product_name: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        sm_count: 132,
        compute_capability: (9, 0),
        architecture: "Hopper",
        mig_capable: true,
        nvlink_links: 18,
    },
    GpuModel {
        short_name: "H100-PCIE",
        aliases: &["H100-PCIE-80GB"],
        product_name: "NVIDIA H100 PCIe",
        // Same 81559 MiB as the SXM part (not verified in a transcript here).
        memory_mib: 81559,
        sm_count: 114,
        compute_capability: (9, 0),
        architecture: "Hopper",
        mig_capable: true,
        // NVLink bridge pairs (600 GB/s = 12 NVLink4 links).
        nvlink_links: 12,
    },
    GpuModel {
        short_name: "H100-94GB",
        aliases: &["H100-NVL", "H100NVL"],
        product_name: "NVIDIA H100 NVL",
        memory_mib: 95830,
        sm_count: 132,
        compute_capability: (9, 0),
        architecture: "Hopper",
        mig_capable: true,
        // NVLink bridge pairs (600 GB/s = 12 NVLink4 links).
        nvlink_links: 12,
    },
    GpuModel {
        short_name: "H200-141GB",
        aliases: &["H200", "H200-SXM", "H200-SXM5-141GB"],
        product_name: "NVIDIA H200",
        // 143771 MiB seen on H200 NVL; the SXM part reports the same HBM3e size.
        memory_mib: 143771,
        sm_count: 132,
        compute_capability: (9, 0),
        architecture: "Hopper",
        mig_capable: true,
        nvlink_links: 18,
    },
    GpuModel {
        short_name: "A100-80GB",
        aliases: &["A100-SXM4-80GB"],
        product_name: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        sm_count: 108,
        compute_capability: (8, 0),
        architecture: "Ampere",
        mig_capable: true,
        nvlink_links: 12,
    },
    GpuModel {
        short_name: "A100-40GB",
        aliases: &["A100", "A100-SXM4-40GB"],
        product_name: "NVIDIA A100-SXM4-40GB",
        memory_mib: 40960,
        sm_count: 108,
        compute_capability: (8, 0),
        architecture: "Ampere",
        mig_capable: true,
        nvlink_links: 12,
    },
    GpuModel {
        short_name: "A30",
        aliases: &["A30-24GB"],
        product_name: "NVIDIA A30",
        memory_mib: 24576,
        sm_count: 56,
        compute_capability: (8, 0),
        architecture: "Ampere",
        mig_capable: true,
        // NVLink bridge pairs (200 GB/s = 4 NVLink3 links).
        nvlink_links: 4,
    },
    GpuModel {
        short_name: "B200",
        aliases: &["B200-180GB"],
        product_name: "NVIDIA B200",
        memory_mib: 183359,
        sm_count: 148,
        compute_capability: (10, 0),
        architecture: "Blackwell",
        mig_capable: true,
        nvlink_links: 18,
    },
    GpuModel {
        short_name: "GB200",
        aliases: &["GB200-186GB"],
        product_name: "NVIDIA GB200",
        memory_mib: 189471,
        sm_count: 152,
        compute_capability: (10, 0),
        architecture: "Blackwell",
        mig_capable: true,
        // `nvidia-smi topo -m` on GB200 shows NV18 between the GPUs.
        nvlink_links: 18,
    },
    GpuModel {
        short_name: "L4",
        aliases: &["L4-24GB"],
        product_name: "NVIDIA L4",
        memory_mib: 23034,
        sm_count: 58,
        compute_capability: (8, 9),
        architecture: "Ada Lovelace",
        mig_capable: false,
        nvlink_links: 0,
    },
    GpuModel {
        short_name: "L40S",
        aliases: &["L40S-48GB"],
        product_name: "NVIDIA L40S",
        memory_mib: 46068,
        sm_count: 142,
        compute_capability: (8, 9),
        architecture: "Ada Lovelace",
        mig_capable: false,
        nvlink_links: 0,
    },
    GpuModel {
        short_name: "T4",
        aliases: &["T4-16GB"],
        product_name: "Tesla T4",
        memory_mib: 15360,
        sm_count: 40,
        compute_capability: (7, 5),
        architecture: "Turing",
        mig_capable: false,
        nvlink_links: 0,
    },
    GpuModel {
        short_name: "A10",
        aliases: &["A10-24GB"],
        product_name: "NVIDIA A10",
        // With ECC enabled (the data-center default); 24564 MiB with ECC off.
        memory_mib: 23028,
        sm_count: 72,
        compute_capability: (8, 6),
        architecture: "Ampere",
        mig_capable: false,
        nvlink_links: 0,
    },
];

/// Most GPUs one spec token may ask for; a guard against typos like `800xH100`.
pub const MAX_GPUS_PER_TOKEN: u32 = 256;

/// Why a model name or fake-GPU spec was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum ModelError {
    #[error("fake GPU spec is empty; expected e.g. \"8xH100-80GB\" or \"2xA100-80GB,1xL4\"")]
    EmptySpec,
    #[error("fake GPU spec {spec:?}: entry {position} is empty (stray comma?)")]
    EmptyToken { spec: String, position: usize },
    #[error("fake GPU spec entry {token:?}: unknown GPU model {model:?}; known models: {known}")]
    UnknownModel {
        token: String,
        model: String,
        known: String,
    },
    #[error(
        "fake GPU spec entry {token:?}: count {count:?} must be a whole number from 1 to {max}"
    )]
    BadCount {
        token: String,
        count: String,
        max: u32,
    },
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// Finds a model by short name, alias or NVML product name (case-insensitive).
pub fn find_model(name: &str) -> Option<&'static GpuModel> {
    let name = name.trim();
    MODELS.iter().find(|m| m.answers_to(name))
}

/// Known short names, comma-separated, for error messages.
pub fn known_models() -> String {
    MODELS
        .iter()
        .map(|m| m.short_name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a `--fake-gpus` spec: comma-separated `<count>x<model>` entries, e.g.
/// `"8xH100-80GB"` or `"2xA100-80GB, 1xL4"`; a bare model means one GPU. Entries keep
/// their order (GPU indices follow it).
pub fn parse_fake_spec(spec: &str) -> Result<Vec<(u32, &'static GpuModel)>> {
    if spec.trim().is_empty() {
        return Err(ModelError::EmptySpec);
    }
    spec.split(',')
        .enumerate()
        .map(|(i, token)| parse_token(spec, i + 1, token.trim()))
        .collect()
}

fn parse_token(spec: &str, position: usize, token: &str) -> Result<(u32, &'static GpuModel)> {
    if token.is_empty() {
        return Err(ModelError::EmptyToken {
            spec: spec.to_string(),
            position,
        });
    }
    // "<digits>x<model>": the count is everything before the first x/X/*, if it is
    // made of digits; otherwise the whole entry is a model name.
    let split = token
        .find(['x', 'X', '*'])
        .filter(|&at| at > 0 && token[..at].trim().chars().all(|c| c.is_ascii_digit()));
    let (count_text, model_name) = match split {
        Some(at) => (Some(token[..at].trim()), token[at + 1..].trim()),
        None if token.starts_with(['x', 'X', '*']) => (Some(""), token[1..].trim()),
        None => (None, token),
    };
    let count = match count_text {
        None => 1,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_GPUS_PER_TOKEN).contains(n))
            .ok_or_else(|| ModelError::BadCount {
                token: token.to_string(),
                count: text.to_string(),
                max: MAX_GPUS_PER_TOKEN,
            })?,
    };
    let model = find_model(model_name).ok_or_else(|| ModelError::UnknownModel {
        token: token.to_string(),
        model: model_name.to_string(),
        known: known_models(),
    })?;
    Ok((count, model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::catalog;

    #[test]
    fn names_are_unique_across_models() {
        let mut seen = std::collections::HashSet::new();
        for m in MODELS {
            for name in std::iter::once(m.short_name)
                .chain(m.aliases.iter().copied())
                .chain(std::iter::once(m.product_name))
            {
                assert!(
                    seen.insert(name.to_ascii_uppercase()),
                    "{name} names two models"
                );
            }
        }
    }

    #[test]
    fn find_model_accepts_short_names_aliases_and_product_names() {
        let cases: &[(&str, Option<&str>)] = &[
            ("H100-80GB", Some("H100-80GB")),
            ("h100-80gb", Some("H100-80GB")),
            ("A100-80GB", Some("A100-80GB")),
            ("A100-40GB", Some("A100-40GB")),
            ("A30", Some("A30")),
            ("H100-94GB", Some("H100-94GB")),
            ("H100-NVL", Some("H100-94GB")),
            ("H200-141GB", Some("H200-141GB")),
            ("H200", Some("H200-141GB")),
            ("B200", Some("B200")),
            ("GB200", Some("GB200")),
            ("L4", Some("L4")),
            ("l40s", Some("L40S")),
            ("T4", Some("T4")),
            ("A10", Some("A10")),
            ("NVIDIA H100 80GB HBM3", Some("H100-80GB")),
            ("Tesla T4", Some("T4")),
            (" A30 ", Some("A30")),
            ("V100", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(find_model(name).map(|m| m.short_name), *want, "{name:?}");
        }
    }

    #[test]
    fn mig_capable_models_have_a_matching_catalog() {
        for m in MODELS {
            let cat = catalog::lookup(m.product_name, m.memory_mib).filter(|_| m.mig_capable);
            assert_eq!(cat.is_some(), m.mig_capable, "{}", m.short_name);
            if let Some(cat) = cat {
                // The catalog found from what NVML would report is the same model.
                if m.short_name != "H100-PCIE" {
                    assert_eq!(cat.model, m.short_name);
                    assert_eq!(cat.memory_mib, m.memory_mib, "{}", m.short_name);
                    assert_eq!(cat.total_sms, m.sm_count, "{}", m.short_name);
                } else {
                    assert_eq!(cat.model, "H100-80GB");
                }
            }
            // Non-MIG models must not be mistaken for a MIG model by name either.
            if !m.mig_capable {
                assert!(catalog::lookup(m.product_name, m.memory_mib).is_none());
            }
        }
    }

    #[test]
    fn parse_fake_spec_accepts_counts_and_lists() {
        let cases: &[(&str, &[(u32, &str)])] = &[
            ("8xH100-80GB", &[(8, "H100-80GB")]),
            ("2xA100-80GB,1xL4", &[(2, "A100-80GB"), (1, "L4")]),
            (" 2 x A100-80GB , 1X l4 ", &[(2, "A100-80GB"), (1, "L4")]),
            ("4*H200", &[(4, "H200-141GB")]),
            ("A30", &[(1, "A30")]),
            ("1xH100-NVL,3xT4", &[(1, "H100-94GB"), (3, "T4")]),
            ("256xT4", &[(256, "T4")]),
        ];
        for (spec, want) in cases {
            let got: Vec<(u32, &str)> = parse_fake_spec(spec)
                .unwrap_or_else(|e| panic!("{spec:?}: {e}"))
                .into_iter()
                .map(|(n, m)| (n, m.short_name))
                .collect();
            assert_eq!(got, *want, "{spec:?}");
        }
    }

    #[test]
    fn parse_fake_spec_errors_name_the_token() {
        assert_eq!(parse_fake_spec("  "), Err(ModelError::EmptySpec));
        assert_eq!(
            parse_fake_spec("2xA100-80GB,,1xL4"),
            Err(ModelError::EmptyToken {
                spec: "2xA100-80GB,,1xL4".into(),
                position: 2
            })
        );
        let err = parse_fake_spec("2xA100-80GB,4xV100").expect_err("V100 unknown");
        assert!(matches!(
            &err,
            ModelError::UnknownModel { token, model, .. } if token == "4xV100" && model == "V100"
        ));
        let msg = err.to_string();
        assert!(msg.contains("\"4xV100\""), "{msg}");
        assert!(
            msg.contains("H100-80GB, H100-PCIE"),
            "lists known models: {msg}"
        );
        for bad in ["0xH100-80GB", "257xT4", "xT4", "-1xT4"] {
            let err = parse_fake_spec(bad).expect_err(bad);
            assert!(
                matches!(
                    err,
                    ModelError::BadCount { .. } | ModelError::UnknownModel { .. }
                ),
                "{bad}: {err:?}"
            );
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
        assert!(matches!(
            parse_fake_spec("0xH100-80GB"),
            Err(ModelError::BadCount { ref count, .. }) if count == "0"
        ));
        assert!(matches!(
            parse_fake_spec("xT4"),
            Err(ModelError::BadCount { ref count, .. }) if count.is_empty()
        ));
    }
}
