//! Which kubelet path owns each GPU: the device plugin (extended resources) or the DRA
//! driver (ResourceSlices). Pure: flags in, a per-GPU decision out.
//!
//! A GPU is never advertised by both paths: the scheduler would hand it out twice, once as
//! `nvidia.com/gpu` and once through a ResourceClaim. The rule:
//!
//! | `--device-plugin` | `--dra` | owner of a GPU |
//! |---|---|---|
//! | on  | off | device plugin (every GPU) |
//! | off | on  | DRA (every GPU) |
//! | on  | on  | DRA if `--dra-gpus` selects it, else device plugin (`--dra-gpus` required) |
//! | off | off | rejected: nothing would be advertised |
//!
//! `--dra-gpus` takes `all`, `none`, GPU indices and ranges (`0,1,4-7`), GPU UUIDs
//! (`GPU-…`, comma-separated), or `model:<text>` (a substring of the NVML product name,
//! e.g. `model:H100`).

use std::collections::BTreeSet;

use crate::gpu::{GpuInfo, Inventory};
use crate::partition::layout::{Advertisement, NodePlan};

/// A bad combination of path flags; names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    #[error("--device-plugin and --dra are both off: nothing would be advertised")]
    NoPath,
    #[error(
        "--device-plugin and --dra are both on: say which GPUs the DRA driver owns with \
         --dra-gpus (all, none, indices like 0,1,4-7, GPU UUIDs, or model:<name>)"
    )]
    SplitMissing,
    #[error("--dra-gpus {value:?}: {reason}")]
    Selector { value: String, reason: String },
}

/// Which GPUs `--dra-gpus` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraGpus {
    All,
    None,
    Indices(BTreeSet<u32>),
    Uuids(BTreeSet<String>),
    /// A substring of the product name.
    Model(String),
}

impl DraGpus {
    /// Parse the flag value.
    pub fn parse(value: &str) -> Result<Self, OwnershipError> {
        let bad = |reason: String| OwnershipError::Selector {
            value: value.to_string(),
            reason,
        };
        let v = value.trim();
        match v {
            "" => return Err(bad("empty".into())),
            "all" => return Ok(Self::All),
            "none" => return Ok(Self::None),
            _ => {}
        }
        if let Some(model) = v.strip_prefix("model:") {
            let model = model.trim();
            if model.is_empty() {
                return Err(bad("model: needs a name, e.g. model:H100".into()));
            }
            return Ok(Self::Model(model.to_string()));
        }
        let items: Vec<&str> = v.split(',').map(str::trim).collect();
        if items.iter().all(|i| i.starts_with("GPU-")) {
            return Ok(Self::Uuids(items.iter().map(|s| s.to_string()).collect()));
        }
        let mut indices = BTreeSet::new();
        for item in items {
            let num = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(format!("{s:?} is not a GPU index, a range or a UUID")))
            };
            match item.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(bad(format!("range {item:?} is backwards")));
                    }
                    indices.extend(a..=b);
                }
                None => {
                    indices.insert(num(item)?);
                }
            }
        }
        Ok(Self::Indices(indices))
    }

    fn selects(&self, gpu: &GpuInfo) -> bool {
        match self {
            Self::All => true,
            Self::None => false,
            Self::Indices(set) => set.contains(&gpu.index),
            Self::Uuids(set) => set.contains(&gpu.uuid),
            Self::Model(m) => gpu.product_name.contains(m.as_str()),
        }
    }
}

/// The path that advertises a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    DevicePlugin,
    Dra,
}

/// The validated path flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub device_plugin: bool,
    pub dra: bool,
    dra_gpus: DraGpus,
}

impl Default for Ownership {
    /// The device plugin owns every GPU (no DRA).
    fn default() -> Self {
        Self {
            device_plugin: true,
            dra: false,
            dra_gpus: DraGpus::None,
        }
    }
}

impl Ownership {
    /// Validate the flags (see the module table).
    pub fn new(
        device_plugin: bool,
        dra: bool,
        dra_gpus: Option<&str>,
    ) -> Result<Self, OwnershipError> {
        let selector = dra_gpus.map(DraGpus::parse).transpose()?;
        let dra_gpus = match (device_plugin, dra) {
            (false, false) => return Err(OwnershipError::NoPath),
            (true, false) => DraGpus::None,
            (false, true) => DraGpus::All,
            (true, true) => selector.ok_or(OwnershipError::SplitMissing)?,
        };
        Ok(Self {
            device_plugin,
            dra,
            dra_gpus,
        })
    }

    pub fn owner(&self, gpu: &GpuInfo) -> Owner {
        if self.dra && self.dra_gpus.selects(gpu) {
            Owner::Dra
        } else {
            Owner::DevicePlugin
        }
    }

