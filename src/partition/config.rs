//! The node layout config: one ConfigMap, several named configs, one picked per node.
//!
//! Each named config is an NVIDIA device-plugin config file (`version: v1`, `flags`,
//! `resources`, `sharing.timeSlicing`), accepted unchanged, optionally extended with a
//! `tessera:` section of per-GPU rules. [`parse_config`] turns the YAML into a validated
//! [`NodeConfig`]; every error names the config and the field, e.g.
//! `config "mixed": tessera.gpus[1].vgpu.slices[0].cores: 130 is not a percentage (1-100)`.
//!
//! ```yaml
//! version: v1
//! flags: { migStrategy: mixed }
//! sharing:
//!   timeSlicing:
//!     resources: [{ name: nvidia.com/gpu, replicas: 4 }]
//! tessera:
//!   gpus:
//!     - match: { index: [0] }
//!       mode: mig
//!       mig: { layout: all-1g.10gb }
//!     - match: { model: H100-80GB }
//!       mode: vgpu
//!       vgpu: { count: 4, memory: 20g, cores: 25 }
//!     - match: { model: A100 }
//!       mode: vgpu
//!       vgpu: { split: 10 }    # free-form (HAMi's way): 10 nvidia.com/gpu slots per GPU
//!   dra:
//!     gpus: { index: [0] }     # all | none | { index } | { uuid } | { model }
//! ```
//!
//! `tessera.dra.gpus` says which GPUs the DRA driver (`gpu.tessera.io`) owns when the
//! agent runs both kubelet paths; the device plugin keeps the others. It is independent of
//! the `gpus` rules, which still say how each GPU is cut (a DRA GPU with mode `mig` is
//! published as partitionable, with mode `vgpu` as consumable capacity). The agent's
//! `--dra-gpus` flag, when given, overrides it (see [`crate::agent::ownership`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use super::catalog;
use crate::gpu::health::{HealthPolicy, DEFAULT_IGNORED_XIDS};

/// Name of the config used when the node has no `tessera.io/config` label.
pub const DEFAULT_CONFIG_NAME: &str = "default";
/// Node label that selects a named config.
pub const CONFIG_LABEL: &str = "tessera.io/config";
/// Largest config file (one ConfigMap key) read, in bytes: a larger one is rejected unread.
pub const MAX_CONFIG_BYTES: u64 = crate::yaml::MAX_BYTES;

