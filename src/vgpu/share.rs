//! vGPU books and requests in the placement engine's terms, so the scheduler extender
//! places vGPU pods by the engine `tessera simulate` measures (docs/hami.md, "How
//! prioritize scores").
//!
//! The engine counts a GPU in milli (1000 = the whole GPU). A vGPU takes the larger of
//! its memory share and its cores share of the GPU it lands on:
//!
//! - memory: `gpumem` MiB over the GPU's memory, rounded up (`gpumem-percentage` p:
//!   10·p); cores: `gpucores` c: 10·c (`gpucores: 100`, exclusive: a whole GPU);
//! - a GPU's free part is the smaller of its free memory and its free cores, rounded
//!   down; an unhealthy GPU, one whose slots are all booked or one held exclusively has
//!   none. Its free memory in MiB goes with it, so the engine checks memory exactly.
//!
//! A pod is one engine request: its CPU and memory, and its vGPUs as `count` parts of
//! `milli` each on distinct GPUs, where `count` is its widest container's vGPU count
//! and `milli` the sum of its containers' shares (as if every container shared the same
//! GPUs, which is where the books put them when they fit). Model selectors become the
//! engine's model list; UUID selectors have no engine form (the books still apply them).

use super::books::{GpuRecord, GpuUsage, WHOLE_GPU_CORES};
use super::request::{ContainerRequest, MemoryRequest, PodRequest};
use crate::placement::{GpuDemand, GpuFree, Request, MILLI};

/// What a pod takes of its node besides GPUs: CPU and memory requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostRequest {
    /// CPU, milli-cores.
    pub cpu_milli: u32,
    /// Memory, MiB (rounded up).
    pub memory_mib: u64,
}

impl HostRequest {
    /// Both amounts added, saturating.
    pub fn plus(self, other: HostRequest) -> HostRequest {
        HostRequest {
            cpu_milli: self.cpu_milli.saturating_add(other.cpu_milli),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
        }
    }

    /// `other` taken away, saturating at zero.
    pub fn minus(self, other: HostRequest) -> HostRequest {
        HostRequest {
            cpu_milli: self.cpu_milli.saturating_sub(other.cpu_milli),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
        }
    }
}

/// The free part of one GPU with `used` booked, as the engine counts it.
pub fn gpu_free(gpu: &GpuRecord, used: &GpuUsage) -> GpuFree {
    if !gpu.healthy || used.vgpus >= gpu.slots || used.exclusive {
        return GpuFree {
            milli: 0,
            memory_mib: 0,
        };
    }
    let free_mib = gpu.memory_mib.saturating_sub(used.memory_mib);
    let by_memory = free_mib
        .saturating_mul(u64::from(MILLI))
        .checked_div(gpu.memory_mib)
        .unwrap_or(0);
    let by_cores = 10 * u64::from(WHOLE_GPU_CORES.saturating_sub(used.cores));
    GpuFree {
        milli: by_memory.min(by_cores).min(u64::from(MILLI)) as u16,
        memory_mib: u32::try_from(free_mib).unwrap_or(u32::MAX),
    }
}

/// One vGPU of `container` on a GPU of `gpu_memory_mib`, in milli (1..=1000).
pub fn vgpu_milli(container: &ContainerRequest, gpu_memory_mib: u64) -> u16 {
    let by_memory = match container.memory {
        MemoryRequest::Percent(p) => 10 * u64::from(p),
        MemoryRequest::Mib(_) if gpu_memory_mib == 0 => u64::from(MILLI),
        MemoryRequest::Mib(mib) => mib
            .saturating_mul(u64::from(MILLI))
            .div_ceil(gpu_memory_mib),
    };
    let by_cores = 10 * u64::from(container.cores);
    by_memory.max(by_cores).clamp(1, u64::from(MILLI)) as u16
}

