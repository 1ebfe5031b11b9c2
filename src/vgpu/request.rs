//! What a pod asks for, HAMi's way: per container, `nvidia.com/gpu` vGPUs (each on a
//! distinct GPU) with `nvidia.com/gpumem` (MiB) or `nvidia.com/gpumem-percentage`, and
//! `nvidia.com/gpucores` (% of the GPU's SMs); per pod, the GPU selectors
//! (`nvidia.com/use-gputype`, `nouse-gputype`, `use-gpuuuid`, `nouse-gpuuuid`) and the
//! GPU and node policies (`hami.io/gpu-scheduler-policy`, `hami.io/node-scheduler-policy`).
//!
//! [`pod_request`] turns a Pod into a [`PodRequest`] with HAMi's defaults applied, or a
//! [`RequestError`] naming the container and the field. docs/hami.md lists every rule and
//! where Tessera departs from HAMi.

use crate::quota::quantity::Quantity;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use std::collections::BTreeMap;
use std::fmt;

/// The resource prefix Tessera uses unless configured otherwise (drop-in for HAMi).
pub const DEFAULT_PREFIX: &str = "nvidia.com";
/// Annotation: GPU models the pod may use (comma-separated, case-insensitive substrings).
pub const USE_GPUTYPE: &str = "nvidia.com/use-gputype";
/// Annotation: GPU models the pod must not use.
pub const NOUSE_GPUTYPE: &str = "nvidia.com/nouse-gputype";
/// Annotation: GPU UUIDs the pod may use (comma-separated, exact).
pub const USE_GPUUUID: &str = "nvidia.com/use-gpuuuid";
/// Annotation: GPU UUIDs the pod must not use.
pub const NOUSE_GPUUUID: &str = "nvidia.com/nouse-gpuuuid";
/// Annotation: how GPUs are chosen on a node (`binpack` or `spread`).
pub const GPU_POLICY: &str = "hami.io/gpu-scheduler-policy";
/// Annotation: how nodes are ranked (`binpack` or `spread`).
pub const NODE_POLICY: &str = "hami.io/node-scheduler-policy";

/// A request that cannot be placed as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The quantity does not parse.
    #[error("container {container:?}: {resource} {value:?} is not a quantity ({why})")]
    NotAQuantity {
        container: String,
        resource: String,
        value: String,
        why: String,
    },
    /// A fraction where a whole number is needed.
    #[error("container {container:?}: {resource} {value:?} is not a whole number")]
    NotAnInteger {
        container: String,
        resource: String,
        value: String,
    },
    /// A negative amount.
    #[error("container {container:?}: {resource} {value:?} is negative")]
    Negative {
        container: String,
        resource: String,
        value: String,
    },
    /// A number too large to mean anything here.
    #[error("container {container:?}: {resource} is {value}, more than {max}")]
    TooLarge {
        container: String,
        resource: String,
        value: u64,
        max: u64,
    },
    /// `gpumem` with a binary suffix (`10Gi`): the resource counts MiB, so this is
    /// almost surely a unit mistake.
    #[error(
        "container {container:?}: {resource} {value:?} has a unit; it counts MiB \
         (write 10240 for 10 GiB)"
    )]
    MemoryWithUnit {
        container: String,
        resource: String,
        value: String,
    },
    /// `gpumem: 0` asks for no memory at all.
    #[error("container {container:?}: {resource} is 0; leave it out to get the default memory")]
    ZeroMemory { container: String, resource: String },
    /// `gpucores` above 100 %.
    #[error("container {container:?}: {resource} is {cores}, above 100 (% of the GPU's SMs)")]
    CoresAbove100 {
        container: String,
        resource: String,
        cores: u64,
    },
    /// `gpumem-percentage` outside 1..=100.
    #[error("container {container:?}: {resource} is {percent}, not between 1 and 100")]
    PercentageOutOfRange {
        container: String,
        resource: String,
        percent: u64,
    },
    /// Both an absolute and a relative memory size.
    #[error("container {container:?}: {memory} and {percentage} together; ask for one of them")]
    MemoryAndPercentage {
        container: String,
        memory: String,
        percentage: String,
    },
    /// `gpumem`/`gpucores` without a vGPU count. HAMi's webhook adds `gpu: 1` here;
    /// Tessera refuses unless [`RequestConfig::default_gpu_count`] is set.
    #[error(
        "container {container:?}: {resource} without {gpu}; add {gpu}: 1 \
         (HAMi adds it silently, Tessera asks you to write it)"
    )]
    ShareWithoutCount {
        container: String,
        resource: String,
        gpu: String,
    },
    /// `gpu: 0` next to a memory or cores request.
    #[error("container {container:?}: {gpu} is 0 but {resource} is set; ask for at least 1")]
    ShareWithZeroCount {
        container: String,
        resource: String,
        gpu: String,
    },
    /// A policy annotation with a value other than `binpack` or `spread`.
    #[error("annotation {annotation}: {value:?} is not a policy (binpack or spread)")]
    UnknownPolicy { annotation: String, value: String },
    /// A selector annotation that lists nothing, or an empty entry.
    #[error("annotation {annotation}: {value:?} {why}")]
    MalformedAnnotation {
        annotation: String,
        value: String,
        why: String,
    },
}