/// A config error: the config's name, the field path, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config {config:?}: {field}: {reason}")]
pub struct ConfigError {
    pub config: String,
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    fn new(config: &str, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            config: config.to_string(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------
// Raw (serde) form. NVIDIA's fields that Tessera does not use are accepted and ignored.
// ---------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    version: Option<String>,
    #[serde(default)]
    flags: RawFlags,
    #[serde(default)]
    resources: RawResources,
    #[serde(default)]
    sharing: RawSharing,
    #[serde(default)]
    imex: Option<serde_json::Value>,
    #[serde(default)]
    tessera: RawTessera,
}

/// NVIDIA's `flags`. Only `migStrategy` matters to Tessera; the rest is accepted so that
/// NVIDIA config files load unchanged.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct RawFlags {
    mig_strategy: Option<String>,
    fail_on_init_error: Option<bool>,
    restart_on_device_unhealthy: Option<bool>,
    nvidia_driver_root: Option<String>,
    nvidia_dev_root: Option<String>,
    mps_root: Option<String>,
    #[serde(rename = "gdsEnabled")]
    gds_enabled: Option<bool>,
    #[serde(rename = "mofedEnabled")]
    mofed_enabled: Option<bool>,
    #[serde(rename = "useNodeFeatureAPI")]
    use_node_feature_api: Option<bool>,
    device_discovery_strategy: Option<String>,
    plugin: Option<serde_json::Value>,
    gfd: Option<serde_json::Value>,
}

/// NVIDIA's `resources`: rename whole GPUs (matched by product name) and MIG devices
/// (matched by profile) to other resource names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    #[serde(default)]
    gpus: Vec<RawPattern>,
    #[serde(default)]
    mig: Vec<RawPattern>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    pattern: String,
    name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSharing {
    time_slicing: Option<RawReplicated>,
    mps: Option<RawReplicated>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawReplicated {
    #[serde(default)]
    strategy: Option<String>,
    #[serde(default)]
    rename_by_default: bool,
    #[serde(default)]
    fail_requests_greater_than_one: bool,
    #[serde(default)]
    resources: Vec<RawReplicaResource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplicaResource {
    name: String,
    #[serde(default)]
    rename: Option<String>,
    #[serde(default)]
    devices: Option<serde_json::Value>,
    replicas: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTessera {
    resource_prefix: Option<String>,
    #[serde(default)]
    gpus: Vec<RawGpuRule>,
    #[serde(default)]
    health: RawHealth,
    #[serde(default)]
    allocation: RawAllocation,
    #[serde(default)]
    dra: Option<RawDra>,
}

/// `tessera.dra`: the GPUs the DRA driver owns.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDra {
    gpus: Option<RawSelector>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpuRule {
    #[serde(rename = "match")]
    selector: RawSelector,
    mode: String,
    mig: Option<RawMig>,
    timeslice: Option<RawTimeslice>,
    vgpu: Option<RawVgpu>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSelector {
    All(String),
    Fields(RawSelectorFields),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelectorFields {
    index: Option<Vec<u32>>,
    uuid: Option<Vec<String>>,
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMig {
    layout: Option<String>,
    profiles: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeslice {
    replicas: i64,
    #[serde(default)]
    rename: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVgpu {
    /// Resource name for the slices (default `<prefix>/vgpu`).
    resource: Option<String>,
    /// Uniform slices: `count` slices of `memory` and `cores` each.
    count: Option<i64>,
    memory: Option<serde_json::Value>,
    cores: Option<i64>,
    /// Or an explicit list of slices.
    slices: Option<Vec<RawSlice>>,
    /// Or free-form: `split` vGPU slots per GPU, sized per pod by the scheduler extender.
    split: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlice {
    memory: serde_json::Value,
    cores: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHealth {
    ignored_xids: Option<Vec<u64>>,
    /// Added to the default ignored set instead of replacing it.
    additional_ignored_xids: Option<Vec<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAllocation {
    replica_strategy: Option<String>,
    distinct_gpus: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// Validated form.
// ---------------------------------------------------------------------------------------

/// NVIDIA's `flags.migStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    /// MIG devices are not advertised; GPUs are advertised whole.
    #[default]
    None,
    /// Every GPU has MIG on with one profile; advertised as `<prefix>/gpu`.
    Single,
    /// Each MIG profile is its own resource `<prefix>/mig-<profile>`.
    Mixed,
}

/// Which GPUs a time-slicing entry replicates (NVIDIA's `devices:` union).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaDevices {
    All,
    /// The first `n` GPUs by index.
    Count(u32),
    /// GPU indices, MIG indices (`gpu:mig`), or GPU/MIG UUIDs.
    List(Vec<String>),
}

/// One `sharing.timeSlicing.resources[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRule {
    /// Full resource name, e.g. `nvidia.com/gpu` or `nvidia.com/mig-1g.10gb`.
    pub name: String,
    /// Advertise the replicas under this name instead.
    pub rename: Option<String>,
    pub devices: ReplicaDevices,
    pub replicas: u32,
}

/// `sharing.timeSlicing` (and `sharing.mps`, which Tessera advertises the same way).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TimeSlicing {
    pub rename_by_default: bool,
    pub fail_requests_greater_than_one: bool,
    pub resources: Vec<ReplicaRule>,
}

/// Which GPUs a Tessera rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    All,
    Index(BTreeSet<u32>),
    Uuid(BTreeSet<String>),
    /// A model short name (`A100-80GB`) or a substring of the NVML product name.
    Model(String),
}

impl GpuSelector {
    /// Whether the selector picks `gpu`. A model matches the catalog's short name
    /// (`A100-80GB`, case-insensitive) or a substring of the NVML product name.
    pub fn matches(&self, gpu: &crate::gpu::GpuInfo) -> bool {
        match self {
            Self::All => true,
            Self::Index(set) => set.contains(&gpu.index),
            Self::Uuid(set) => set.contains(&gpu.uuid),
            Self::Model(model) => {
                let by_catalog = catalog::lookup(&gpu.product_name, gpu.memory_mib)
                    .is_some_and(|m| m.model.eq_ignore_ascii_case(model));
                by_catalog
                    || gpu
                        .product_name
                        .to_ascii_lowercase()
                        .contains(&model.to_ascii_lowercase())
            }
        }
    }
}

/// How a MIG layout is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigLayout {
    /// `all-1g.10gb`, `all-balanced`, `balanced`.
    Named(String),
    /// An explicit list of profiles (placed by the catalog).
    Profiles(Vec<String>),
}

/// One fixed vGPU slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VgpuSlice {
    pub memory_mib: u64,
    /// Percent of the GPU's SMs.
    pub cores: u32,
}

/// What a GPU is cut into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuMode {
    Whole,
    Mig(MigLayout),
    TimeSlice {
        replicas: u32,
        rename: Option<String>,
    },
    Vgpu {
        resource: Option<String>,
        slices: Vec<VgpuSlice>,
    },
    /// Free-form vGPUs (HAMi's way): the GPU takes up to `split` vGPUs at once, each
    /// sized per pod (`nvidia.com/gpumem`, `nvidia.com/gpucores`) by the scheduler
    /// extender. Advertised as `split` slots of `resource` (default `<prefix>/gpu`).
    VgpuSplit {
        resource: Option<String>,
        split: u32,
    },
}

/// The largest `vgpu.split`: vGPUs one GPU may hold at once.
pub const MAX_SPLIT: u32 = 64;

/// A per-GPU rule; the first rule whose selector matches a GPU decides its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRule {
    pub selector: GpuSelector,
    pub mode: GpuMode,
}

/// How GetPreferredAllocation spreads replicas and slices over physical GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaStrategy {
    /// Fill the GPU that already has the fewest free replicas (bin packing).
    #[default]
    Packed,
    /// Spread over the GPUs with the most free replicas.
    Distributed,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllocationPolicy {
    pub replica_strategy: ReplicaStrategy,
    /// A multi-replica request never gets two replicas of one physical GPU.
    pub distinct_gpus: bool,
}

/// A `resources.gpus[]` / `resources.mig[]` entry: `*` globs over the product name (GPUs)
/// or the profile (MIG), and the full resource name matching devices get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rename {
    pub pattern: String,
    pub resource: String,
}

/// `*`-glob match (the only wildcard NVIDIA's patterns use), case-sensitive.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// One validated named config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub name: String,
    pub mig_strategy: MigStrategy,
    pub resource_prefix: String,
    /// NVIDIA `resources.gpus`: the first matching pattern names a whole GPU's resource.
    pub gpu_renames: Vec<Rename>,
    /// NVIDIA `resources.mig`: the first matching pattern names a MIG profile's resource.
    pub mig_renames: Vec<Rename>,
    pub time_slicing: TimeSlicing,
    pub gpu_rules: Vec<GpuRule>,
    pub health: HealthPolicy,
    pub allocation: AllocationPolicy,
    /// `tessera.dra.gpus`: the GPUs the DRA driver owns when both kubelet paths run
    /// (`None`: none, or the section is absent).
    pub dra_gpus: Option<GpuSelector>,
}

impl NodeConfig {
    /// The config used when none is given: every GPU whole, `nvidia.com` names.
    pub fn builtin_default() -> Self {
        Self {
            name: DEFAULT_CONFIG_NAME.to_string(),
            mig_strategy: MigStrategy::None,
            resource_prefix: "nvidia.com".to_string(),
            gpu_renames: Vec::new(),
            mig_renames: Vec::new(),
            time_slicing: TimeSlicing::default(),
            gpu_rules: Vec::new(),
            health: HealthPolicy::default(),
            allocation: AllocationPolicy::default(),
            dra_gpus: None,
        }
    }

    /// `<prefix>/<suffix>`.
    pub fn resource(&self, suffix: &str) -> String {
        format!("{}/{}", self.resource_prefix, suffix)
    }

    /// The resource a whole GPU with this product name is advertised as.
    pub fn gpu_resource(&self, product_name: &str) -> String {
        self.gpu_renames
            .iter()
            .find(|r| glob_match(&r.pattern, product_name))
            .map(|r| r.resource.clone())
            .unwrap_or_else(|| self.resource("gpu"))
    }

    /// The resource a MIG device of this profile is advertised as (mixed strategy).
    pub fn mig_resource(&self, profile: &str) -> String {
        self.mig_renames
            .iter()
            .find(|r| glob_match(&r.pattern, profile))
            .map(|r| r.resource.clone())
            .unwrap_or_else(|| self.resource(&format!("mig-{profile}")))
    }
}

/// All named configs of the ConfigMap, each validated on its own: a bad one is kept
/// with its error and does not stop the others from loading.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigSet {
    pub configs: BTreeMap<String, NodeConfig>,
    /// The named configs that were rejected, with why.
    pub rejected: BTreeMap<String, ConfigError>,
}

impl ConfigSet {
    /// Pick the config named by the node label, or `default`. A label naming a config that
    /// does not exist, or one that was rejected, is an error (the caller keeps the last
    /// good config); other configs' errors do not matter here.
    pub fn select(&self, label: Option<&str>) -> Result<&NodeConfig> {
        let name = label.unwrap_or(DEFAULT_CONFIG_NAME);
        if let Some(e) = self.rejected.get(name) {
            return Err(e.clone());
        }
        self.configs.get(name).ok_or_else(|| {
            let known: BTreeSet<&str> = self
                .configs
                .keys()
                .chain(self.rejected.keys())
                .map(String::as_str)
                .collect();
            let known: Vec<&str> = known.into_iter().collect();
            ConfigError::new(
                name,
                CONFIG_LABEL,
                format!(
                    "no config with this name; known configs: {}",
                    known.join(", ")
                ),
            )
        })
    }
}

/// Load a config source: a directory (a mounted ConfigMap: one file per named config,
/// the file name without `.yaml`/`.yml` is the config name; dotfiles are skipped), or a
/// single file, which is the `default` config. Each config is read (at most
/// [`MAX_CONFIG_BYTES`]) and validated on its own; one that fails is in
/// [`ConfigSet::rejected`], with the file named. Only a directory that cannot be listed
/// or holds no config is an error for the whole source.
///
/// This reads files and parses: call it off the async runtime.
pub fn load(path: &Path) -> Result<ConfigSet> {
    let source = path.display().to_string();
    let mut set = ConfigSet::default();
    let mut load_one = |name: String, file: &Path| {
        let loaded = crate::yaml::read_bounded(file, MAX_CONFIG_BYTES)
            .map_err(|e| {
                ConfigError::new(
                    &name,
                    "(file)",
                    format!("cannot read {}: {e}", file.display()),
                )
            })
            .and_then(|text| parse_config(&name, &text))
            .map_err(|mut e| {
                if e.field != "(file)" {
                    e.reason = format!("{} (in {})", e.reason, file.display());
                }
                e
            });
        match loaded {
            Ok(config) => {
                set.configs.insert(name, config);
            }
            Err(e) => {
                set.rejected.insert(name, e);
            }
        }
    };
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| ConfigError::new(&source, "(directory)", e.to_string()))?
            .filter_map(|e| e.ok())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let file_name = entry.file_name().to_string_lossy().to_string();
            if file_name.starts_with('.') || !entry.path().is_file() {
                continue;
            }
            let name = file_name
                .trim_end_matches(".yaml")
                .trim_end_matches(".yml")
                .to_string();
            load_one(name, &entry.path());
        }
        if set.configs.is_empty() && set.rejected.is_empty() {
            return Err(ConfigError::new(
                &source,
                "(directory)",
                "holds no config files",
            ));
        }
    } else {
        load_one(DEFAULT_CONFIG_NAME.to_string(), path);
    }
    Ok(set)
}

