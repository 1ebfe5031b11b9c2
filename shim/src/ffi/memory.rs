//! Memory hooks: every allocating entry point is charged before the driver runs it, and
//! every free is credited after; the memory queries report the slice.

use std::ffi::c_void;

use super::dl::real;
use super::types::*;
use super::{current_device, nvml, shim};
use crate::account::allocs::Charge;
use crate::account::reservoirs::Key;
use crate::account::{sizes, Kind, Refusal};
use crate::runtime::Shim;

pub(super) fn refuse(what: &str, r: &Refusal) -> CUresult {
    crate::log::info(&format!("{what}: out of memory: {r}"));
    CUDA_ERROR_OUT_OF_MEMORY
}

/// Ask the driver for `dev`'s allocation granularity once.
pub(super) fn ensure_granularity(s: &Shim, dev: usize) {
    if !s.ledger.needs_granularity(dev) {
        return;
    }
    type F = unsafe extern "C" fn(*mut usize, *const MemAllocationProp, u32) -> CUresult;
    let mut g: usize = 0;
    if let Some(f) = real!(cuda_sym, "cuMemGetAllocationGranularity" => F) {
        let prop = MemAllocationProp {
            kind: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: MemLocation {
                kind: CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev as i32,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        };
        // SAFETY: valid out-pointer and property struct.
        if unsafe { f(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) } != CUDA_SUCCESS {
            g = 0;
        }
    }
    s.ledger.set_granularity(dev, g as u64);
}

/// Reserve `bytes` on the current device. `Err(code)` to return to the caller.
fn reserve_current(what: &str, bytes: u64) -> Result<(&'static Shim, Option<Charge>), CUresult> {
    let s = shim().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    if !s.ledger.any_limit() {
        return Ok((s, None));
    }
    let Some(dev) = current_device() else {
        // No context: the driver call will fail on its own; nothing to charge.
        return Ok((s, None));
    };
    ensure_granularity(s, dev);
    match s.ledger.reserve(dev, bytes) {
        Ok(c) => Ok((s, c)),
        Err(r) => Err(refuse(what, &r)),
    }
}

/// Commit or cancel after the driver returned `rc`.
fn settle(s: &Shim, rc: CUresult, kind: Kind, handle: Option<u64>, c: Option<Charge>) -> CUresult {
    match (rc, handle) {
        (CUDA_SUCCESS, Some(h)) => s.ledger.commit(kind, h, c),
        _ => s.ledger.cancel(c),
    }
    rc
}

unsafe fn read<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        None
    } else {
        Some(*p)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuMemAlloc_v2" => unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let (s, c) = match reserve_current("cuMemAlloc", size as u64) {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let rc = real(dptr, size);
    settle(s, rc, Kind::Ptr, read(dptr), c)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: u32,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptr, usize, u32) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemAllocManaged" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let (s, c) = match reserve_current("cuMemAllocManaged", size as u64) {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let rc = real(dptr, size, flags);
    settle(s, rc, Kind::Ptr, read(dptr), c)
}

/// Pitched allocations: the driver picks the pitch, so the size is known only afterwards.
/// Reserve the unpadded size first (so concurrent allocators cannot slip past the limit),
/// then charge the padding once the real pitch is known, freeing if that does not fit.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, u32) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemAllocPitch_v2" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let Some(s) = shim() else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let Some(dev) = current_device() else {
        return real(dptr, pitch, width, height, elem);
    };
    ensure_granularity(s, dev);
    let base = (width as u64).saturating_mul(height as u64);
    let first = match s.ledger.reserve_exact(dev, base) {
        Ok(c) => c,
        Err(r) => return refuse("cuMemAllocPitch", &r),
    };
    let rc = real(dptr, pitch, width, height, elem);
    let (Some(p), Some(ptr)) = (read(pitch), read(dptr)) else {
        s.ledger.cancel(first);
        return rc;
    };
    if rc != CUDA_SUCCESS {
        s.ledger.cancel(first);
        return rc;
    }
    let Some(first) = first else {
        return rc; // unlimited device
    };
    let full = s
        .ledger
        .round(dev, (p as u64).saturating_mul(height as u64));
    let extra = full.saturating_sub(first.bytes);
    match s.ledger.reserve_exact(dev, extra) {
        Ok(more) => {
            let bytes = first.bytes + more.map_or(0, |m| m.bytes);
            s.ledger.commit(Kind::Ptr, ptr, Some(Charge { dev, bytes }));
            rc
        }
        Err(r) => {
            s.ledger.cancel(Some(first));
            if let Some(free) =
                real!(cuda_sym, "cuMemFree_v2" => unsafe extern "C" fn(CUdeviceptr) -> CUresult)
            {
                free(ptr);
            }
            refuse("cuMemAllocPitch", &r)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuMemFree_v2" => unsafe extern "C" fn(CUdeviceptr) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(dptr);
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            // cuMemFree also returns stream-ordered memory to its pool.
            if !s.ledger.release(Kind::Ptr, dptr) {
                s.ledger.reservoir_free(dptr);
            }
        }
    }
    rc
}

