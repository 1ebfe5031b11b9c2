//! Finding the real driver and making `dlsym` land in the shim.
//!
//! `dlsym` and `dlvsym` are exported as naked trampolines: they ask [`hook_for`] whether
//! the name is one the shim intercepts (then return the hook, whatever the handle —
//! `RTLD_NEXT` included — and whatever version `dlvsym` asks for), and otherwise *jump*
//! to glibc's function with the caller's return address untouched, so `RTLD_NEXT`
//! lookups by the application or other interposers still resolve relative to their real
//! caller. glibc's own functions are found in its symbol table ([`super::elf`]): calling
//! `dlsym` or `dlvsym` from inside the shim would land in the trampolines.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);
static CUDA: AtomicUsize = AtomicUsize::new(0);
static NVML: AtomicUsize = AtomicUsize::new(0);

extern "C" fn dlsym_missing(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

extern "C" fn dlvsym_missing(_: *mut c_void, _: *const c_char, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

fn libc_fn(cell: &AtomicUsize, name: &CStr, missing: usize) -> usize {
    let p = cell.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    match super::elf::libc_symbol(name) {
        Some(f) => {
            cell.store(f, Ordering::Relaxed);
            f
        }
        None => {
            crate::log::error(&format!(
                "cannot find the C library's {}; symbol lookups will fail",
                name.to_string_lossy()
            ));
            missing
        }
    }
}

/// Address of glibc's `dlsym`.
extern "C" fn real_dlsym_addr() -> usize {
    libc_fn(&REAL_DLSYM, c"dlsym", dlsym_missing as *const () as usize)
}

/// Address of glibc's `dlvsym`.
extern "C" fn real_dlvsym_addr() -> usize {
    libc_fn(
        &REAL_DLVSYM,
        c"dlvsym",
        dlvsym_missing as *const () as usize,
    )
}

/// glibc's `dlsym`.
///
/// # Safety
/// `handle` must be a handle from `dlopen` or a pseudo-handle (`RTLD_DEFAULT`, `RTLD_NEXT`).
pub unsafe fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: the address is glibc's dlsym (or dlsym_missing), both with this signature.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(real_dlsym_addr()) };
    // SAFETY: a valid handle (or pseudo-handle) and a NUL-terminated name.
    unsafe { f(handle, name.as_ptr()) }
}

/// The hook for `name` when the shim intercepts it, else null. Called from the trampoline.
extern "C" fn hook_for(_handle: *mut c_void, name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: name is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    super::hooks::by_name(name).unwrap_or(std::ptr::null_mut())
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {hook}",
        "test rax, rax",
        "jnz 2f",
        "call {real}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        "2:",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "ret",
        hook = sym hook_for,
        real = sym real_dlsym_addr,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "stp x0, x1, [sp, #16]",
        "bl {hook}",
        "cbnz x0, 2f",
        "bl {real}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "br x16",
        "2:",
        "ldp x29, x30, [sp], #32",
        "ret",
        hook = sym hook_for,
        real = sym real_dlsym_addr,
    )
}

/// `dlvsym(handle, name, version)`: a hooked name returns the hook whatever the version
/// (libcuda's symbols are unversioned, so any version finds them); otherwise glibc's.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(
    _handle: *mut c_void,
    _name: *const c_char,
    _version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {hook}",
        "test rax, rax",
        "jnz 2f",
        "call {real}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        "2:",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "ret",
        hook = sym hook_for,
        real = sym real_dlvsym_addr,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(
    _handle: *mut c_void,
    _name: *const c_char,
    _version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "bl {hook}",
        "cbnz x0, 2f",
        "bl {real}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "br x16",
        "2:",
        "ldp x29, x30, [sp], #48",
        "ret",
        hook = sym hook_for,
        real = sym real_dlvsym_addr,
    )
}

fn open_lib(cell: &AtomicUsize, env: &str, default: &CStr) -> usize {
    let h = cell.load(Ordering::Acquire);
    if h != 0 {
        return h;
    }
    let path = std::env::var_os(env)
        .and_then(|p| std::ffi::CString::new(p.into_encoded_bytes()).ok())
        .unwrap_or_else(|| default.to_owned());
    // SAFETY: dlopen with a NUL-terminated path.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) } as usize;
    if h == 0 {
        crate::log::debug(&format!("cannot load {}", path.to_string_lossy()));
        return 0;
    }
    cell.store(h, Ordering::Release);
    h
}

/// Address of `name` (NUL-terminated bytes) in the real `libcuda.so.1`, or 0.
pub fn cuda_sym(name: &[u8]) -> usize {
    lib_sym(
        open_lib(&CUDA, "TESSERA_REAL_LIBCUDA", c"libcuda.so.1"),
        name,
    )
}

/// Address of `name` in the real `libnvidia-ml.so.1`, or 0.
pub fn nvml_sym(name: &[u8]) -> usize {
    lib_sym(
        open_lib(&NVML, "TESSERA_REAL_LIBNVML", c"libnvidia-ml.so.1"),
        name,
    )
}

fn lib_sym(handle: usize, name: &[u8]) -> usize {
    if handle == 0 {
        return 0;
    }
    match CStr::from_bytes_with_nul(name) {
        // SAFETY: `handle` came from dlopen.
        Ok(n) => unsafe { real_dlsym(handle as *mut c_void, n) as usize },
        Err(_) => 0,
    }
}

/// Resolve a real driver function once and cache it: `real!(cuda, "cuMemAlloc_v2": Ty)`.
macro_rules! real {
    ($lib:ident, $name:expr => $ty:ty) => {{
        static CELL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut p = CELL.load(std::sync::atomic::Ordering::Relaxed);
        if p == 0 {
            p = $crate::ffi::dl::$lib(concat!($name, "\0").as_bytes());
            CELL.store(p, std::sync::atomic::Ordering::Relaxed);
        }
        if p == 0 {
            None
        } else {
            // SAFETY: the symbol has the C signature `$ty` in the driver's ABI.
            Some(unsafe { std::mem::transmute::<usize, $ty>(p) })
        }
    }};
}
pub(crate) use real;

/// Names the real libcuda function `name` resolves to, for the pointer match in
/// `cuGetProcAddress` (0 when absent).
pub fn cuda_sym_str(name: &str) -> usize {
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    cuda_sym(&v)
}