/// Parse and validate one named config (at most [`MAX_CONFIG_BYTES`]; nesting, node and
/// alias budgets in [`crate::yaml`]). Errors name the field, line and column, never the
/// text of the input.
pub fn parse_config(name: &str, yaml: &str) -> Result<NodeConfig> {
    let raw: RawConfig = crate::yaml::from_str_limited(yaml, MAX_CONFIG_BYTES).map_err(|e| {
        let field = if e.path == "." {
            "(document)".to_string()
        } else {
            e.path
        };
        ConfigError::new(name, field, e.reason)
    })?;
    validate(name, raw)
}

fn validate(name: &str, raw: RawConfig) -> Result<NodeConfig> {
    let err = |field: String, reason: String| ConfigError::new(name, field, reason);
    if let Some(v) = &raw.version {
        if v != "v1" {
            return Err(err(
                "version".into(),
                format!("{v:?} is not supported (use v1)"),
            ));
        }
    }
    let mig_strategy = match raw.flags.mig_strategy.as_deref() {
        None | Some("none") => MigStrategy::None,
        Some("single") => MigStrategy::Single,
        Some("mixed") => MigStrategy::Mixed,
        Some(other) => {
            return Err(err(
                "flags.migStrategy".into(),
                format!("{other:?} is not one of none, single, mixed"),
            ))
        }
    };
    let resource_prefix = raw
        .tessera
        .resource_prefix
        .unwrap_or_else(|| "nvidia.com".to_string());
    if !is_dns_subdomain(&resource_prefix) {
        return Err(err(
            "tessera.resourcePrefix".into(),
            format!("{resource_prefix:?} is not a DNS subdomain"),
        ));
    }

    let renames = |list: Vec<RawPattern>, field: &str| -> Result<Vec<Rename>> {
        let mut out = Vec::new();
        for (i, p) in list.into_iter().enumerate() {
            let f = format!("resources.{field}[{i}]");
            if p.pattern.is_empty() {
                return Err(err(format!("{f}.pattern"), "must not be empty".into()));
            }
            // NVIDIA accepts a bare name and puts it under the prefix.
            let resource = if p.name.contains('/') {
                p.name.clone()
            } else {
                format!("{resource_prefix}/{}", p.name)
            };
            if !is_resource_name(&resource) {
                return Err(err(
                    format!("{f}.name"),
                    format!("{:?} is not a valid extended resource name", p.name),
                ));
            }
            out.push(Rename {
                pattern: p.pattern,
                resource,
            });
        }
        Ok(out)
    };
    let gpu_renames = renames(raw.resources.gpus, "gpus")?;
    let mig_renames = renames(raw.resources.mig, "mig")?;
    let renamed: BTreeSet<String> = gpu_renames
        .iter()
        .chain(&mig_renames)
        .map(|r| r.resource.clone())
        .collect();

    // NVIDIA treats MPS like time-slicing for advertising; Tessera advertises both as
    // replicas (MPS daemons are not managed by Tessera).
    let (sharing_field, replicated) = match (raw.sharing.time_slicing, raw.sharing.mps) {
        (Some(_), Some(_)) => {
            return Err(err(
                "sharing".into(),
                "timeSlicing and mps cannot both be set".into(),
            ))
        }
        (Some(ts), None) => ("sharing.timeSlicing", Some(ts)),
        (None, Some(mps)) => ("sharing.mps", Some(mps)),
        (None, None) => ("sharing.timeSlicing", None),
    };
    let time_slicing = match replicated {
        None => TimeSlicing::default(),
        Some(r) => validate_replicated(name, sharing_field, r, &resource_prefix, &renamed)?,
    };

    let mut gpu_rules = Vec::with_capacity(raw.tessera.gpus.len());
    for (i, rule) in raw.tessera.gpus.into_iter().enumerate() {
        gpu_rules.push(validate_rule(name, &format!("tessera.gpus[{i}]"), rule)?);
    }

    let mut health = HealthPolicy::default();
    if let Some(list) = raw.tessera.health.ignored_xids {
        health.ignored_xids = list.into_iter().collect();
    }
    if let Some(extra) = raw.tessera.health.additional_ignored_xids {
        health.ignored_xids.extend(extra);
    }
    debug_assert!(DEFAULT_IGNORED_XIDS.len() == 6);

    let replica_strategy = match raw.tessera.allocation.replica_strategy.as_deref() {
        None | Some("packed") => ReplicaStrategy::Packed,
        Some("distributed") => ReplicaStrategy::Distributed,
        Some(other) => {
            return Err(err(
                "tessera.allocation.replicaStrategy".into(),
                format!("{other:?} is not one of packed, distributed"),
            ))
        }
    };
    let dra_gpus = match raw.tessera.dra.and_then(|d| d.gpus) {
        None => None,
        Some(RawSelector::All(s)) if s == "none" => None,
        Some(sel) => Some(validate_selector(
            name,
            "tessera.dra.gpus",
            sel,
            "all, none",
        )?),
    };
    let _ = (raw.imex, raw.flags.plugin, raw.flags.gfd);
    Ok(NodeConfig {
        name: name.to_string(),
        mig_strategy,
        resource_prefix,
        gpu_renames,
        mig_renames,
        time_slicing,
        gpu_rules,
        health,
        allocation: AllocationPolicy {
            replica_strategy,
            distinct_gpus: raw.tessera.allocation.distinct_gpus.unwrap_or(false),
        },
        dra_gpus,
    })
}

