//! Which kubelet path owns each GPU: the device plugin (extended resources) or the DRA
//! driver (ResourceSlices). Pure: flags, the node config and who holds what in, a
//! per-GPU decision out.
//!
//! A GPU is never advertised by both paths: the scheduler would hand it out twice, once as
//! `nvidia.com/gpu` and once through a ResourceClaim. The rule:
//!
//! | `--device-plugin` | `--dra` | owner of a GPU |
//! |---|---|---|
//! | on  | off | device plugin (every GPU) |
//! | off | on, auto | DRA (every GPU) |
//! | on  | on, auto | DRA if `--dra-gpus` selects it; without the flag, if the node config's `tessera.dra.gpus` does (none when absent); else device plugin |
//! | off | off | rejected: nothing would be advertised |
//!
//! `--dra` ([`DraMode`]) also says when the DRA path serves the kubelet: `on` always (an
//! empty pool when it owns no GPU), `auto` (the default) only while it owns a GPU, so a
//! node whose config gives DRA nothing registers no DRA plugin and publishes no pool.
//!
//! `--dra-gpus` takes `all`, `none`, GPU indices and ranges (`0,1,4-7`), GPU UUIDs
//! (`GPU-…`, comma-separated), or `model:<text>` (a substring of the NVML product name,
//! e.g. `model:H100`). Given, it overrides the config (the agent logs that it does).
//!
//! A GPU in use on one path is not moved to the other ([`super::handover`] holds each
//! GPU's state): a GPU with a prepared DRA claim stays with the DRA driver, a GPU a pod
//! holds through the device plugin stays with the device plugin, and the move is reported
//! as a [`BlockedMove`] (the agent retries it until the GPU is free). GPUs whose owner
//! does not change are untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::gpu::{GpuInfo, Inventory};
use crate::partition::config::{GpuSelector, NodeConfig};
use crate::partition::layout::{Advertisement, NodePlan};

/// A bad combination of path flags; names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    #[error("--device-plugin and --dra are both off: nothing would be advertised")]
    NoPath,
    #[error("--dra-gpus {value:?}: {reason}")]
    Selector { value: String, reason: String },
}
/// `--dra`: whether the DRA path runs, and when it serves the kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DraMode {
    /// Never: every GPU stays with the device plugin.
    #[value(alias = "false")]
    Off,
    /// Always: registered and publishing, an empty pool when it owns no GPU.
    #[value(alias = "true")]
    On,
    /// While the split (node config or `--dra-gpus`) gives it a GPU, or a claim still
    /// holds one: registers and publishes then, withdraws when it owns none.
    #[default]
    Auto,
}

impl fmt::Display for DraMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DraMode::Off => "off",
            DraMode::On => "on",
            DraMode::Auto => "auto",
        })
    }
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    DevicePlugin,
    Dra,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Owner::DevicePlugin => "the device plugin",
            Owner::Dra => "the DRA driver",
        })
    }
}

/// What decides the split (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--dra=false`: every GPU on the device plugin.
    DevicePluginOnly,
    /// `--device-plugin=false`: every GPU on the DRA driver.
    DraOnly,
    /// `--dra-gpus`.
    Flag,
    /// The node config's `tessera.dra.gpus`.
    Config,
}

/// The validated path flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub device_plugin: bool,
    /// The DRA path runs (`--dra` on or auto).
    pub dra: bool,
    mode: DraMode,
    /// `--dra-gpus`, when given with both paths on.
    flag: Option<DraGpus>,
}

impl Default for Ownership {
    /// The device plugin owns every GPU (no DRA).
    fn default() -> Self {
        Self {
            device_plugin: true,
            dra: false,
            mode: DraMode::Off,
            flag: None,
        }
    }
}

impl Ownership {
    /// Validate the flags (see the module table); `dra` true is `--dra=on`.
    pub fn new(
        device_plugin: bool,
        dra: bool,
        dra_gpus: Option<&str>,
    ) -> Result<Self, OwnershipError> {
        let mode = if dra { DraMode::On } else { DraMode::Off };
        Self::with_mode(device_plugin, mode, dra_gpus)
    }

