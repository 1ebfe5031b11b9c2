//! `cuGetProcAddress` / `cuGetProcAddress_v2`: how the CUDA runtime (11.3+) resolves the
//! driver. The real call runs first; then the requested symbol, CUDA version and
//! per-thread-stream flag select the concrete variant (`_v2`, `_v3`, `_ptsz`, ...) and, when
//! the shim hooks that variant, the hook is returned instead. A pointer the name rules do
//! not cover is matched against the real addresses of every hooked symbol. A symbol of an
//! allocating family that neither rule maps is refused: handing out an unhooked allocator
//! would silently lift the limit.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use super::dl::{self, real};
use super::hooks;
use super::types::*;

/// (base name, [(first CUDA version, concrete symbol)]) for symbols whose ABI changed.
const VERSIONED: &[(&str, &[(i32, &str)])] = &[
    ("cuMemAlloc", &[(0, "cuMemAlloc"), (3020, "cuMemAlloc_v2")]),
    (
        "cuMemAllocPitch",
        &[(0, "cuMemAllocPitch"), (3020, "cuMemAllocPitch_v2")],
    ),
    ("cuMemFree", &[(0, "cuMemFree"), (3020, "cuMemFree_v2")]),
    (
        "cuMemGetInfo",
        &[(0, "cuMemGetInfo"), (3020, "cuMemGetInfo_v2")],
    ),
    (
        "cuDeviceTotalMem",
        &[(0, "cuDeviceTotalMem"), (3020, "cuDeviceTotalMem_v2")],
    ),
    (
        "cuArrayCreate",
        &[(0, "cuArrayCreate"), (3020, "cuArrayCreate_v2")],
    ),
    (
        "cuArray3DCreate",
        &[(0, "cuArray3DCreate"), (3020, "cuArray3DCreate_v2")],
    ),
    (
        "cuCtxCreate",
        &[
            (0, "cuCtxCreate"),
            (3020, "cuCtxCreate_v2"),
            (11040, "cuCtxCreate_v3"),
            (12050, "cuCtxCreate_v4"),
        ],
    ),
    (
        "cuCtxDestroy",
        &[(0, "cuCtxDestroy"), (4000, "cuCtxDestroy_v2")],
    ),
    (
        "cuDevicePrimaryCtxRelease",
        &[
            (0, "cuDevicePrimaryCtxRelease"),
            (11000, "cuDevicePrimaryCtxRelease_v2"),
        ],
    ),
    (
        "cuGetProcAddress",
        &[(0, "cuGetProcAddress"), (12000, "cuGetProcAddress_v2")],
    ),
    (
        "cuGraphInstantiate",
        &[
            (0, "cuGraphInstantiate"),
            (11000, "cuGraphInstantiate_v2"),
            (12000, "cuGraphInstantiateWithFlags"),
        ],
    ),
];

/// Symbols with a per-thread-default-stream (`_ptsz`) variant.
const PTSZ: &[&str] = &[
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
    "cuGraphLaunch",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuStreamSynchronize",
    "cuGraphInstantiateWithParams",
];

/// Families whose unknown variants must not be handed out.
const GUARDED: &[&str] = &[
    "cuMemAlloc",
    "cuMemCreate",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuMipmappedArrayCreate",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
    "cuGraphInstantiate",
    "cuGraphAddMemAllocNode",
];

/// The concrete symbol `cuGetProcAddress(symbol, version, flags)` resolves to.
pub fn resolve(symbol: &str, version: i32, flags: u64) -> String {
    let concrete = VERSIONED
        .iter()
        .find(|(base, _)| *base == symbol)
        .and_then(|(_, vs)| {
            vs.iter()
                .rev()
                .find(|(v, _)| *v <= version)
                .map(|(_, n)| *n)
        })
        .unwrap_or(symbol);
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 && PTSZ.contains(&symbol) {
        format!("{concrete}_ptsz")
    } else {
        concrete.to_string()
    }
}

fn guarded(symbol: &str) -> bool {
    GUARDED.iter().any(|g| symbol.starts_with(g))
}