/// Stream-ordered allocation from `pool` (`None`: the device's current pool): charged to
/// the pool's reservoir, so memory the pool already holds is not charged twice. Without
/// a way to name the pool, charged per pointer like `cuMemAlloc`.
unsafe fn alloc_async(
    what: &str,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<Handle>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(s) = shim() else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if !s.ledger.any_limit() {
        return call();
    }
    // A pool created through the shim is counted on its own device; a host pool not at all.
    let dev = match pool.and_then(|p| s.ledger.pool_location(p as u64)) {
        Some(Some(d)) => Some(d),
        Some(None) => return call(),
        None => current_device(),
    };
    let Some(dev) = dev else {
        return call();
    };
    if s.ledger.limit(dev).is_none() {
        return call();
    }
    ensure_granularity(s, dev);
    let pool = pool
        .map(|p| p as u64)
        .or_else(|| super::pools::current_pool(dev));
    let Some(pool) = pool else {
        let c = match s.ledger.reserve(dev, size as u64) {
            Ok(c) => c,
            Err(r) => return refuse(what, &r),
        };
        let rc = call();
        return settle(s, rc, Kind::Ptr, read(dptr), c);
    };
    let bytes = s.ledger.round(dev, size as u64);
    let t = match s.ledger.reservoir_take(Key::Pool(pool), dev, bytes) {
        Ok(t) => t,
        Err(r) => return refuse(what, &r),
    };
    let rc = call();
    s.ledger.reservoir_settle(t, read(dptr), rc == CUDA_SUCCESS);
    rc
}

unsafe fn free_async(dptr: CUdeviceptr, rc: CUresult) -> CUresult {
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            // Pool pointers first: most stream-ordered frees are theirs.
            if !s.ledger.reservoir_free(dptr) {
                s.ledger.release(Kind::Ptr, dptr);
            }
        }
    }
    rc
}

/// `cuStreamIsCapturing` (or its `_ptsz` form, matching the hook's stream semantics).
type IsCapturing = unsafe extern "C" fn(Handle, *mut i32) -> CUresult;

/// Is `stream` being captured into a graph? Allocations made during capture allocate
/// nothing now: they become graph allocation nodes, counted when the graph is launched.
unsafe fn capturing(query: Option<IsCapturing>, stream: Handle) -> bool {
    let mut status: i32 = 0;
    query.is_some_and(|f| f(stream, &mut status) == CUDA_SUCCESS && status != 0)
}

macro_rules! async_hooks {
    ($alloc:ident, $pool:ident, $free:ident, $capturing:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $alloc(dptr: *mut CUdeviceptr, size: usize, stream: Handle) -> CUresult {
            type F = unsafe extern "C" fn(*mut CUdeviceptr, usize, Handle) -> CUresult;
            let Some(real) = real!(cuda_sym, stringify!($alloc) => F) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            if capturing(real!(cuda_sym, $capturing => IsCapturing), stream) {
                return real(dptr, size, stream);
            }
            alloc_async(stringify!($alloc), dptr, size, None, || real(dptr, size, stream))
        }

        #[no_mangle]
        pub unsafe extern "C" fn $pool(dptr: *mut CUdeviceptr, size: usize, pool: Handle, stream: Handle) -> CUresult {
            type F = unsafe extern "C" fn(*mut CUdeviceptr, usize, Handle, Handle) -> CUresult;
            let Some(real) = real!(cuda_sym, stringify!($pool) => F) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            if capturing(real!(cuda_sym, $capturing => IsCapturing), stream) {
                return real(dptr, size, pool, stream);
            }
            alloc_async(stringify!($pool), dptr, size, Some(pool), || real(dptr, size, pool, stream))
        }

        #[no_mangle]
        pub unsafe extern "C" fn $free(dptr: CUdeviceptr, stream: Handle) -> CUresult {
            type F = unsafe extern "C" fn(CUdeviceptr, Handle) -> CUresult;
            let Some(real) = real!(cuda_sym, stringify!($free) => F) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            // A free captured into a graph happens when the graph runs, not now.
            if capturing(real!(cuda_sym, $capturing => IsCapturing), stream) {
                return real(dptr, stream);
            }
            free_async(dptr, real(dptr, stream))
        }
    };
}