/// The engine's request for a pod with `host` CPU and memory and, for a vGPU pod,
/// `vgpus`, on GPUs of `gpu_memory_mib` among `models` (the GPU models the cluster has;
/// the pod's model selectors pick from them).
pub fn engine_request(
    vgpus: Option<&PodRequest>,
    host: HostRequest,
    gpu_memory_mib: u64,
    models: &[String],
) -> Request {
    let cpu_milli = host.cpu_milli;
    let Some(pod) = vgpus.filter(|p| !p.containers.is_empty()) else {
        return Request::cpu(cpu_milli, host.memory_mib);
    };
    let count = pod.containers.iter().map(|c| c.count).max().unwrap_or(1);
    let count = u8::try_from(count).unwrap_or(u8::MAX);
    let milli: u64 = pod
        .containers
        .iter()
        .map(|c| u64::from(vgpu_milli(c, gpu_memory_mib)))
        .sum();
    let milli = milli.min(u64::from(MILLI)) as u16;
    let memory: u64 = pod
        .containers
        .iter()
        .map(|c| c.memory.mib_on(gpu_memory_mib))
        .sum();
    let memory_mib = u32::try_from(memory).unwrap_or(u32::MAX);
    let gpu = if count == 1 && milli < MILLI {
        GpuDemand::Shared { milli, memory_mib }
    } else {
        GpuDemand::Split {
            count,
            milli,
            memory_mib,
        }
    };
    let gpu_models = if pod.selectors.use_types.is_empty() && pod.selectors.nouse_types.is_empty() {
        Vec::new()
    } else {
        models
            .iter()
            .filter(|m| pod.selectors.allows_model(m))
            .cloned()
            .collect()
    };
    Request {
        cpu_milli,
        memory_mib: host.memory_mib,
        gpu,
        gpu_models,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vgpu::request::test_requests::{container, pod};

    #[test]
    fn a_vgpu_takes_its_larger_share_rounded_up() {
        let gpu = 16_000;
        // (memory, cores, milli)
        let cases = [
            (MemoryRequest::Mib(7_360), 0, 460), // the trace's 460 milli at 16 MiB each
            (MemoryRequest::Mib(7_361), 0, 461), // a MiB more rounds up
            (MemoryRequest::Mib(1_000), 30, 300),
            (MemoryRequest::Percent(25), 10, 250),
            (MemoryRequest::Percent(100), 0, 1000),
            (MemoryRequest::Mib(1), 0, 1),
            (MemoryRequest::Mib(1), 100, 1000), // exclusive: the whole GPU
            (MemoryRequest::Mib(32_000), 0, 1000),
        ];
        for (memory, cores, want) in cases {
            assert_eq!(
                vgpu_milli(&container("main", 1, memory, cores), gpu),
                want,
                "{memory} {cores}"
            );
        }
        assert_eq!(
            vgpu_milli(&container("main", 1, MemoryRequest::Mib(1), 0), 0),
            1000
        );
    }

    #[test]
    fn a_gpu_is_free_by_its_scarcer_resource() {
        let gpu = GpuRecord::new("g", "A100", 16_000).with_slots(4);
        let used = |memory_mib, cores, vgpus, exclusive| GpuUsage {
            memory_mib,
            cores,
            vgpus,
            exclusive,
        };
        // (usage, free milli, free MiB)
        let cases = [
            (used(0, 0, 0, false), 1000, 16_000),
            (used(7_360, 0, 1, false), 540, 8_640),
            (used(7_361, 0, 1, false), 539, 8_639),
            (used(1_000, 70, 1, false), 300, 15_000),
            (used(1_000, 0, 4, false), 0, 0),  // every slot booked
            (used(1_000, 100, 1, true), 0, 0), // held exclusively
        ];
        for (usage, milli, mib) in cases {
            let free = gpu_free(&gpu, &usage);
            assert_eq!((free.milli, free.memory_mib), (milli, mib), "{usage:?}");
        }
        let sick = gpu.clone().unhealthy();
        assert_eq!(gpu_free(&sick, &used(0, 0, 0, false)).milli, 0);
    }

    #[test]
    fn a_pod_becomes_one_engine_request() {
        let host = HostRequest {
            cpu_milli: 4000,
            memory_mib: 8192,
        };
        let models = ["NVIDIA A100".to_string(), "NVIDIA L4".to_string()];
        let one = pod(vec![container("main", 1, MemoryRequest::Mib(4_000), 0)]);
        let r = engine_request(Some(&one), host, 16_000, &models);
        assert_eq!(
            (r.cpu_milli, r.memory_mib, r.gpu.clone()),
            (
                4000,
                8192,
                GpuDemand::Shared {
                    milli: 250,
                    memory_mib: 4_000
                }
            )
        );
        assert!(r.gpu_models.is_empty());
        // Two containers: the widest count, the shares summed.
        let two = pod(vec![
            container("main", 2, MemoryRequest::Percent(20), 0),
            container("main", 1, MemoryRequest::Mib(1_600), 30),
        ]);
        let r = engine_request(Some(&two), host, 16_000, &models);
        assert_eq!(
            r.gpu,
            GpuDemand::Split {
                count: 2,
                milli: 500,
                memory_mib: 4_800
            }
        );
        let whole = pod(vec![container("main", 1, MemoryRequest::Percent(100), 0)]);
        let r = engine_request(Some(&whole), host, 16_000, &models);
        assert_eq!(
            r.gpu,
            GpuDemand::Split {
                count: 1,
                milli: 1000,
                memory_mib: 16_000
            }
        );
        let mut picky = one.clone();
        picky.selectors.use_types = vec!["a100".into()];
        let r = engine_request(Some(&picky), host, 16_000, &models);
        assert_eq!(r.gpu_models, ["NVIDIA A100"]);
        let r = engine_request(None, host, 16_000, &models);
        assert_eq!(r, Request::cpu(4000, 8192));
    }
}
