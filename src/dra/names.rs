//! The names Tessera's DRA driver publishes and reads back: the driver's name and each
//! device's (`gpu-3`, `gpu-0-mig-1g-10gb-4`, `gpu-2-vgpu`). A leaf: the slices, the
//! preparer, health and the agent all speak them.

use crate::gpu::Inventory;

/// The DRA driver name.
pub const DRIVER: &str = "gpu.tessera.io";

/// A DNS label from a profile name: `1g.10gb+me` → `1g-10gb-me` (as used in MIG device
/// names, which [`parse_device_name`] parses back).
pub fn label(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The device name of a whole GPU: `gpu-<index>`.
pub fn whole_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The device name of a GPU's vGPU capacity: `gpu-<index>-vgpu`.
pub fn vgpu_name(index: u32) -> String {
    format!("gpu-{index}-vgpu")
}

/// The device name of a MIG placement: `gpu-<index>-mig-<profile label>-<start>`.
pub fn mig_name(index: u32, profile: &str, start: u8) -> String {
    format!("gpu-{index}-mig-{}-{start}", label(profile))
}

/// What a published device name stands for (see [`whole_name`], [`mig_name`], [`vgpu_name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    Whole {
        gpu: u32,
    },
    Mig {
        gpu: u32,
        profile_label: String,
        start: u8,
    },
    Vgpu {
        gpu: u32,
    },
}

/// Parse `gpu-3`, `gpu-0-mig-1g-10gb-4`, `gpu-2-vgpu`.
pub fn parse_device_name(name: &str) -> Option<DeviceKind> {
    let rest = name.strip_prefix("gpu-")?;
    let (index, tail) = match rest.split_once('-') {
        Some((i, t)) => (i, Some(t)),
        None => (rest, None),
    };
    let gpu: u32 = index.parse().ok()?;
    match tail {
        None => Some(DeviceKind::Whole { gpu }),
        Some("vgpu") => Some(DeviceKind::Vgpu { gpu }),
        Some(t) => {
            let t = t.strip_prefix("mig-")?;
            let (label, start) = t.rsplit_once('-')?;
            Some(DeviceKind::Mig {
                gpu,
                profile_label: label.to_string(),
                start: start.parse().ok()?,
            })
        }
    }
}

/// The GPU of a published device name (`gpu-<index>…`).
pub fn device_gpu<'a>(device: &str, inventory: &'a Inventory) -> Option<&'a crate::gpu::GpuInfo> {
    let index = match parse_device_name(device)? {
        DeviceKind::Whole { gpu } | DeviceKind::Mig { gpu, .. } | DeviceKind::Vgpu { gpu } => gpu,
    };
    inventory.gpus.iter().find(|g| g.index == index)
}
