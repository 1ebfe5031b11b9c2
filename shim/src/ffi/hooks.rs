//! The table of intercepted symbols: what `dlsym` and `cuGetProcAddress` hand out instead
//! of the real driver's functions.

use std::ffi::c_void;

use super::{launch, memory, nvml, pools, procaddr};

macro_rules! table {
    (cuda: [$($c:ident => $cp:path),* $(,)?], nvml: [$($n:ident => $np:path),* $(,)?]) => {
        /// Hooked libcuda symbols.
        pub const CUDA_NAMES: &[&str] = &[$(stringify!($c)),*];
        /// Hooked libnvidia-ml symbols.
        pub const NVML_NAMES: &[&str] = &[$(stringify!($n)),*];

        /// The hook for an exact symbol name.
        pub fn by_name(name: &[u8]) -> Option<*mut c_void> {
            // Cheap reject: every hooked name starts with "cu" or "nvml".
            if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
                return None;
            }
            Some(match name {
                $(n if n == stringify!($c).as_bytes() => $cp as *mut c_void,)*
                $(n if n == stringify!($n).as_bytes() => $np as *mut c_void,)*
                _ => return None,
            })
        }
    };
}

table! {
    cuda: [
        cuInit => memory::cuInit,
        cuGetProcAddress => procaddr::cuGetProcAddress,
        cuGetProcAddress_v2 => procaddr::cuGetProcAddress_v2,
        cuMemAlloc => memory::cuMemAlloc,
        cuMemAlloc_v2 => memory::cuMemAlloc_v2,
        cuMemAllocPitch => memory::cuMemAllocPitch,
        cuMemAllocPitch_v2 => memory::cuMemAllocPitch_v2,
        cuMemAllocManaged => memory::cuMemAllocManaged,
        cuMemFree_v2 => memory::cuMemFree_v2,
        cuMemAllocAsync => memory::cuMemAllocAsync,
        cuMemAllocAsync_ptsz => memory::cuMemAllocAsync_ptsz,
        cuMemAllocFromPoolAsync => memory::cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz => memory::cuMemAllocFromPoolAsync_ptsz,
        cuMemFreeAsync => memory::cuMemFreeAsync,
        cuMemFreeAsync_ptsz => memory::cuMemFreeAsync_ptsz,
        cuMemCreate => memory::cuMemCreate,
        cuMemRelease => memory::cuMemRelease,
        cuArrayCreate => memory::cuArrayCreate,
        cuArrayCreate_v2 => memory::cuArrayCreate_v2,
        cuArray3DCreate => memory::cuArray3DCreate,
        cuArray3DCreate_v2 => memory::cuArray3DCreate_v2,
        cuArrayDestroy => memory::cuArrayDestroy,
        cuMipmappedArrayCreate => memory::cuMipmappedArrayCreate,
        cuMipmappedArrayDestroy => memory::cuMipmappedArrayDestroy,
        cuMemGetInfo => memory::cuMemGetInfo,
        cuMemGetInfo_v2 => memory::cuMemGetInfo_v2,
        cuDeviceTotalMem => memory::cuDeviceTotalMem,
        cuDeviceTotalMem_v2 => memory::cuDeviceTotalMem_v2,
        cuCtxCreate => memory::cuCtxCreate,
        cuCtxCreate_v2 => memory::cuCtxCreate_v2,
        cuCtxCreate_v3 => memory::cuCtxCreate_v3,
        cuCtxCreate_v4 => memory::cuCtxCreate_v4,
        cuCtxDestroy => memory::cuCtxDestroy,
        cuCtxDestroy_v2 => memory::cuCtxDestroy_v2,
        cuDevicePrimaryCtxRetain => memory::cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease => memory::cuDevicePrimaryCtxRelease,
        cuDevicePrimaryCtxRelease_v2 => memory::cuDevicePrimaryCtxRelease_v2,
        cuLaunchKernel => launch::cuLaunchKernel,
        cuLaunchKernel_ptsz => launch::cuLaunchKernel_ptsz,
        cuLaunchKernelEx => launch::cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz => launch::cuLaunchKernelEx_ptsz,
        cuLaunchCooperativeKernel => launch::cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz => launch::cuLaunchCooperativeKernel_ptsz,
        cuGraphLaunch => launch::cuGraphLaunch,
        cuGraphLaunch_ptsz => launch::cuGraphLaunch_ptsz,
        cuMemPoolCreate => pools::cuMemPoolCreate,
        cuMemPoolTrimTo => pools::cuMemPoolTrimTo,
        cuMemPoolSetAttribute => pools::cuMemPoolSetAttribute,
        cuMemPoolDestroy => pools::cuMemPoolDestroy,
        cuStreamSynchronize => pools::cuStreamSynchronize,
        cuStreamSynchronize_ptsz => pools::cuStreamSynchronize_ptsz,
        cuCtxSynchronize => pools::cuCtxSynchronize,
        cuEventSynchronize => pools::cuEventSynchronize,
        cuGraphAddMemAllocNode => pools::cuGraphAddMemAllocNode,
        cuGraphInstantiate => pools::cuGraphInstantiate,
        cuGraphInstantiate_v2 => pools::cuGraphInstantiate_v2,
        cuGraphInstantiateWithFlags => pools::cuGraphInstantiateWithFlags,
        cuGraphInstantiateWithParams => pools::cuGraphInstantiateWithParams,
        cuGraphInstantiateWithParams_ptsz => pools::cuGraphInstantiateWithParams_ptsz,
        cuGraphExecDestroy => pools::cuGraphExecDestroy,
        cuDeviceGraphMemTrim => pools::cuDeviceGraphMemTrim,
        cuDeviceGetGraphMemAttribute => pools::cuDeviceGetGraphMemAttribute,
    ],
    nvml: [
        nvmlDeviceGetMemoryInfo => nvml::nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetMemoryInfo_v2 => nvml::nvmlDeviceGetMemoryInfo_v2,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_distinct_hooks() {
        let mut seen = std::collections::HashSet::new();
        for n in CUDA_NAMES.iter().chain(NVML_NAMES) {
            let p = by_name(n.as_bytes()).unwrap_or_else(|| panic!("{n} unresolved"));
            assert!(seen.insert(p as usize), "{n} shares a hook");
        }
        assert!(by_name(b"cuStreamCreate").is_none());
        assert!(by_name(b"malloc").is_none());
        assert!(by_name(b"cuMemAlloc_v2\0").is_none());
    }
}
