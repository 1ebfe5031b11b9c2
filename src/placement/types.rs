//! Plain input/output types of the placement engine: node specs, requests, placements.

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};

/// One GPU in thousandths (the FGD paper's "gpu-milli").
pub const MILLI: u16 = 1000;

/// A node as configured: capacity only, no usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu_count: u8,
    /// GPU model (e.g. `A100-80GB`, `T4`, `G2`); `None` for CPU-only nodes.
    pub gpu_model: Option<String>,
    /// Memory of each GPU in MiB; 0 when unknown (then GPU-memory requests are not checked).
    pub gpu_memory_mib: u32,
    /// Whether the GPUs are MIG-partitionable (MIG requests only go there).
    pub mig_capable: bool,
}

impl NodeSpec {
    /// A node with `gpus` GPUs of `model` and the given CPU/memory capacity.
    pub fn new(name: &str, cpu_milli: u32, memory_mib: u64, gpus: u8, model: &str) -> Self {
        Self {
            name: name.to_string(),
            cpu_milli,
            memory_mib,
            gpu_count: gpus,
            gpu_model: (!model.is_empty()).then(|| model.to_string()),
            gpu_memory_mib: 0,
            mig_capable: false,
        }
    }

    /// Builder: per-GPU memory in MiB.
    pub fn with_gpu_memory(mut self, mib: u32) -> Self {
        self.gpu_memory_mib = mib;
        self
    }

    /// Builder: GPUs can be MIG-partitioned.
    pub fn with_mig(mut self) -> Self {
        self.mig_capable = true;
        self
    }
}

/// A MIG profile such as `1g.10gb`: compute slices out of 7 and memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigProfile {
    pub compute_slices: u8,
    pub memory_gb: u32,
}

impl MigProfile {
    /// Parses NVIDIA's `<n>g.<m>gb` profile names (`1g.10gb`, `3g.40gb`, `7g.80gb`).
    pub fn parse(name: &str) -> Result<Self> {
        let bad = || Error::InvalidRequest {
            field: "mig_profile",
            reason: format!("`{name}` is not of the form <slices>g.<memory>gb"),
        };
        let (g, m) = name.split_once('.').ok_or_else(bad)?;
        let slices: u8 = g
            .strip_suffix('g')
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        let mem: u32 = m
            .strip_suffix("gb")
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        if slices == 0 || slices > 7 {
            return Err(bad());
        }
        Ok(Self {
            compute_slices: slices,
            memory_gb: mem,
        })
    }

    /// The share of the GPU's compute this profile takes, in milli, rounded down: the
    /// instances of one GPU have at most 7 slices, so their shares never add up to more
    /// than the GPU (rounded up, seven `1g` instances would take 1,001 and only six fit).
    pub fn milli(&self) -> u16 {
        u16::from(self.compute_slices) * MILLI / 7
    }
}

/// What a request needs from GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuDemand {
    /// No GPU (CPU-only pod).
    None,
    /// Part of one GPU: compute in milli (1..1000), optional GPU memory in MiB.
    Shared { milli: u16, memory_mib: u32 },
    /// `count` whole, otherwise unused GPUs on one node.
    Whole { count: u8 },
    /// `count` parts of GPUs, each on its own GPU of one node: compute in milli
    /// (1..=1000) and optional GPU memory in MiB on each (HAMi's `nvidia.com/gpu: 2`
    /// with a share of each).
    Split {
        count: u8,
        milli: u16,
        memory_mib: u32,
    },
    /// One MIG instance of the profile on a MIG-capable GPU.
    Mig(MigProfile),
}

/// A request to place: node CPU/memory, GPU demand, allowed GPU models (empty = any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    pub gpu_models: Vec<String>,
}

impl Request {
    /// A CPU-only request.
    pub fn cpu(cpu_milli: u32, memory_mib: u64) -> Self {
        Self {
            cpu_milli,
            memory_mib,
            gpu: GpuDemand::None,
            gpu_models: Vec::new(),
        }
    }