fn validate_replicated(
    name: &str,
    field: &str,
    raw: RawReplicated,
    prefix: &str,
    renamed: &BTreeSet<String>,
) -> Result<TimeSlicing> {
    let err = |f: String, reason: String| ConfigError::new(name, f, reason);
    if let Some(s) = raw.strategy.as_deref().filter(|s| !s.is_empty()) {
        return Err(err(
            format!("{field}.strategy"),
            format!("unknown time-slicing strategy {s:?}"),
        ));
    }
    if raw.resources.is_empty() {
        return Err(err(
            format!("{field}.resources"),
            "no resources specified".into(),
        ));
    }
    let mut resources = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, r) in raw.resources.into_iter().enumerate() {
        let f = format!("{field}.resources[{i}]");
        let known = renamed.contains(&r.name);
        if !known && !r.name.starts_with(&format!("{prefix}/")) {
            return Err(err(
                format!("{f}.name"),
                format!(
                    "{:?} must start with the resource prefix {prefix:?}",
                    r.name
                ),
            ));
        }
        let suffix = r.name.rsplit('/').next().unwrap_or_default();
        if !known && suffix != "gpu" && !suffix.starts_with("mig-") {
            return Err(err(
                format!("{f}.name"),
                format!(
                    "{:?} is neither {prefix}/gpu nor a {prefix}/mig-<profile> resource",
                    r.name
                ),
            ));
        }
        if !seen.insert(r.name.clone()) {
            return Err(err(
                format!("{f}.name"),
                format!("{:?} is listed twice", r.name),
            ));
        }
        if r.replicas <= 0 || r.replicas > 1024 {
            return Err(err(
                format!("{f}.replicas"),
                format!("{} is not in 1..=1024", r.replicas),
            ));
        }
        let devices = parse_replica_devices(r.devices.as_ref())
            .map_err(|reason| err(format!("{f}.devices"), reason))?;
        if let Some(rename) = &r.rename {
            if !is_resource_name(rename) {
                return Err(err(
                    format!("{f}.rename"),
                    format!("{rename:?} is not a valid extended resource name"),
                ));
            }
        }
        resources.push(ReplicaRule {
            name: r.name,
            rename: r.rename,
            devices,
            replicas: r.replicas as u32,
        });
    }
    Ok(TimeSlicing {
        rename_by_default: raw.rename_by_default,
        fail_requests_greater_than_one: raw.fail_requests_greater_than_one,
        resources,
    })
}

fn parse_replica_devices(v: Option<&serde_json::Value>) -> Result<ReplicaDevices, String> {
    use serde_json::Value;
    match v {
        None => Ok(ReplicaDevices::All),
        Some(Value::String(s)) if s == "all" => Ok(ReplicaDevices::All),
        Some(Value::String(s)) => Err(format!("{s:?}: the only valid string is \"all\"")),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c) if c > 0 && c <= u32::MAX as u64 => Ok(ReplicaDevices::Count(c as u32)),
            _ => Err(format!("{n}: a count of devices must be > 0")),
        },
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let s = match item {
                    Value::Number(n) if n.as_u64().is_some() => n.to_string(),
                    Value::String(s) if is_device_ref(s) => s.clone(),
                    other => {
                        return Err(format!(
                        "[{i}] {other:?} is not a GPU index, MIG index (gpu:mig) or GPU/MIG UUID"
                    ))
                    }
                };
                out.push(s);
            }
            Ok(ReplicaDevices::List(out))
        }
        Some(other) => Err(format!("{other:?} is not \"all\", a count, or a list")),
    }
}