async_hooks!(
    cuMemAllocAsync,
    cuMemAllocFromPoolAsync,
    cuMemFreeAsync,
    "cuStreamIsCapturing"
);
async_hooks!(
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync_ptsz,
    "cuStreamIsCapturing_ptsz"
);

/// VMM physical memory (PyTorch expandable segments): charged at create, credited at
/// release; mapping does not allocate.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemCreate" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let Some(s) = shim() else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let dev = if prop.is_null() {
        None
    } else {
        let p = &*prop;
        (p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE)
            .then(|| usize::try_from(p.location.id).ok())
            .flatten()
    };
    let Some(dev) = dev else {
        return real(handle, size, prop, flags);
    };
    ensure_granularity(s, dev);
    let c = match s.ledger.reserve(dev, size as u64) {
        Ok(c) => c,
        Err(r) => return refuse("cuMemCreate", &r),
    };
    let rc = real(handle, size, prop, flags);
    settle(s, rc, Kind::Vmm, read(handle), c)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuMemRelease" => unsafe extern "C" fn(u64) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(handle);
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            s.ledger.release(Kind::Vmm, handle);
        }
    }
    rc
}

unsafe fn array_create(
    what: &str,
    out: *mut Handle,
    bytes: Option<u64>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(bytes) = bytes else {
        crate::log::warn(&format!("{what}: array size overflows; refused"));
        return CUDA_ERROR_INVALID_VALUE;
    };
    let (s, c) = match reserve_current(what, bytes) {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let rc = call();
    settle(s, rc, Kind::Array, read(out).map(|h| h as u64), c)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuArrayCreate_v2" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let Some(d) = desc.as_ref() else {
        return real(out, desc);
    };
    let bytes = sizes::array_bytes(d.width as u64, d.height as u64, 0, d.format, d.num_channels);
    array_create("cuArrayCreate", out, bytes, || real(out, desc))
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut Handle,
    desc: *const Array3DDescriptor,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut Handle, *const Array3DDescriptor) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuArray3DCreate_v2" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let Some(d) = desc.as_ref() else {
        return real(out, desc);
    };
    let bytes = sizes::array_bytes(
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format,
        d.num_channels,
    );
    array_create("cuArray3DCreate", out, bytes, || real(out, desc))
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut Handle,
    desc: *const Array3DDescriptor,
    levels: u32,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut Handle, *const Array3DDescriptor, u32) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMipmappedArrayCreate" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let Some(d) = desc.as_ref() else {
        return real(out, desc, levels);
    };
    let bytes = sizes::mipmapped_bytes(
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format,
        d.num_channels,
        levels,
    );
    array_create("cuMipmappedArrayCreate", out, bytes, || {
        real(out, desc, levels)
    })
}

unsafe fn array_destroy(h: Handle, rc: CUresult) -> CUresult {
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            s.ledger.release(Kind::Array, h as u64);
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(h: Handle) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuArrayDestroy" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    array_destroy(h, real(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h: Handle) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuMipmappedArrayDestroy" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    array_destroy(h, real(h))
}

/// Legacy 32-bit entry points (pre CUDA 3.2 ABI): refused so they cannot bypass the limit.
macro_rules! refuse_legacy {
    ($($name:ident($($arg:ident : $ty:ty),*);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            $(let _ = $arg;)*
            crate::log::warn(concat!(stringify!($name), ": legacy 32-bit entry point refused; use the _v2 API"));
            CUDA_ERROR_NOT_SUPPORTED
        }
    )*};
}

