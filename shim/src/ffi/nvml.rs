//! NVML: the memory-info hooks that report the slice (what `nvidia-smi`, vLLM and others
//! read), and the shim's own use of the real NVML (context overhead, SM utilization).
//!
//! NVML device index `i` is taken to be CUDA ordinal `i` (true for one GPU per container
//! and with `CUDA_DEVICE_ORDER=PCI_BUS_ID`).

use std::sync::atomic::{AtomicU8, Ordering};

use super::dl::real;
use super::shim;
use super::types::*;

static INIT: AtomicU8 = AtomicU8::new(0);

/// Initialise the real NVML once (for the shim's own queries).
fn ready() -> bool {
    match INIT.load(Ordering::Acquire) {
        1 => true,
        2 => false,
        _ => {
            let ok = real!(nvml_sym, "nvmlInit_v2" => unsafe extern "C" fn() -> nvmlReturn_t)
                // SAFETY: no arguments.
                .is_some_and(|f| unsafe { f() } == NVML_SUCCESS);
            INIT.store(if ok { 1 } else { 2 }, Ordering::Release);
            ok
        }
    }
}

fn handle(dev: usize) -> Option<nvmlDevice_t> {
    if !ready() {
        return None;
    }
    type F = unsafe extern "C" fn(u32, *mut nvmlDevice_t) -> nvmlReturn_t;
    let f = real!(nvml_sym, "nvmlDeviceGetHandleByIndex_v2" => F)?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    (unsafe { f(u32::try_from(dev).ok()?, &mut h) } == NVML_SUCCESS).then_some(h)
}

/// Device-wide used bytes from the real NVML.
pub fn used_bytes(dev: usize) -> Option<u64> {
    let h = handle(dev)?;
    type F = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
    let f = real!(nvml_sym, "nvmlDeviceGetMemoryInfo" => F)?;
    let mut m = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: valid handle and out-pointer.
    (unsafe { f(h, &mut m) } == NVML_SUCCESS).then_some(m.used)
}

/// Device SM utilization percent over NVML's last sample period.
pub fn utilization(dev: usize) -> Option<u32> {
    let h = handle(dev)?;
    type F = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlUtilization_t) -> nvmlReturn_t;
    let f = real!(nvml_sym, "nvmlDeviceGetUtilizationRates" => F)?;
    let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
    // SAFETY: valid handle and out-pointer.
    (unsafe { f(h, &mut u) } == NVML_SUCCESS).then_some(u.gpu)
}

/// CUDA ordinal of an NVML handle.
unsafe fn ordinal(device: nvmlDevice_t) -> Option<usize> {
    let f = real!(nvml_sym, "nvmlDeviceGetIndex" => unsafe extern "C" fn(nvmlDevice_t, *mut u32) -> nvmlReturn_t)?;
    let mut idx: u32 = 0;
    (f(device, &mut idx) == NVML_SUCCESS)
        .then(|| usize::try_from(idx).ok())
        .flatten()
}

/// The slice view `(used, total)` of `device`, when it has a limit.
unsafe fn slice(device: nvmlDevice_t, real_total: u64) -> Result<Option<(u64, u64)>, nvmlReturn_t> {
    let Some(s) = shim() else {
        return Err(NVML_ERROR_NO_PERMISSION);
    };
    Ok(ordinal(device).and_then(|d| s.ledger.nvml_info(d, real_total)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    type F = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
    let Some(real) = real!(nvml_sym, "nvmlDeviceGetMemoryInfo" => F) else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    let rc = real(device, mem);
    let Some(m) = mem.as_mut().filter(|_| rc == NVML_SUCCESS) else {
        return rc;
    };
    match slice(device, m.total) {
        Ok(Some((used, total))) => {
            m.total = total;
            m.used = used;
            m.free = total - used;
            rc
        }
        Ok(None) => rc,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    type F = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t;
    let Some(real) = real!(nvml_sym, "nvmlDeviceGetMemoryInfo_v2" => F) else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    let rc = real(device, mem);
    let Some(m) = mem.as_mut().filter(|_| rc == NVML_SUCCESS) else {
        return rc;
    };
    match slice(device, m.total) {
        Ok(Some((used, total))) => {
            m.total = total;
            m.reserved = 0;
            m.used = used;
            m.free = total - used;
            rc
        }
        Ok(None) => rc,
        Err(e) => e,
    }
}