    /// [`Self::new`] with `--dra` as on, off or auto.
    pub fn with_mode(
        device_plugin: bool,
        mode: DraMode,
        dra_gpus: Option<&str>,
    ) -> Result<Self, OwnershipError> {
        let selector = dra_gpus.map(DraGpus::parse).transpose()?;
        let dra = mode != DraMode::Off;
        if !device_plugin && !dra {
            return Err(OwnershipError::NoPath);
        }
        Ok(Self {
            device_plugin,
            dra,
            mode,
            flag: selector.filter(|_| device_plugin && dra),
        })
    }

    /// `--dra` as given (off when the path cannot run).
    pub fn dra_mode(&self) -> DraMode {
        if self.dra {
            self.mode
        } else {
            DraMode::Off
        }
    }

    /// Whether the DRA path serves the kubelet when it owns the GPUs `dra_gpus` counts
    /// (withdrawing ones included): always with `--dra=on`, only with a GPU with `auto`.
    pub fn dra_serves(&self, dra_gpus: usize) -> bool {
        match self.dra_mode() {
            DraMode::Off => false,
            DraMode::On => true,
            DraMode::Auto => dra_gpus > 0,
        }
    }

    /// What decides the split, given the node config.
    pub fn source(&self) -> Source {
        match (self.device_plugin, self.dra, &self.flag) {
            (_, false, _) => Source::DevicePluginOnly,
            (false, true, _) => Source::DraOnly,
            (true, true, Some(_)) => Source::Flag,
            (true, true, None) => Source::Config,
        }
    }

    /// The path the flags and `config` choose for `gpu`, before in-use pinning.
    pub fn desired(&self, gpu: &GpuInfo, config: &NodeConfig) -> Owner {
        let dra = match self.source() {
            Source::DevicePluginOnly => false,
            Source::DraOnly => true,
            Source::Flag => self.flag.as_ref().is_some_and(|f| f.selects(gpu)),
            Source::Config => config.dra_gpus.as_ref().is_some_and(|s| s.matches(gpu)),
        };
        if dra {
            Owner::Dra
        } else {
            Owner::DevicePlugin
        }
    }

    /// Every GPU on its desired path (nothing in use; the agent's split, with GPUs in
    /// use pinned, comes from [`super::handover`]).
    pub fn assign(&self, inventory: &Inventory, config: &NodeConfig) -> Assignment {
        let owners = inventory
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), self.desired(g, config)))
            .collect();
        Assignment::from_owners(self.device_plugin, self.dra, owners)
    }

    /// A note for the log when the flags override or ignore the config's
    /// `tessera.dra.gpus` (`None`: nothing to say).
    pub fn config_note(&self, config: &NodeConfig) -> Option<String> {
        let set = config.dra_gpus.as_ref()?;
        let what = describe(set);
        match self.source() {
            Source::Config => None,
            Source::Flag => Some(format!(
                "--dra-gpus overrides the config's tessera.dra.gpus ({what})"
            )),
            Source::DevicePluginOnly => Some(format!(
                "the config's tessera.dra.gpus ({what}) is ignored: the DRA path is off (--dra=off)"
            )),
            Source::DraOnly => Some(format!(
                "the config's tessera.dra.gpus ({what}) is ignored: --device-plugin=false gives every GPU to the DRA driver"
            )),
        }
    }
}

fn describe(s: &GpuSelector) -> String {
    match s {
        GpuSelector::All => "all".into(),
        GpuSelector::Index(i) => format!("index {i:?}"),
        GpuSelector::Uuid(u) => format!("uuid {u:?}"),
        GpuSelector::Model(m) => format!("model {m}"),
    }
}

/// Who holds each GPU right now (GPU UUID → what holds it: a claim, a pod's container),
/// per path. Read from the DRA checkpoint and the kubelet's device checkpoint
/// ([`super::usage`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    pub device_plugin: BTreeMap<String, Vec<String>>,
    pub dra: BTreeMap<String, Vec<String>>,
}

/// A GPU that should change paths but is in use where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedMove {
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// Where it stays.
    pub from: Owner,
    /// Where the config wants it.
    pub to: Owner,
    pub holders: Vec<String>,
}

impl fmt::Display for BlockedMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {} ({}) stays with {} instead of moving to {}: in use by {}; it moves once free",
            self.gpu_index,
            self.gpu_uuid,
            self.from,
            self.to,
            self.holders.join(", ")
        )
    }
}

/// The decided owner of every GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub device_plugin: bool,
    pub dra: bool,
    /// GPU UUID → owner; a GPU not listed belongs to the device plugin.
    owners: BTreeMap<String, Owner>,
}