fn is_device_ref(s: &str) -> bool {
    let is_num = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit());
    is_num(s)
        || s.split_once(':')
            .is_some_and(|(a, b)| is_num(a) && is_num(b))
        || s.starts_with("GPU-")
        || s.starts_with("MIG-")
}

/// A `match:`-style selector: `all` (or `*`), or exactly one of `index`, `uuid`, `model`.
/// `words` lists the accepted strings for the error message.
fn validate_selector(
    name: &str,
    field: &str,
    raw: RawSelector,
    words: &str,
) -> Result<GpuSelector> {
    let err = |reason: String| ConfigError::new(name, field, reason);
    match raw {
        RawSelector::All(s) if s == "all" || s == "*" => Ok(GpuSelector::All),
        RawSelector::All(s) => Err(err(format!(
            "{s:?}: use {words}, or one of index, uuid, model"
        ))),
        RawSelector::Fields(f) => match (f.index, f.uuid, f.model) {
            (Some(i), None, None) if !i.is_empty() => {
                Ok(GpuSelector::Index(i.into_iter().collect()))
            }
            (None, Some(u), None) if !u.is_empty() => {
                Ok(GpuSelector::Uuid(u.into_iter().collect()))
            }
            (None, None, Some(m)) if !m.is_empty() => Ok(GpuSelector::Model(m)),
            _ => Err(err(
                "set exactly one of index, uuid, model (non-empty)".into()
            )),
        },
    }
}

fn validate_rule(name: &str, field: &str, rule: RawGpuRule) -> Result<GpuRule> {
    let err = |f: &str, reason: String| ConfigError::new(name, format!("{field}.{f}"), reason);
    let selector = validate_selector(name, &format!("{field}.match"), rule.selector, "\"all\"")?;
    let unused = |present: bool, key: &str, mode: &str| -> Result<()> {
        if present {
            Err(err(
                key,
                format!("is only valid with mode {key}, not {mode}"),
            ))
        } else {
            Ok(())
        }
    };
    let mode = match rule.mode.as_str() {
        "whole" => {
            unused(rule.mig.is_some(), "mig", "whole")?;
            unused(rule.timeslice.is_some(), "timeslice", "whole")?;
            unused(rule.vgpu.is_some(), "vgpu", "whole")?;
            GpuMode::Whole
        }
        "mig" => {
            unused(rule.timeslice.is_some(), "timeslice", "mig")?;
            unused(rule.vgpu.is_some(), "vgpu", "mig")?;
            let mig = rule
                .mig
                .ok_or_else(|| err("mig", "mode mig needs mig.layout or mig.profiles".into()))?;
            match (mig.layout, mig.profiles) {
                (Some(l), None) if !l.is_empty() => GpuMode::Mig(MigLayout::Named(l)),
                (None, Some(p)) if !p.is_empty() => GpuMode::Mig(MigLayout::Profiles(p)),
                _ => {
                    return Err(err(
                        "mig",
                        "set exactly one of layout, profiles (non-empty)".into(),
                    ))
                }
            }
        }
        "timeslice" => {
            unused(rule.mig.is_some(), "mig", "timeslice")?;
            unused(rule.vgpu.is_some(), "vgpu", "timeslice")?;
            let ts = rule.timeslice.ok_or_else(|| {
                err(
                    "timeslice",
                    "mode timeslice needs timeslice.replicas".into(),
                )
            })?;
            if ts.replicas <= 0 || ts.replicas > 1024 {
                return Err(err(
                    "timeslice.replicas",
                    format!("{} is not in 1..=1024", ts.replicas),
                ));
            }
            if let Some(r) = &ts.rename {
                if !is_resource_name(r) {
                    return Err(err(
                        "timeslice.rename",
                        format!("{r:?} is not a valid extended resource name"),
                    ));
                }
            }
            GpuMode::TimeSlice {
                replicas: ts.replicas as u32,
                rename: ts.rename,
            }
        }
        "vgpu" => {
            unused(rule.mig.is_some(), "mig", "vgpu")?;
            unused(rule.timeslice.is_some(), "timeslice", "vgpu")?;
            let v = rule.vgpu.ok_or_else(|| {
                err(
                    "vgpu",
                    "mode vgpu needs vgpu.count+memory+cores, vgpu.slices or vgpu.split".into(),
                )
            })?;
            validate_vgpu(name, &format!("{field}.vgpu"), v)?
        }
        other => {
            return Err(err(
                "mode",
                format!("{other:?} is not one of whole, mig, timeslice, vgpu"),
            ))
        }
    };
    Ok(GpuRule { selector, mode })
}

fn validate_vgpu(name: &str, field: &str, v: RawVgpu) -> Result<GpuMode> {
    let err = |f: String, reason: String| ConfigError::new(name, f, reason);
    if let Some(r) = &v.resource {
        if !is_resource_name(r) {
            return Err(err(
                format!("{field}.resource"),
                format!("{r:?} is not a valid extended resource name"),
            ));
        }
    }
    if let Some(split) = v.split {
        return validate_split(name, field, split, v);
    }
    let check_cores = |f: String, cores: i64| -> Result<u32> {
        if (1..=100).contains(&cores) {
            Ok(cores as u32)
        } else {
            Err(err(f, format!("{cores} is not a percentage (1-100)")))
        }
    };
    let slices = match (v.count, v.slices) {
        (Some(count), None) => {
            if !(1..=64).contains(&count) {
                return Err(err(
                    format!("{field}.count"),
                    format!("{count} is not in 1..=64"),
                ));
            }
            let memory = v
                .memory
                .as_ref()
                .ok_or_else(|| err(format!("{field}.memory"), "required with count".into()))?;
            let memory_mib = parse_memory(memory).map_err(|r| err(format!("{field}.memory"), r))?;
            let cores = v
                .cores
                .ok_or_else(|| err(format!("{field}.cores"), "required with count".into()))?;
            let cores = check_cores(format!("{field}.cores"), cores)?;
            vec![VgpuSlice { memory_mib, cores }; count as usize]
        }
        (None, Some(list)) if !list.is_empty() => {
            if v.memory.is_some() || v.cores.is_some() {
                return Err(err(
                    field.to_string(),
                    "memory/cores go inside each slice when slices is set".into(),
                ));
            }
            let mut out = Vec::new();
            for (i, s) in list.into_iter().enumerate() {
                let memory_mib = parse_memory(&s.memory)
                    .map_err(|r| err(format!("{field}.slices[{i}].memory"), r))?;
                let cores = check_cores(format!("{field}.slices[{i}].cores"), s.cores)?;
                out.push(VgpuSlice { memory_mib, cores });
            }
            out
        }
        _ => {
            return Err(err(
                field.to_string(),
                "set exactly one of count (with memory and cores), slices, or split".into(),
            ))
        }
    };
    Ok(GpuMode::Vgpu {
        resource: v.resource,
        slices,
    })
}