/// Result of parsing a pod's request.
pub type Result<T> = std::result::Result<T, RequestError>;

/// How GPUs (within a node) or nodes are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Fill what is already used first (fewer GPUs or nodes touched).
    Binpack,
    /// Use the emptiest first (less interference).
    Spread,
}

impl Policy {
    fn parse(annotation: &str, value: &str) -> Result<Self> {
        match value.trim() {
            "binpack" => Ok(Policy::Binpack),
            "spread" => Ok(Policy::Spread),
            _ => Err(RequestError::UnknownPolicy {
                annotation: annotation.to_string(),
                value: value.to_string(),
            }),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
        })
    }
}

/// The knobs HAMi exposes as scheduler flags, with HAMi's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestConfig {
    /// Prefix of the resource names (`nvidia.com`).
    pub prefix: String,
    /// MiB per vGPU when a container names neither `gpumem` nor `gpumem-percentage`
    /// (HAMi's `--default-mem`); 0 means the whole GPU's memory.
    pub default_memory_mib: u64,
    /// Cores per vGPU when a container does not name `gpucores` (HAMi's `--default-cores`).
    pub default_cores: u32,
    /// vGPUs for a container that asks for `gpumem`/`gpucores` without `gpu`
    /// (HAMi's `defaultGPUNum`, 1). `None`, Tessera's default: such a container is refused.
    pub default_gpu_count: Option<u32>,
    /// GPU policy when the pod does not choose; `None`, the default: the placement
    /// engine's own (Tessera's policy). HAMi's default is spread.
    pub default_gpu_policy: Option<Policy>,
    /// Node policy when the pod does not choose; `None`, the default: the placement
    /// engine's own (Tessera's policy). HAMi's default is binpack.
    pub default_node_policy: Option<Policy>,
}

impl Default for RequestConfig {
    fn default() -> Self {
        RequestConfig {
            prefix: DEFAULT_PREFIX.to_string(),
            default_memory_mib: 0,
            default_cores: 0,
            default_gpu_count: None,
            default_gpu_policy: None,
            default_node_policy: None,
        }
    }
}

/// The four resource names under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceNames {
    /// `<prefix>/gpu`: vGPUs.
    pub gpu: String,
    /// `<prefix>/gpumem`: MiB per vGPU.
    pub gpumem: String,
    /// `<prefix>/gpumem-percentage`: % of the GPU's memory per vGPU.
    pub gpumem_percentage: String,
    /// `<prefix>/gpucores`: % of the GPU's SMs per vGPU.
    pub gpucores: String,
}

impl ResourceNames {
    /// The names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        ResourceNames {
            gpu: format!("{prefix}/gpu"),
            gpumem: format!("{prefix}/gpumem"),
            gpumem_percentage: format!("{prefix}/gpumem-percentage"),
            gpucores: format!("{prefix}/gpucores"),
        }
    }

    /// The names that only a vGPU request carries (not `gpu`, which whole GPUs share).
    pub fn share_names(&self) -> [&str; 3] {
        [&self.gpumem, &self.gpumem_percentage, &self.gpucores]
    }
}

/// Memory per vGPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryRequest {
    /// An absolute size.
    Mib(u64),
    /// A share of the GPU's memory, 1..=100 (100: all of it).
    Percent(u32),
}

impl MemoryRequest {
    /// The MiB this request takes on a GPU with `gpu_memory_mib`, rounded down as HAMi does.
    pub fn mib_on(self, gpu_memory_mib: u64) -> u64 {
        match self {
            MemoryRequest::Mib(mib) => mib,
            MemoryRequest::Percent(p) => gpu_memory_mib * u64::from(p) / 100,
        }
    }
}