    /// The GPUs (and their plans) one path owns.
    pub fn part(
        &self,
        inventory: &Inventory,
        plan: &NodePlan,
        who: Owner,
    ) -> (Inventory, NodePlan) {
        let gpus: Vec<GpuInfo> = inventory
            .gpus
            .iter()
            .filter(|g| self.owner(g) == who)
            .cloned()
            .collect();
        let plan = NodePlan {
            gpus: plan
                .gpus
                .iter()
                .filter(|(uuid, _)| gpus.iter().any(|g| &g.uuid == *uuid))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        (
            Inventory {
                driver: inventory.driver.clone(),
                gpus,
            },
            plan,
        )
    }

    /// UUIDs of the GPUs the DRA driver owns.
    pub fn dra_uuids(&self, inventory: &Inventory) -> BTreeSet<String> {
        inventory
            .gpus
            .iter()
            .filter(|g| self.owner(g) == Owner::Dra)
            .map(|g| g.uuid.clone())
            .collect()
    }
}

/// Drop every device of a GPU the device plugin does not own (and resources left empty).
pub fn device_plugin_part(ad: &Advertisement, dra_uuids: &BTreeSet<String>) -> Advertisement {
    let mut out = ad.clone();
    for r in &mut out.resources {
        r.devices.retain(|d| !dra_uuids.contains(&d.gpu_uuid));
    }
    out.resources.retain(|r| !r.devices.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;
    use crate::partition::{config, layout};

    #[test]
    fn flags_combine_per_the_table() {
        type Case<'a> = (
            bool,
            bool,
            Option<&'a str>,
            Result<&'a [u32], OwnershipError>,
        );
        let cases: &[Case] = &[
            (true, false, None, Ok(&[])),
            (true, false, Some("all"), Ok(&[])),
            (false, true, None, Ok(&[0, 1, 2, 3])),
            (true, true, Some("1,3"), Ok(&[1, 3])),
            (true, true, Some("1-2"), Ok(&[1, 2])),
            (true, true, Some("all"), Ok(&[0, 1, 2, 3])),
            (true, true, Some("none"), Ok(&[])),
            (true, true, Some("model:A100"), Ok(&[0, 1, 2, 3])),
            (true, true, Some("model:H100"), Ok(&[])),
            (true, true, None, Err(OwnershipError::SplitMissing)),
            (false, false, None, Err(OwnershipError::NoPath)),
        ];
        let inv = FakeBackend::from_spec("4xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap();
        for (dp, dra, sel, want) in cases {
            let got = Ownership::new(*dp, *dra, *sel).map(|o| {
                inv.gpus
                    .iter()
                    .filter(|g| o.owner(g) == Owner::Dra)
                    .map(|g| g.index)
                    .collect::<Vec<_>>()
            });
            match want {
                Ok(w) => assert_eq!(got.as_deref(), Ok(*w), "{dp} {dra} {sel:?}"),
                Err(e) => assert_eq!(got.as_ref().unwrap_err(), e, "{dp} {dra} {sel:?}"),
            }
        }
    }

    #[test]
    fn uuids_and_bad_values() {
        let inv = FakeBackend::from_spec("2xL4").unwrap().inventory().unwrap();
        let o = Ownership::new(true, true, Some(&inv.gpus[1].uuid)).unwrap();
        assert_eq!(o.owner(&inv.gpus[0]), Owner::DevicePlugin);
        assert_eq!(o.owner(&inv.gpus[1]), Owner::Dra);
        for bad in ["", "x", "3-1", "1,,2", "model:"] {
            let e = Ownership::new(true, true, Some(bad)).unwrap_err();
            assert!(e.to_string().starts_with("--dra-gpus"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_gpu_is_advertised_by_one_path_only() {
        let backend = FakeBackend::from_spec("4xA100-80GB").unwrap();
        let cfg = config::parse_config(
            "t",
            "version: v1\nsharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 2 } ] } }",
        )
        .unwrap();
        let inv = backend.inventory().unwrap();
        let plan = layout::plan(&inv, &cfg).unwrap();
        let ad = layout::advertise(&inv, &cfg, &plan).unwrap();
        let o = Ownership::new(true, true, Some("0,2")).unwrap();
        let dra = o.dra_uuids(&inv);
        let dp = device_plugin_part(&ad, &dra);
        let dp_gpus: BTreeSet<&str> = dp.resources[0]
            .devices
            .iter()
            .map(|d| d.gpu_uuid.as_str())
            .collect();
        assert_eq!(dp.resources[0].devices.len(), 4, "2 GPUs x 2 replicas");
        let (dra_inv, dra_plan) = o.part(&inv, &plan, Owner::Dra);
        assert_eq!(dra_inv.gpus.len(), 2);
        assert_eq!(dra_plan.gpus.len(), 2);
        for g in &dra_inv.gpus {
            assert!(!dp_gpus.contains(g.uuid.as_str()), "{} in both", g.uuid);
        }
        // Every GPU is owned by exactly one path.
        assert_eq!(dp_gpus.len() + dra_inv.gpus.len(), inv.gpus.len());
    }
}