impl Default for Assignment {
    /// The device plugin owns every GPU (no DRA).
    fn default() -> Self {
        Self {
            device_plugin: true,
            dra: false,
            owners: BTreeMap::new(),
        }
    }
}

impl Assignment {
    /// The split `owners` (GPU UUID → path) gives, with the paths that run.
    pub fn from_owners(device_plugin: bool, dra: bool, owners: BTreeMap<String, Owner>) -> Self {
        Self {
            device_plugin,
            dra,
            owners,
        }
    }

    pub fn owner(&self, gpu: &GpuInfo) -> Owner {
        match self.owners.get(&gpu.uuid) {
            Some(Owner::Dra) if self.dra => Owner::Dra,
            _ => Owner::DevicePlugin,
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

    /// This split with `uuids` on the DRA driver too (GPUs leaving it that no path
    /// advertises until the move is confirmed: no device-plugin MIG layout, not in the
    /// device plugin's lists).
    pub fn with_dra(&self, uuids: &BTreeSet<String>) -> Assignment {
        let mut out = self.clone();
        for uuid in uuids {
            out.owners.insert(uuid.clone(), Owner::Dra);
        }
        out
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

    fn dra_indices(o: &Ownership, inv: &Inventory, cfg: &NodeConfig) -> Vec<u32> {
        let a = o.assign(inv, cfg);
        inv.gpus
            .iter()
            .filter(|g| a.owner(g) == Owner::Dra)
            .map(|g| g.index)
            .collect()
    }

    #[test]
    fn flags_and_config_combine_per_the_table() {
        type Case<'a> = (
            bool,
            bool,
            Option<&'a str>,
            &'a str,
            Result<&'a [u32], OwnershipError>,
        );
        const NONE: &str = "version: v1";
        const CFG_1_3: &str = "tessera: { dra: { gpus: { index: [1, 3] } } }";
        let cases: &[Case] = &[
            (true, false, None, NONE, Ok(&[])),
            (true, false, Some("all"), NONE, Ok(&[])),
            (true, false, None, CFG_1_3, Ok(&[])),
            (false, true, None, NONE, Ok(&[0, 1, 2, 3])),
            (false, true, None, CFG_1_3, Ok(&[0, 1, 2, 3])),
            (true, true, Some("1,3"), NONE, Ok(&[1, 3])),
            (true, true, Some("1-2"), NONE, Ok(&[1, 2])),
            (true, true, Some("all"), NONE, Ok(&[0, 1, 2, 3])),
            (true, true, Some("none"), NONE, Ok(&[])),
            (true, true, Some("model:A100"), NONE, Ok(&[0, 1, 2, 3])),
            (true, true, Some("model:H100"), NONE, Ok(&[])),
            // No flag: the config decides (none without a dra section).
            (true, true, None, NONE, Ok(&[])),
            (true, true, None, CFG_1_3, Ok(&[1, 3])),
            (
                true,
                true,
                None,
                "tessera: { dra: { gpus: all } }",
                Ok(&[0, 1, 2, 3]),
            ),
            (
                true,
                true,
                None,
                "tessera: { dra: { gpus: none } }",
                Ok(&[]),
            ),
            (
                true,
                true,
                None,
                "tessera: { dra: { gpus: { model: A100-80GB } } }",
                Ok(&[0, 1, 2, 3]),
            ),
            // The flag overrides the config.
            (true, true, Some("0"), CFG_1_3, Ok(&[0])),
            (true, true, Some("none"), CFG_1_3, Ok(&[])),
            (false, false, None, NONE, Err(OwnershipError::NoPath)),
        ];
        let inv = FakeBackend::from_spec("4xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap();
        for (dp, dra, sel, yaml, want) in cases {
            let cfg = config::parse_config("t", yaml).unwrap();
            let got = Ownership::new(*dp, *dra, *sel).map(|o| dra_indices(&o, &inv, &cfg));
            match want {
                Ok(w) => assert_eq!(got.as_deref(), Ok(*w), "{dp} {dra} {sel:?} {yaml}"),
                Err(e) => assert_eq!(got.as_ref().unwrap_err(), e, "{dp} {dra} {sel:?}"),
            }
        }
    }

    #[test]
    fn the_log_says_when_the_flags_override_the_config() {
        let cfg = config::parse_config("t", "tessera: { dra: { gpus: { index: [1] } } }").unwrap();
        let plain = config::parse_config("t", "version: v1").unwrap();
        let note = |dp, dra, sel: Option<&str>, c: &NodeConfig| {
            Ownership::new(dp, dra, sel).unwrap().config_note(c)
        };
        assert_eq!(note(true, true, None, &cfg), None);
        assert!(note(true, true, Some("0"), &cfg)
            .unwrap()
            .contains("--dra-gpus overrides"));
        assert!(note(true, false, None, &cfg).unwrap().contains("--dra=off"));
        assert!(note(false, true, None, &cfg)
            .unwrap()
            .contains("--device-plugin=false"));
        assert_eq!(note(true, true, Some("0"), &plain), None);
    }

    #[test]
    fn dra_mode_decides_when_the_driver_serves() {
        use clap::ValueEnum;
        // (flag value, device plugin on, GPUs the split gives DRA, serves?)
        let cases: &[(&str, bool, usize, Result<bool, OwnershipError>)] = &[
            ("auto", true, 0, Ok(false)),
            ("auto", true, 2, Ok(true)),
            ("auto", false, 0, Ok(false)),
            ("on", true, 0, Ok(true)),
            ("true", true, 0, Ok(true)),
            ("on", true, 3, Ok(true)),
            ("off", true, 3, Ok(false)),
            ("false", true, 3, Ok(false)),
            ("off", false, 0, Err(OwnershipError::NoPath)),
        ];
        for (value, dp, gpus, want) in cases {
            let mode = DraMode::from_str(value, false).unwrap();
            let got = Ownership::with_mode(*dp, mode, None).map(|o| o.dra_serves(*gpus));
            assert_eq!(&got, want, "--dra={value} dp={dp} gpus={gpus}");
        }
        assert!(DraMode::from_str("maybe", false).is_err());
        assert_eq!(DraMode::default(), DraMode::Auto);
        // `new` keeps its meaning: true is on, false is off.
        assert_eq!(
            Ownership::new(true, true, None).unwrap().dra_mode(),
            DraMode::On
        );
        assert_eq!(
            Ownership::new(true, false, None).unwrap().dra_mode(),
            DraMode::Off
        );
        // auto splits like on.
        let inv = FakeBackend::from_spec("2xL4").unwrap().inventory().unwrap();
        let cfg = config::parse_config("t", "tessera: { dra: { gpus: { index: [1] } } }").unwrap();
        let auto = Ownership::with_mode(true, DraMode::Auto, None).unwrap();
        assert_eq!(dra_indices(&auto, &inv, &cfg), vec![1]);
        let a = auto.assign(&inv, &cfg);
        let both = a.with_dra(&[inv.gpus[0].uuid.clone()].into_iter().collect());
        assert_eq!(both.dra_uuids(&inv).len(), 2);
        assert_eq!(
            a.dra_uuids(&inv).len(),
            1,
            "with_dra leaves the split alone"
        );
    }

    #[test]
    fn uuids_and_bad_values() {
        let inv = FakeBackend::from_spec("2xL4").unwrap().inventory().unwrap();
        let cfg = NodeConfig::builtin_default();
        let o = Ownership::new(true, true, Some(&inv.gpus[1].uuid)).unwrap();
        let a = o.assign(&inv, &cfg);
        assert_eq!(a.owner(&inv.gpus[0]), Owner::DevicePlugin);
        assert_eq!(a.owner(&inv.gpus[1]), Owner::Dra);
        for bad in ["", "x", "3-1", "1,,2", "model:"] {
            let e = Ownership::new(true, true, Some(bad)).unwrap_err();
            assert!(e.to_string().starts_with("--dra-gpus"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_blocked_move_names_the_gpu_and_its_holders() {
        let b = BlockedMove {
            gpu_uuid: "GPU-2".into(),
            gpu_index: 2,
            from: Owner::Dra,
            to: Owner::DevicePlugin,
            holders: vec!["claim ml/c2".into(), "claim ml/c3".into()],
        };
        assert_eq!(
            b.to_string(),
            "GPU 2 (GPU-2) stays with the DRA driver instead of moving to the device plugin: \
             in use by claim ml/c2, claim ml/c3; it moves once free"
        );
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
        let o = Ownership::new(true, true, Some("0,2"))
            .unwrap()
            .assign(&inv, &cfg);
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