impl fmt::Display for MemoryRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryRequest::Mib(mib) => write!(f, "{mib} MiB"),
            MemoryRequest::Percent(p) => write!(f, "{p}% of the memory"),
        }
    }
}

/// Where in the pod a container runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    /// An init container that runs to completion before the app containers.
    Init,
    /// An init container with `restartPolicy: Always`, running beside the app containers.
    Sidecar,
    /// An app container.
    App,
}

/// One container's vGPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRequest {
    /// The container's name.
    pub name: String,
    /// Init, sidecar or app container.
    pub kind: ContainerKind,
    /// vGPUs, each on a distinct GPU (at least 1).
    pub count: u32,
    /// Memory per vGPU.
    pub memory: MemoryRequest,
    /// % of the GPU's SMs per vGPU, 0..=100.
    pub cores: u32,
}

impl ContainerRequest {
    /// `gpucores: 100` asks for the GPU alone (HAMi's exclusive use).
    pub fn exclusive(&self) -> bool {
        self.cores == 100
    }
}

/// Which GPUs the pod's annotations allow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selectors {
    /// Models allowed (case-insensitive substrings of the GPU's model); empty: all.
    pub use_types: Vec<String>,
    /// Models refused (case-insensitive substrings).
    pub nouse_types: Vec<String>,
    /// UUIDs allowed (exact); empty: all.
    pub use_uuids: Vec<String>,
    /// UUIDs refused (exact).
    pub nouse_uuids: Vec<String>,
}

impl Selectors {
    /// Whether a GPU of `model` with `uuid` may hold this pod's vGPUs.
    pub fn allows(&self, uuid: &str, model: &str) -> bool {
        if !self.is_set() {
            return true;
        }
        self.allows_model(model)
            && (self.use_uuids.is_empty() || self.use_uuids.iter().any(|u| u == uuid))
            && !self.nouse_uuids.iter().any(|u| u == uuid)
    }

    /// Whether a GPU of `model` may hold this pod's vGPUs by the model selectors alone
    /// (UUID selectors aside).
    pub fn allows_model(&self, model: &str) -> bool {
        let model = model.to_uppercase();
        let names_model = |t: &String| model.contains(&t.to_uppercase());
        (self.use_types.is_empty() || self.use_types.iter().any(names_model))
            && !self.nouse_types.iter().any(names_model)
    }

    /// Whether any selector is set.
    pub fn is_set(&self) -> bool {
        !(self.use_types.is_empty()
            && self.nouse_types.is_empty()
            && self.use_uuids.is_empty()
            && self.nouse_uuids.is_empty())
    }
}

/// A pod's vGPU request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRequest {
    /// Containers that ask for vGPUs, init containers first, in spec order.
    pub containers: Vec<ContainerRequest>,
    /// GPUs the annotations allow.
    pub selectors: Selectors,
    /// How GPUs are chosen on a node; `None`: by Tessera's policy.
    pub gpu_policy: Option<Policy>,
    /// How nodes are ranked; `None`: by Tessera's policy.
    pub node_policy: Option<Policy>,
}

impl PodRequest {
    /// Total vGPUs over all containers.
    pub fn vgpus(&self) -> u32 {
        self.containers.iter().map(|c| c.count).sum()
    }
}

/// Whether any container of `pod` names `gpumem`, `gpumem-percentage` or `gpucores`:
/// the pods the admission webhook checks (a pod with only `nvidia.com/gpu` may be a
/// whole-GPU pod of the device plugin and is left alone).
pub fn carries_vgpu_resources(pod: &Pod, names: &ResourceNames) -> bool {
    all_containers(pod).any(|(c, _)| names.share_names().iter().any(|n| resource(c, n).is_some()))
}

/// The pod's vGPU request, or `None` when no container asks for vGPUs.
pub fn pod_request(pod: &Pod, config: &RequestConfig) -> Result<Option<PodRequest>> {
    let names = ResourceNames::new(&config.prefix);
    let mut containers = Vec::new();
    for (container, kind) in all_containers(pod) {
        if let Some(request) = container_request(container, kind, &names, config)? {
            containers.push(request);
        }
    }
    if containers.is_empty() {
        // The annotations of a pod without vGPUs are not ours to judge.
        return Ok(None);
    }
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let selectors = selectors(&annotations)?;
    let (gpu_policy, node_policy) = policies(pod, config)?;
    Ok(Some(PodRequest {
        containers,
        selectors,
        gpu_policy,
        node_policy,
    }))
}