/// `vgpu: { split }`: free-form vGPUs, nothing fixed beside the split (the resource
/// name aside).
fn validate_split(name: &str, field: &str, split: i64, v: RawVgpu) -> Result<GpuMode> {
    let fixed = [
        ("count", v.count.is_some()),
        ("memory", v.memory.is_some()),
        ("cores", v.cores.is_some()),
        ("slices", v.slices.is_some()),
    ];
    if let Some((key, _)) = fixed.iter().find(|(_, set)| *set) {
        return Err(ConfigError::new(
            name,
            format!("{field}.{key}"),
            "not allowed with split: split GPUs are sized per pod by the scheduler \
             (nvidia.com/gpumem, nvidia.com/gpucores); use split alone, or fixed slices \
             (count+memory+cores or slices) without it",
        ));
    }
    let max = i64::from(MAX_SPLIT);
    let split = u32::try_from(split)
        .ok()
        .filter(|s| (1..=MAX_SPLIT).contains(s))
        .ok_or_else(|| {
            ConfigError::new(
                name,
                format!("{field}.split"),
                format!("{split} is not in 1..={max} (vGPUs one GPU may hold at once)"),
            )
        })?;
    Ok(GpuMode::VgpuSplit {
        resource: v.resource,
        split,
    })
}

/// Memory sizes: a number is MiB; strings take `m`/`mi`/`mib`, `g`/`gi`/`gib` suffixes
/// (binary units, as HAMi's `10240m` and `10g`).
pub fn parse_memory(v: &serde_json::Value) -> Result<u64, String> {
    let bad = |s: &str| format!("{s:?} is not a memory size (e.g. 10240, \"10240m\", \"10g\")");
    let mib = match v {
        serde_json::Value::Number(n) => n.as_u64().ok_or_else(|| bad(&n.to_string()))?,
        serde_json::Value::String(s) => {
            let t = s.trim().to_ascii_lowercase();
            let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
            let (num, unit) = t.split_at(digits_end);
            let n: u64 = num.parse().map_err(|_| bad(s))?;
            match unit.trim() {
                "" | "m" | "mi" | "mib" => n,
                "g" | "gi" | "gib" => n.checked_mul(1024).ok_or_else(|| bad(s))?,
                _ => return Err(bad(s)),
            }
        }
        other => return Err(format!("{other:?} is not a memory size")),
    };
    if mib == 0 {
        return Err("memory must be > 0".into());
    }
    Ok(mib)
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `<dns-subdomain>/<name>` where name is at most 63 chars of `[A-Za-z0-9._-]`.
pub fn is_resource_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => {
            is_dns_subdomain(prefix)
                && !name.is_empty()
                && name.len() <= 63
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<NodeConfig> {
        parse_config("t", yaml)
    }

    #[test]
    fn nvidia_time_slicing_file_is_accepted_unchanged() {
        let cfg = parse(
            r#"
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: [envvar]
    deviceIDStrategy: uuid
  gfd:
    oneshot: false
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
      devices: [0, "1", "GPU-8d3e2c0b-1111-2222-3333-444455556666"]
"#,
        )
        .unwrap();
        assert_eq!(cfg.mig_strategy, MigStrategy::None);
        assert!(cfg.time_slicing.rename_by_default);
        assert!(cfg.time_slicing.fail_requests_greater_than_one);
        let r = &cfg.time_slicing.resources[0];
        assert_eq!(r.replicas, 10);
        assert_eq!(
            r.devices,
            ReplicaDevices::List(vec![
                "0".into(),
                "1".into(),
                "GPU-8d3e2c0b-1111-2222-3333-444455556666".into()
            ])
        );
    }

    #[test]
    fn tessera_rules_are_parsed() {
        let cfg = parse(
            r#"
version: v1
flags: { migStrategy: mixed }
tessera:
  gpus:
  - match: { index: [0, 1] }
    mode: mig
    mig: { layout: all-1g.10gb }
  - match: { model: H100-80GB }
    mode: vgpu
    vgpu: { count: 4, memory: 20g, cores: 25 }
  - match: all
    mode: timeslice
    timeslice: { replicas: 4, rename: nvidia.com/gpu.shared }
  health: { additionalIgnoredXids: [94] }
  allocation: { replicaStrategy: distributed, distinctGpus: true }
"#,
        )
        .unwrap();
        assert_eq!(cfg.gpu_rules.len(), 3);
        assert_eq!(
            cfg.gpu_rules[1].mode,
            GpuMode::Vgpu {
                resource: None,
                slices: vec![
                    VgpuSlice {
                        memory_mib: 20480,
                        cores: 25
                    };
                    4
                ]
            }
        );
        assert!(cfg.health.ignored_xids.contains(&94));
        assert!(cfg.health.ignored_xids.contains(&13));
        assert_eq!(
            cfg.allocation.replica_strategy,
            ReplicaStrategy::Distributed
        );
        assert!(cfg.allocation.distinct_gpus);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("flags: { migStrategy: weird }", "flags.migStrategy", "weird"),
            ("version: v2", "version", "v2"),
            ("flags: { bogus: 1 }", "flags.bogus", "unknown field `bogus`"),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { slices: [ { memory: 10g, cores: 130 } ] } } ] }",
                "tessera.gpus[0].vgpu.slices[0].cores",
                "130 is not a percentage",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 2, memory: 10x, cores: 10 } } ] }",
                "tessera.gpus[0].vgpu.memory",
                "not a memory size",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: fancy } ] }",
                "tessera.gpus[0].mode",
                "fancy",
            ),
            (
                "tessera: { gpus: [ { match: { index: [0], model: A30 }, mode: whole } ] }",
                "tessera.gpus[0].match",
                "exactly one",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: whole, mig: { layout: x } } ] }",
                "tessera.gpus[0].mig",
                "only valid with mode mig",
            ),
            (
                "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 0 } ] } }",
                "sharing.timeSlicing.resources[0].replicas",
                "1..=1024",
            ),
            (
                "sharing: { timeSlicing: { resources: [ { name: other.com/gpu, replicas: 2 } ] } }",
                "sharing.timeSlicing.resources[0].name",
                "prefix",
            ),
            (
                "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 2, devices: some } ] } }",
                "sharing.timeSlicing.resources[0].devices",
                "only valid string",
            ),
            ("sharing: { timeSlicing: { resources: [] } }", "sharing.timeSlicing.resources", "no resources"),
            ("tessera: { resourcePrefix: Bad_Prefix }", "tessera.resourcePrefix", "DNS"),
            ("tessera: { dra: { gpus: some } }", "tessera.dra.gpus", "\"some\": use all, none"),
            ("tessera: { dra: { gpus: { index: [] } } }", "tessera.dra.gpus", "exactly one"),
            ("tessera: { dra: { gpus: { index: [0], model: A30 } } }", "tessera.dra.gpus", "exactly one"),
            ("tessera: { dra: { path: dra } }", "tessera.dra.path", "unknown field `path`"),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 10, count: 2 } } ] }",
                "tessera.gpus[0].vgpu.count",
                "not allowed with split",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 10, memory: 10g } } ] }",
                "tessera.gpus[0].vgpu.memory",
                "not allowed with split",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4, cores: 25 } } ] }",
                "tessera.gpus[0].vgpu.cores",
                "not allowed with split",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4, slices: [ { memory: 1g, cores: 10 } ] } } ] }",
                "tessera.gpus[0].vgpu.slices",
                "not allowed with split",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 0 } } ] }",
                "tessera.gpus[0].vgpu.split",
                "0 is not in 1..=64",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 65 } } ] }",
                "tessera.gpus[0].vgpu.split",
                "65 is not in 1..=64",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: -3 } } ] }",
                "tessera.gpus[0].vgpu.split",
                "-3 is not in 1..=64",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: ten } } ] }",
                "tessera.gpus[0].vgpu.split",
                "invalid i64",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4, resource: gpu } } ] }",
                "tessera.gpus[0].vgpu.resource",
                "not a valid extended resource name",
            ),
            (
                "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: {} } ] }",
                "tessera.gpus[0].vgpu",
                "count (with memory and cores), slices, or split",
            ),
        ];
        for (yaml, field, reason) in cases {
            let e = parse(yaml).expect_err(yaml);
            assert_eq!(&e.field, field, "{yaml}: {e}");
            assert!(e.reason.contains(reason), "{yaml}: {e}");
            assert!(e.to_string().starts_with("config \"t\": "), "{e}");
        }
    }

    #[test]
    fn vgpu_split_is_free_form_vgpus() {
        let cases: &[(&str, GpuMode)] = &[
            (
                "{ split: 10 }",
                GpuMode::VgpuSplit {
                    resource: None,
                    split: 10,
                },
            ),
            (
                "{ split: 1 }",
                GpuMode::VgpuSplit {
                    resource: None,
                    split: 1,
                },
            ),
            (
                "{ split: 64, resource: nvidia.com/vgpu-slot }",
                GpuMode::VgpuSplit {
                    resource: Some("nvidia.com/vgpu-slot".into()),
                    split: MAX_SPLIT,
                },
            ),
        ];
        for (vgpu, want) in cases {
            let yaml = format!(
                "version: v1\ntessera: {{ gpus: [ {{ match: {{ model: A100 }}, mode: vgpu, vgpu: {vgpu} }} ] }}"
            );
            let cfg = parse(&yaml).expect(vgpu);
            assert_eq!(&cfg.gpu_rules[0].mode, want, "{vgpu}");
        }
    }

    #[test]
    fn dra_gpus_select_which_gpus_the_dra_driver_owns() {
        let cases: &[(&str, Option<GpuSelector>)] = &[
            ("version: v1", None),
            ("tessera: { dra: {} }", None),
            ("tessera: { dra: { gpus: none } }", None),
            ("tessera: { dra: { gpus: all } }", Some(GpuSelector::All)),
            (
                "tessera: { dra: { gpus: { index: [4, 5] } } }",
                Some(GpuSelector::Index([4, 5].into_iter().collect())),
            ),
            (
                "tessera: { dra: { gpus: { model: H100 } } }",
                Some(GpuSelector::Model("H100".into())),
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(&parse(yaml).unwrap().dra_gpus, want, "{yaml}");
        }
        // NVIDIA's files stay valid; the section sits beside the per-GPU rules.
        let cfg = parse(
            "version: v1\nflags: { migStrategy: mixed }\ntessera: { gpus: [ { match: all, mode: mig, mig: { layout: balanced } } ], dra: { gpus: { uuid: [GPU-1] } } }",
        )
        .unwrap();
        assert_eq!(cfg.gpu_rules.len(), 1);
        assert!(matches!(cfg.dra_gpus, Some(GpuSelector::Uuid(_))));
    }

    #[test]
    fn nvidia_resource_renames() {
        let cfg = parse(
            r#"
resources:
  gpus:
  - { pattern: "*A100*", name: a100 }
  - { pattern: "*", name: nvidia.com/other-gpu }
  mig:
  - { pattern: "1g.*", name: mig-small }
sharing:
  timeSlicing:
    resources: [ { name: nvidia.com/a100, replicas: 2 } ]
"#,
        )
        .unwrap();
        assert_eq!(cfg.gpu_resource("NVIDIA A100-SXM4-80GB"), "nvidia.com/a100");
        assert_eq!(cfg.gpu_resource("NVIDIA L4"), "nvidia.com/other-gpu");
        assert_eq!(cfg.mig_resource("1g.10gb"), "nvidia.com/mig-small");
        assert_eq!(cfg.mig_resource("3g.40gb"), "nvidia.com/mig-3g.40gb");
        assert_eq!(cfg.time_slicing.resources[0].name, "nvidia.com/a100");
        let e = parse("resources: { gpus: [ { pattern: x, name: \"bad name\" } ] }").unwrap_err();
        assert_eq!(e.field, "resources.gpus[0].name");
        assert!(glob_match("*H100*GB", "NVIDIA H100 80GB"));
        assert!(!glob_match("*H100*GB", "NVIDIA H100 NVL"));
    }

    #[test]
    fn memory_sizes() {
        use serde_json::Value;
        let ok = [
            ("10240", 10240),
            ("10240m", 10240),
            ("10g", 10240),
            ("2Gi", 2048),
        ];
        for (s, mib) in ok {
            assert_eq!(parse_memory(&Value::String(s.into())), Ok(mib), "{s}");
        }
        assert_eq!(parse_memory(&Value::Number(512.into())), Ok(512));
        for bad in ["", "g", "10t", "-1g", "0"] {
            assert!(parse_memory(&Value::String(bad.into())).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_named_config_is_validated_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("default"), "version: v1\n").unwrap();
        std::fs::write(dir.path().join("a-bad.yaml"), "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 130 } } ] }\n").unwrap();
        std::fs::write(dir.path().join("broken"), "flags: [\n").unwrap();
        std::fs::write(dir.path().join("mig"), "flags: { migStrategy: mixed }\n").unwrap();
        let set = load(dir.path()).unwrap();
        // The bad ones sort first and stop nothing.
        assert_eq!(set.select(None).unwrap().name, "default");
        assert_eq!(
            set.select(Some("mig")).unwrap().mig_strategy,
            MigStrategy::Mixed
        );
        let e = set.select(Some("a-bad")).unwrap_err();
        assert_eq!(e.config, "a-bad");
        assert_eq!(e.field, "tessera.gpus[0].vgpu.cores");
        assert!(e.reason.contains("a-bad.yaml"), "the file is named: {e}");
        let e = set.select(Some("broken")).unwrap_err();
        assert!(
            e.reason.contains("line ") && e.reason.contains("broken"),
            "{e}"
        );
        let e = set.select(Some("nope")).unwrap_err();
        assert!(
            e.reason
                .contains("known configs: a-bad, broken, default, mig"),
            "{e}"
        );
    }

    #[test]
    fn a_config_that_is_not_yaml_config_is_not_echoed() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("shadow");
        std::fs::write(
            &secret,
            "root:$6$s3cr3tSalt$Zm9vYmFyaGFzaA:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
        )
        .unwrap();
        let link = dir.path().join("config.yaml");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let set = load(&link).unwrap();
        let e = set.select(None).unwrap_err().to_string();
        assert!(
            !e.contains("s3cr3t") && !e.contains("root") && !e.contains("daemon"),
            "{e}"
        );
        assert!(e.contains("line 1") && e.contains("config.yaml"), "{e}");
        // Binary content, and a file over the size limit, are not quoted either.
        std::fs::write(&secret, [0xff, 0xfe, b's', b'e', b'c']).unwrap();
        let e = load(&link).unwrap().select(None).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && !e.contains("sec"), "{e}");
        let big = format!("# {}\n", "s".repeat(MAX_CONFIG_BYTES as usize));
        std::fs::write(&secret, big).unwrap();
        let e = load(&link).unwrap().select(None).unwrap_err().to_string();
        assert!(e.contains("limit") && !e.contains("sss"), "{e}");
    }

    #[test]
    fn adversarial_configs_fail_fast_with_a_clear_error() {
        let deep = format!("imex: {}{}\n", "[".repeat(200_000), "]".repeat(200_000));
        let mut deep_block = String::from("imex:\n");
        for i in 1..1000 {
            deep_block.push_str(&format!("{}a:\n", " ".repeat(i)));
        }
        // Under `imex`, which takes anything (NVIDIA's field, ignored by Tessera).
        let mut laughs = String::from(
            "version: v1\nimex:\n  x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol]\n",
        );
        for i in 1..10 {
            let prev = format!("*a{}", i - 1);
            laughs.push_str(&format!("  x{i}: &a{i} [{}]\n", vec![prev; 8].join(", ")));
        }
        let huge = format!("version: v1\n# {}\n", "x".repeat(2 << 20));
        for (what, text, want) in [
            ("deep", deep, "recursion limit"),
            ("deep block", deep_block, "budget"),
            ("laughs", laughs, "budget|limit"),
            ("huge", huge, "limit"),
        ] {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(parse_config("evil", &text).map(|c| c.name));
            });
            let e = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{what}: no answer in 10 s"))
                .expect_err(what);
            assert_eq!(e.config, "evil");
            assert!(want.split('|').any(|w| e.reason.contains(w)), "{what}: {e}");
        }
    }

    #[test]
    fn config_set_selects_by_label() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("default"), "version: v1\n").unwrap();
        std::fs::write(
            dir.path().join("mig.yaml"),
            "flags: { migStrategy: mixed }\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".hidden"), "garbage: [").unwrap();
        let set = load(dir.path()).unwrap();
        assert_eq!(set.select(None).unwrap().name, "default");
        assert_eq!(
            set.select(Some("mig")).unwrap().mig_strategy,
            MigStrategy::Mixed
        );
        let e = set.select(Some("nope")).unwrap_err();
        assert!(e.reason.contains("known configs: default, mig"), "{e}");
    }

    #[test]
    fn resource_names() {
        assert!(is_resource_name("nvidia.com/gpu.shared"));
        assert!(is_resource_name("nvidia.com/mig-1g.10gb"));
        assert!(!is_resource_name("gpu"));
        assert!(!is_resource_name("nvidia.com/"));
        assert!(!is_resource_name("nvidia.com/-x"));
    }
}
