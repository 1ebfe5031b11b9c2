//! NVML: the memory-info hooks that report the slice (what `nvidia-smi`, vLLM and others
//! read), and the shim's own use of the real NVML (context overhead, SM utilization).
//!
//! CUDA ordinals and NVML devices are matched by UUID (`cuDeviceGetUuid` against
//! `nvmlDeviceGetUUID`), so `CUDA_VISIBLE_DEVICES` reordering or hiding GPUs is followed:
//! the slice of CUDA ordinal `i` is reported on the NVML device with the same UUID, and an
//! NVML device no CUDA ordinal maps to reports the driver's numbers. Where a driver lacks
//! UUID queries, or CUDA's devices are not all among NVML's GPUs (MIG instances), NVML
//! index `i` is taken to be CUDA ordinal `i`.

use std::ffi::{c_char, CStr, CString};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::config::MAX_DEVICES;

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

/// The text form NVML uses for a UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
/// (without the `GPU-`/`MIG-` prefix).
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// UUID of CUDA ordinal `dev` (the driver must be initialised).
fn cuda_uuid(dev: usize) -> Option<[u8; 16]> {
    type F = unsafe extern "C" fn(*mut u8, CUdevice) -> CUresult;
    let f = real!(cuda_sym, "cuDeviceGetUuid_v2" => F)
        .or_else(|| real!(cuda_sym, "cuDeviceGetUuid" => F))?;
    let mut u = [0u8; 16];
    // SAFETY: a 16-byte out-buffer (CUuuid).
    (unsafe { f(u.as_mut_ptr(), CUdevice::try_from(dev).ok()?) } == CUDA_SUCCESS).then_some(u)
}

/// UUIDs (text, no prefix) of every CUDA ordinal this process sees; empty when the
/// driver cannot say (then indices are matched instead).
fn cuda_uuids() -> &'static [String] {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    LIST.get_or_init(|| {
        type Init = unsafe extern "C" fn(u32) -> CUresult;
        type Count = unsafe extern "C" fn(*mut i32) -> CUresult;
        let (Some(init), Some(count)) = (
            real!(cuda_sym, "cuInit" => Init),
            real!(cuda_sym, "cuDeviceGetCount" => Count),
        ) else {
            return Vec::new();
        };
        let mut n: i32 = 0;
        // SAFETY: plain driver calls with a valid out-pointer.
        if unsafe { init(0) } != CUDA_SUCCESS || unsafe { count(&mut n) } != CUDA_SUCCESS {
            return Vec::new();
        }
        let n = usize::try_from(n).unwrap_or(0).min(MAX_DEVICES);
        let list: Option<Vec<String>> = (0..n)
            .map(|d| cuda_uuid(d).map(|u| uuid_text(&u)))
            .collect();
        list.unwrap_or_default()
    })
}

/// Can every CUDA ordinal be found among NVML's GPUs by UUID? Not when CUDA sees MIG
/// instances (NVML lists their parent GPUs) or the driver cannot say: then NVML index `i`
/// is taken to be CUDA ordinal `i`, as without UUIDs.
fn uuids_matchable() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        type F = unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
        let uuids = cuda_uuids();
        let Some(f) = real!(nvml_sym, "nvmlDeviceGetHandleByUUID" => F) else {
            return false;
        };
        ready()
            && !uuids.is_empty()
            && uuids.iter().all(|u| {
                let mut h: nvmlDevice_t = std::ptr::null_mut();
                CString::new(format!("GPU-{u}"))
                    // SAFETY: NUL-terminated UUID and a valid out-pointer.
                    .is_ok_and(|c| unsafe { f(c.as_ptr(), &mut h) } == NVML_SUCCESS)
            })
    })
}

fn handle_by_index(dev: usize) -> Option<nvmlDevice_t> {
    type F = unsafe extern "C" fn(u32, *mut nvmlDevice_t) -> nvmlReturn_t;
    let f = real!(nvml_sym, "nvmlDeviceGetHandleByIndex_v2" => F)?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    (unsafe { f(u32::try_from(dev).ok()?, &mut h) } == NVML_SUCCESS).then_some(h)
}

fn handle_by_uuid(u: &[u8; 16]) -> Option<nvmlDevice_t> {
    type F = unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
    let f = real!(nvml_sym, "nvmlDeviceGetHandleByUUID" => F)?;
    let text = uuid_text(u);
    ["GPU-", "MIG-"].iter().find_map(|prefix| {
        let c = CString::new(format!("{prefix}{text}")).ok()?;
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: NUL-terminated UUID and a valid out-pointer.
        (unsafe { f(c.as_ptr(), &mut h) } == NVML_SUCCESS).then_some(h)
    })
}

/// The NVML device of CUDA ordinal `dev` (by UUID; by index where UUIDs are unknown).
fn handle(dev: usize) -> Option<nvmlDevice_t> {
    static CACHE: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];
    if !ready() {
        return None;
    }
    let cell = CACHE.get(dev)?;
    let cached = cell.load(Ordering::Relaxed);
    if cached != 0 {
        return Some(cached as nvmlDevice_t);
    }
    let h = match cuda_uuid(dev) {
        Some(u) => handle_by_uuid(&u).or_else(|| handle_by_index(dev)),
        None => handle_by_index(dev),
    }?;
    cell.store(h as usize, Ordering::Relaxed);
    Some(h)
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

/// CUDA ordinal of an NVML device: the ordinal with the same UUID (`None`: a GPU this
/// process's CUDA does not see), or its NVML index where UUIDs are unknown.
unsafe fn ordinal(device: nvmlDevice_t) -> Option<usize> {
    let uuids = cuda_uuids();
    type Uuid = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, u32) -> nvmlReturn_t;
    if let (true, Some(f)) = (
        uuids_matchable(),
        real!(nvml_sym, "nvmlDeviceGetUUID" => Uuid),
    ) {
        let mut buf = [0 as c_char; 96];
        if f(device, buf.as_mut_ptr(), buf.len() as u32) == NVML_SUCCESS {
            let text = CStr::from_ptr(buf.as_ptr()).to_string_lossy();
            let bare = text
                .strip_prefix("GPU-")
                .or_else(|| text.strip_prefix("MIG-"))
                .unwrap_or(&text);
            return uuids.iter().position(|u| u.eq_ignore_ascii_case(bare));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_matches_nvml_layout() {
        // (bytes, text)
        let cases = [
            ([0u8; 16], "00000000-0000-0000-0000-000000000000"),
            (
                [
                    0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac,
                    0xad, 0xae, 0x01,
                ],
                "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae01",
            ),
        ];
        for (u, want) in cases {
            assert_eq!(uuid_text(&u), want);
        }
    }
}