/// The pod's GPU and node policies (`hami.io/gpu-scheduler-policy`,
/// `hami.io/node-scheduler-policy`), the configured defaults where it names none; read
/// whether or not the pod asks for vGPUs.
pub fn policies(pod: &Pod, config: &RequestConfig) -> Result<(Option<Policy>, Option<Policy>)> {
    let annotations = pod.metadata.annotations.as_ref();
    let policy = |key: &str, default: Option<Policy>| match annotations.and_then(|a| a.get(key)) {
        Some(value) => Policy::parse(key, value).map(Some),
        None => Ok(default),
    };
    Ok((
        policy(GPU_POLICY, config.default_gpu_policy)?,
        policy(NODE_POLICY, config.default_node_policy)?,
    ))
}

/// Init containers (plain or sidecar) then app containers.
fn all_containers(pod: &Pod) -> impl Iterator<Item = (&Container, ContainerKind)> {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            let kind = if sidecar {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            (c, kind)
        });
    let app = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| (c, ContainerKind::App));
    init.chain(app)
}

/// A resource's quantity text: the limit, else the request (as HAMi reads them).
fn resource<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    let resources = container.resources.as_ref()?;
    let from = |m: &'a Option<BTreeMap<String, K8sQuantity>>| {
        m.as_ref().and_then(|m| m.get(name)).map(|q| q.0.as_str())
    };
    from(&resources.limits).or_else(|| from(&resources.requests))
}

fn container_request(
    container: &Container,
    kind: ContainerKind,
    names: &ResourceNames,
    config: &RequestConfig,
) -> Result<Option<ContainerRequest>> {
    let field = |name: &str| -> Result<Option<u64>> {
        resource(container, name)
            .map(|value| whole_number(&container.name, name, value))
            .transpose()
    };
    if let Some(value) = resource(container, &names.gpumem) {
        if value.trim_end().ends_with('i') {
            return Err(RequestError::MemoryWithUnit {
                container: container.name.clone(),
                resource: names.gpumem.clone(),
                value: value.to_string(),
            });
        }
    }
    let memory = field(&names.gpumem)?;
    let percentage = field(&names.gpumem_percentage)?;
    let cores = field(&names.gpucores)?;
    let share = [
        (memory, &names.gpumem),
        (percentage, &names.gpumem_percentage),
        (cores, &names.gpucores),
    ]
    .into_iter()
    .find_map(|(v, n)| v.map(|_| n.clone()));
    let count = match (field(&names.gpu)?, &share, config.default_gpu_count) {
        (None, None, _) => return Ok(None),
        (None, Some(resource), None) => {
            return Err(RequestError::ShareWithoutCount {
                container: container.name.clone(),
                resource: resource.clone(),
                gpu: names.gpu.clone(),
            })
        }
        (None, Some(_), Some(default)) => u64::from(default),
        (Some(0), None, _) => return Ok(None),
        (Some(0), Some(resource), _) => {
            return Err(RequestError::ShareWithZeroCount {
                container: container.name.clone(),
                resource: resource.clone(),
                gpu: names.gpu.clone(),
            })
        }
        (Some(n), _, _) => n,
    };
    Ok(Some(ContainerRequest {
        name: container.name.clone(),
        kind,
        count: bounded(&container.name, &names.gpu, count, MAX_VGPUS)?,
        memory: memory_request(&container.name, names, memory, percentage, config)?,
        cores: cores_request(&container.name, names, cores, config)?,
    }))
}

/// More vGPUs than any node holds GPUs; keeps sums far from overflow.
const MAX_VGPUS: u64 = 1024;