/// (real address, hook address) for every hooked libcuda symbol.
fn by_real_ptr(p: usize) -> Option<*mut c_void> {
    static TABLE: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        hooks::CUDA_NAMES
            .iter()
            .filter_map(|n| {
                let real = dl::cuda_sym_str(n);
                let ours = hooks::by_name(n.as_bytes())? as usize;
                (real != 0).then_some((real, ours))
            })
            // A driver whose own table resolves through the dynamic linker may already
            // hand out the hooks: those are fine as they are.
            .chain(hooks::CUDA_NAMES.iter().filter_map(|n| {
                let ours = hooks::by_name(n.as_bytes())? as usize;
                Some((ours, ours))
            }))
            .collect()
    });
    table
        .iter()
        .find(|(r, _)| *r == p)
        .map(|(_, o)| *o as *mut c_void)
}

unsafe fn rewrite(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    rc: CUresult,
) -> Result<(), CUresult> {
    if rc != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() || (*pfn).is_null() {
        return Ok(());
    }
    let Ok(name) = CStr::from_ptr(symbol).to_str() else {
        return Ok(());
    };
    let concrete = resolve(name, version, flags);
    if let Some(ours) = hooks::by_name(concrete.as_bytes()) {
        *pfn = ours;
        return Ok(());
    }
    if let Some(ours) = by_real_ptr(*pfn as usize) {
        *pfn = ours;
        return Ok(());
    }
    if guarded(name) {
        crate::log::error(&format!(
            "cuGetProcAddress({name}, version {version}, flags {flags:#x}): variant {concrete} is not intercepted; refused so the memory limit cannot be bypassed"
        ));
        *pfn = std::ptr::null_mut();
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuGetProcAddress" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(symbol, pfn, version, flags);
    match rewrite(symbol, pfn, version, flags, rc) {
        Ok(()) => rc,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuGetProcAddress_v2" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(symbol, pfn, version, flags, status);
    match rewrite(symbol, pfn, version, flags, rc) {
        Ok(()) => rc,
        Err(e) => {
            if !status.is_null() {
                *status = 1; // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            }
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_resolution_table() {
        // (symbol, version, flags, concrete)
        let cases = [
            ("cuMemAlloc", 2000, 0, "cuMemAlloc"),
            ("cuMemAlloc", 11030, 0, "cuMemAlloc_v2"),
            ("cuMemAlloc", 13000, 2, "cuMemAlloc_v2"),
            ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
            ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"),
            ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
            ("cuLaunchKernel", 12000, 1, "cuLaunchKernel"),
            ("cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
            ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
            ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
            ("cuMemAllocManaged", 6000, 0, "cuMemAllocManaged"),
            ("cuStreamCreate", 12000, 2, "cuStreamCreate"),
            ("cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"),
            ("cuGraphInstantiate", 11040, 0, "cuGraphInstantiate_v2"),
            (
                "cuGraphInstantiate",
                12080,
                0,
                "cuGraphInstantiateWithFlags",
            ),
            (
                "cuGraphInstantiateWithParams",
                12000,
                2,
                "cuGraphInstantiateWithParams_ptsz",
            ),
            ("cuStreamSynchronize", 12000, 2, "cuStreamSynchronize_ptsz"),
        ];
        for (sym, v, f, want) in cases {
            assert_eq!(resolve(sym, v, f), want, "{sym} v{v} flags {f}");
        }
    }

    #[test]
    fn every_resolved_allocator_is_hooked() {
        for (base, variants) in VERSIONED {
            for (_, concrete) in variants.iter().filter(|(_, n)| *n != "cuMemFree") {
                assert!(
                    hooks::by_name(concrete.as_bytes()).is_some(),
                    "{base}: {concrete}"
                );
            }
        }
        for p in PTSZ {
            assert!(
                hooks::by_name(format!("{p}_ptsz").as_bytes()).is_some(),
                "{p}_ptsz"
            );
        }
        assert!(guarded("cuMemAllocAsync_v9") && !guarded("cuStreamCreate"));
    }
}