    /// A request for `milli` thousandths of one GPU.
    pub fn shared(cpu_milli: u32, memory_mib: u64, milli: u16) -> Self {
        Self {
            gpu: GpuDemand::Shared {
                milli,
                memory_mib: 0,
            },
            ..Self::cpu(cpu_milli, memory_mib)
        }
    }

    /// A request for `count` whole GPUs.
    pub fn whole(cpu_milli: u32, memory_mib: u64, count: u8) -> Self {
        Self {
            gpu: GpuDemand::Whole { count },
            ..Self::cpu(cpu_milli, memory_mib)
        }
    }

    /// Builder: restrict to these GPU models.
    pub fn on_models(mut self, models: &[&str]) -> Self {
        self.gpu_models = models.iter().map(|m| m.to_string()).collect();
        self
    }

    /// Total GPU compute asked for, in milli.
    pub fn total_gpu_milli(&self) -> u64 {
        match &self.gpu {
            GpuDemand::None => 0,
            GpuDemand::Shared { milli, .. } => u64::from(*milli),
            GpuDemand::Whole { count } => u64::from(*count) * u64::from(MILLI),
            GpuDemand::Split { count, milli, .. } => u64::from(*count) * u64::from(*milli),
            GpuDemand::Mig(p) => u64::from(p.milli()),
        }
    }
}

/// The free part of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuFree {
    pub milli: u16,
    pub memory_mib: u32,
}

/// Interned id of a [`Demand`] inside one [`super::Cluster`].
pub type DemandId = u32;

/// A request normalised against one cluster: what the policies actually evaluate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Demand {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// GPUs needed (0 for CPU-only).
    pub gpu_count: u8,
    /// Compute needed on each of those GPUs (1000 for whole GPUs).
    pub gpu_milli: u16,
    /// GPU memory needed on each GPU (0 = not checked).
    pub gpu_memory_mib: u32,
    /// Needs a MIG-capable GPU.
    pub mig: bool,
    /// Allowed GPU models as a bit set over the cluster's model table; `None` = any.
    pub models: Option<u64>,
    /// Interned id (same demand, same id), used by policy caches.
    pub id: DemandId,
}

impl Demand {
    /// Total GPU compute, in milli.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.gpu_count) * u64::from(self.gpu_milli)
    }

    /// True for a fraction of one GPU (the "GPU-sharing" pods of the paper).
    pub fn is_shared(&self) -> bool {
        self.gpu_count == 1 && self.gpu_milli < MILLI
    }
}

/// Where a request goes: a node and, per GPU used, its index on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: usize,
    pub gpus: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_parse_and_a_full_gpu_of_instances_fits() {
        let table = [
            ("1g.10gb", Some((1, 10, 142))),
            ("3g.40gb", Some((3, 40, 428))),
            ("7g.80gb", Some((7, 80, 1000))),
        ];
        let milli = |name: &str| u32::from(MigProfile::parse(name).unwrap().milli());
        assert!(
            7 * milli("1g.10gb") <= 1000,
            "seven 1g instances on one GPU"
        );
        assert!(2 * milli("2g.20gb") + milli("3g.40gb") <= 1000);
        assert!(milli("4g.40gb") + milli("3g.40gb") <= 1000);
        for (name, want) in table {
            let p = MigProfile::parse(name)
                .ok()
                .map(|p| (p.compute_slices, p.memory_gb, p.milli()));
            assert_eq!(p, want, "{name}");
        }
        for bad in ["", "1g", "0g.5gb", "8g.80gb", "xg.10gb", "1g.10"] {
            assert!(MigProfile::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn total_gpu_milli_per_demand_kind() {
        assert_eq!(Request::cpu(1000, 10).total_gpu_milli(), 0);
        assert_eq!(Request::shared(1000, 10, 250).total_gpu_milli(), 250);
        assert_eq!(Request::whole(1000, 10, 4).total_gpu_milli(), 4000);
        let split = Request {
            gpu: GpuDemand::Split {
                count: 3,
                milli: 250,
                memory_mib: 4096,
            },
            ..Request::cpu(1000, 10)
        };
        assert_eq!(split.total_gpu_milli(), 750);
    }
}