fn memory_request(
    container: &str,
    names: &ResourceNames,
    memory: Option<u64>,
    percentage: Option<u64>,
    config: &RequestConfig,
) -> Result<MemoryRequest> {
    match (memory, percentage) {
        (Some(_), Some(_)) => Err(RequestError::MemoryAndPercentage {
            container: container.to_string(),
            memory: names.gpumem.clone(),
            percentage: names.gpumem_percentage.clone(),
        }),
        (Some(0), None) => Err(RequestError::ZeroMemory {
            container: container.to_string(),
            resource: names.gpumem.clone(),
        }),
        (Some(mib), None) => Ok(MemoryRequest::Mib(mib)),
        (None, Some(p)) if (1..=100).contains(&p) => Ok(MemoryRequest::Percent(p as u32)),
        (None, Some(p)) => Err(RequestError::PercentageOutOfRange {
            container: container.to_string(),
            resource: names.gpumem_percentage.clone(),
            percent: p,
        }),
        (None, None) if config.default_memory_mib > 0 => {
            Ok(MemoryRequest::Mib(config.default_memory_mib))
        }
        (None, None) => Ok(MemoryRequest::Percent(100)),
    }
}

fn cores_request(
    container: &str,
    names: &ResourceNames,
    cores: Option<u64>,
    config: &RequestConfig,
) -> Result<u32> {
    match cores {
        None => Ok(config.default_cores.min(100)),
        Some(c) if c <= 100 => Ok(c as u32),
        Some(c) => Err(RequestError::CoresAbove100 {
            container: container.to_string(),
            resource: names.gpucores.clone(),
            cores: c,
        }),
    }
}

fn bounded(container: &str, resource: &str, value: u64, max: u64) -> Result<u32> {
    match u32::try_from(value) {
        Ok(v) if value <= max => Ok(v),
        _ => Err(RequestError::TooLarge {
            container: container.to_string(),
            resource: resource.to_string(),
            value,
            max,
        }),
    }
}

/// Parses a quantity that must be a non-negative whole number (`10240`, `20k`, `1e3`).
fn whole_number(container: &str, resource: &str, value: &str) -> Result<u64> {
    let (c, r, v) = (
        container.to_string(),
        resource.to_string(),
        value.to_string(),
    );
    let milli = match Quantity::parse(value) {
        Ok(quantity) => quantity.0,
        Err(crate::quota::Error::Quantity { why, .. }) => {
            return Err(RequestError::NotAQuantity {
                container: c,
                resource: r,
                value: v,
                why,
            })
        }
        Err(other) => {
            return Err(RequestError::NotAQuantity {
                container: c,
                resource: r,
                value: v,
                why: other.to_string(),
            })
        }
    };
    if milli < 0 {
        return Err(RequestError::Negative {
            container: c,
            resource: r,
            value: v,
        });
    }
    if milli % 1000 != 0 {
        return Err(RequestError::NotAnInteger {
            container: c,
            resource: r,
            value: v,
        });
    }
    Ok((milli / 1000).unsigned_abs())
}

/// The selectors from the pod's annotations.
fn selectors(annotations: &BTreeMap<String, String>) -> Result<Selectors> {
    let list = |key: &str| -> Result<Vec<String>> {
        let Some(value) = annotations.get(key) else {
            return Ok(Vec::new());
        };
        let entries: Vec<String> = value.split(',').map(|e| e.trim().to_string()).collect();
        if entries.iter().any(String::is_empty) {
            let why = if value.trim().is_empty() {
                "lists nothing; remove the annotation or name at least one"
            } else {
                "has an empty entry"
            };
            return Err(RequestError::MalformedAnnotation {
                annotation: key.to_string(),
                value: value.clone(),
                why: why.to_string(),
            });
        }
        Ok(entries)
    };
    Ok(Selectors {
        use_types: list(USE_GPUTYPE)?,
        nouse_types: list(NOUSE_GPUTYPE)?,
        use_uuids: list(USE_GPUUUID)?,
        nouse_uuids: list(NOUSE_GPUUUID)?,
    })
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;

/// Requests built directly, for the vGPU modules' unit tests.
#[cfg(test)]
pub(crate) mod test_requests {
    use super::{ContainerKind, ContainerRequest, MemoryRequest, PodRequest, Selectors};

    /// An app container asking `count` vGPUs of `memory` and `cores` each.
    pub(crate) fn container(
        name: &str,
        count: u32,
        memory: MemoryRequest,
        cores: u32,
    ) -> ContainerRequest {
        ContainerRequest {
            name: name.into(),
            kind: ContainerKind::App,
            count,
            memory,
            cores,
        }
    }

    /// A pod of `containers` with no selectors or policies.
    pub(crate) fn pod(containers: Vec<ContainerRequest>) -> PodRequest {
        PodRequest {
            containers,
            selectors: Selectors::default(),
            gpu_policy: None,
            node_policy: None,
        }
    }
}
