//! Pure conversions from raw NVML/sysfs values to inventory fields: PCI bus IDs, the
//! CUDA version string, NUMA nodes, architecture names and the SM-count fallback table.

/// NVML's bus ID (`00000000:3B:00.0`, 8-digit domain) in the `0000:3B:00.0` form the
/// inventory and the kubelet use: 4-digit domain, upper-case hex. `None` if malformed.
pub fn format_bus_id(raw: &str) -> Option<String> {
    let raw = raw.trim().trim_end_matches('\0');
    let mut parts = raw.split(':');
    let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (device, function) = rest.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    if device > 0x1f || function > 7 {
        return None;
    }
    Some(format!("{domain:04X}:{bus:02X}:{device:02X}.{function:X}"))
}

/// The directory name of a PCI device under `/sys/bus/pci/devices/` (lower-case).
pub fn sysfs_bus_id(bus_id: &str) -> String {
    bus_id.to_ascii_lowercase()
}

/// `/sys/bus/pci/devices/<id>/numa_node` content: `-1` (no NUMA affinity) is `None`.
pub fn parse_numa_node(content: &str) -> Option<u32> {
    content
        .trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// `nvmlSystemGetCudaDriverVersion_v2` (e.g. `12080`) as `12.8`.
pub fn format_cuda_version(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// Architecture name by compute capability, for drivers whose
/// `nvmlDeviceGetArchitecture` fails or says "Unknown".
pub fn architecture_for_cc(major: u32, minor: u32) -> &'static str {
    match (major, minor) {
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, 0) | (7, 2) => "Volta",
        (7, 5) => "Turing",
        (8, 9) => "Ada",
        (8, _) => "Ampere",
        (9, _) => "Hopper",
        (10, _) | (12, _) => "Blackwell",
        _ => "Unknown",
    }
}

/// SM counts of data-center GPUs by product-name fragment and compute capability, for
/// drivers where `nvmlDeviceGetAttributes` is NotSupported on a non-MIG GPU. The
/// compute capability alone is not enough (A100 and A30 are both 8.0 with 108 and 56
/// SMs), so the product name picks the row and the capability must agree. Numbers from
/// NVIDIA's product briefs/datasheets. Order matters: longer fragments first.
const SM_TABLE: &[(&str, (u32, u32), u32)] = &[
    ("H100 PCIe", (9, 0), 114),
    ("H100 NVL", (9, 0), 132),
    ("H100", (9, 0), 132),
    ("H200", (9, 0), 132),
    ("GH200", (9, 0), 132),
    ("H800", (9, 0), 132),
    ("B200", (10, 0), 148),
    ("A100", (8, 0), 108),
    ("A800", (8, 0), 108),
    ("A30", (8, 0), 56),
    ("A40", (8, 6), 84),
    ("A10", (8, 6), 72),
    ("L40S", (8, 9), 142),
    ("L40", (8, 9), 142),
    ("L4", (8, 9), 58),
    ("V100", (7, 0), 80),
    ("T4", (7, 5), 40),
];

/// SM count from the table above (`SM_TABLE`), or `None` for a GPU the table does not know.
pub fn sm_count_fallback(product_name: &str, cc: (u32, u32)) -> Option<u32> {
    SM_TABLE
        .iter()
        .find(|(fragment, table_cc, _)| product_name.contains(fragment) && *table_cc == cc)
        .map(|(_, _, sms)| *sms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalised() {
        let cases = [
            ("00000000:3B:00.0", Some("0000:3B:00.0")),
            ("0000:3b:00.0", Some("0000:3B:00.0")),
            ("00000001:AF:1F.7", Some("0001:AF:1F.7")),
            ("00000000:3B:00.0\0\0", Some("0000:3B:00.0")),
            ("3B:00.0", None),
            ("0000:3B:00", None),
            ("0000:3B:20.0", None),
            ("0000:ZZ:00.0", None),
            ("0000:3B:00.0:1", None),
            ("", None),
        ];
        for (raw, want) in cases {
            assert_eq!(format_bus_id(raw).as_deref(), want, "{raw:?}");
        }
        assert_eq!(sysfs_bus_id("0000:3B:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn numa_nodes_parse_and_minus_one_is_none() {
        for (raw, want) in [
            ("0\n", Some(0)),
            ("3", Some(3)),
            ("-1\n", None),
            ("", None),
            ("x", None),
        ] {
            assert_eq!(parse_numa_node(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn cuda_versions_format_as_major_minor() {
        for (raw, want) in [
            (12080, "12.8"),
            (12000, "12.0"),
            (11040, "11.4"),
            (13010, "13.1"),
        ] {
            assert_eq!(format_cuda_version(raw), want);
        }
    }

    #[test]
    fn architectures_by_compute_capability() {
        for (cc, want) in [
            ((7, 0), "Volta"),
            ((7, 5), "Turing"),
            ((8, 0), "Ampere"),
            ((8, 6), "Ampere"),
            ((8, 9), "Ada"),
            ((9, 0), "Hopper"),
            ((10, 0), "Blackwell"),
            ((2, 0), "Unknown"),
        ] {
            assert_eq!(architecture_for_cc(cc.0, cc.1), want, "{cc:?}");
        }
    }

    #[test]
    fn sm_fallback_needs_name_and_matching_capability() {
        let cases = [
            ("NVIDIA A100-SXM4-80GB", (8, 0), Some(108)),
            ("NVIDIA A30", (8, 0), Some(56)),
            ("NVIDIA A10", (8, 6), Some(72)),
            ("NVIDIA H100 PCIe", (9, 0), Some(114)),
            ("NVIDIA H100 80GB HBM3", (9, 0), Some(132)),
            ("NVIDIA H200", (9, 0), Some(132)),
            ("NVIDIA L40S", (8, 9), Some(142)),
            ("NVIDIA L4", (8, 9), Some(58)),
            ("NVIDIA A100-SXM4-80GB", (9, 0), None),
            ("NVIDIA GeForce RTX 4090", (8, 9), None),
        ];
        for (name, cc, want) in cases {
            assert_eq!(sm_count_fallback(name, cc), want, "{name}");
        }
    }
}