refuse_legacy! {
    cuMemAlloc(dptr: *mut u32, size: u32);
    cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, w: u32, h: u32, e: u32);
    cuMemGetInfo(free: *mut u32, total: *mut u32);
    cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice);
    cuArrayCreate(out: *mut Handle, desc: *const c_void);
    cuArray3DCreate(out: *mut Handle, desc: *const c_void);
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuMemGetInfo_v2" => unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(free, total);
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    let Some(s) = shim() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    if let Some(dev) = current_device() {
        let (f, t) = s.ledger.mem_info(dev, *free as u64, *total as u64);
        *free = f as usize;
        *total = t as usize;
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuDeviceTotalMem_v2" => unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(bytes, dev);
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    let Some(s) = shim() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    if let Some(limit) = usize::try_from(dev).ok().and_then(|d| s.ledger.limit(d)) {
        *bytes = (*bytes as u64).min(limit) as usize;
    }
    rc
}

/// First context on `dev`: measure what the driver spent on it through NVML.
fn context_with_overhead(
    dev: CUdevice,
    create: impl FnOnce() -> CUresult,
    handle: impl FnOnce() -> Option<u64>,
) -> CUresult {
    let Some(s) = shim() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    let Ok(d) = usize::try_from(dev) else {
        return create();
    };
    let measure = s.ledger.limit(d).is_some() && s.ledger.first_context(d);
    let before = if measure { nvml::used_bytes(d) } else { None };
    let rc = create();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let overhead = match (before, if measure { nvml::used_bytes(d) } else { None }) {
        (Some(b), Some(a)) => a
            .saturating_sub(b)
            .min(crate::account::MAX_CONTEXT_OVERHEAD),
        _ => 0,
    };
    s.ledger.context_opened(d, handle(), overhead);
    rc
}

macro_rules! ctx_create {
    ($name:ident($($arg:ident : $ty:ty),*) dev = $dev:ident, out = $out:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            type F = unsafe extern "C" fn($($ty),*) -> CUresult;
            let Some(real) = real!(cuda_sym, stringify!($name) => F) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            context_with_overhead($dev, || real($($arg),*), || read($out).map(|c| c as u64))
        }
    };
}

ctx_create!(cuCtxCreate(pctx: *mut Handle, flags: u32, dev: CUdevice) dev = dev, out = pctx);
ctx_create!(cuCtxCreate_v2(pctx: *mut Handle, flags: u32, dev: CUdevice) dev = dev, out = pctx);
ctx_create!(cuCtxCreate_v3(pctx: *mut Handle, params: *mut c_void, n: i32, flags: u32, dev: CUdevice) dev = dev, out = pctx);
ctx_create!(cuCtxCreate_v4(pctx: *mut Handle, params: *mut c_void, flags: u32, dev: CUdevice) dev = dev, out = pctx);

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    type F = unsafe extern "C" fn(*mut Handle, CUdevice) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuDevicePrimaryCtxRetain" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    context_with_overhead(dev, || real(pctx, dev), || None)
}

unsafe fn primary_released(dev: CUdevice, rc: CUresult) -> CUresult {
    if rc == CUDA_SUCCESS {
        if let (Some(s), Ok(d)) = (shim(), usize::try_from(dev)) {
            s.ledger.context_closed(d, None);
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuDevicePrimaryCtxRelease" => unsafe extern "C" fn(CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    primary_released(dev, real(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuDevicePrimaryCtxRelease_v2" => unsafe extern "C" fn(CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    primary_released(dev, real(dev))
}

unsafe fn ctx_destroyed(ctx: Handle, rc: CUresult) -> CUresult {
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            s.ledger.context_destroyed(ctx as u64);
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: Handle) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuCtxDestroy" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    ctx_destroyed(ctx, real(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuCtxDestroy_v2" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    ctx_destroyed(ctx, real(ctx))
}

/// `cuInit`: the place where a refusing shim makes the whole process fail loudly.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuInit" => unsafe extern "C" fn(u32) -> CUresult) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    if shim().is_none() {
        return CUDA_ERROR_NOT_PERMITTED;
    }
    real(flags)
}
