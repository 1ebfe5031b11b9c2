//! The FFI boundary: every `extern "C"` function and every `unsafe` block of the crate.
//! Hooks translate C arguments into calls on the safe [`crate::runtime::Shim`] and forward
//! to the real driver; they never panic across the boundary (no unwrap, no indexing that
//! can fail) and return a CUDA error instead.
#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod dl;
mod elf;
pub mod hooks;
mod launch;
mod memory;
mod nvml;
pub mod os;
pub(crate) mod pools;
mod procaddr;
pub mod state;
pub mod types;

use state::Outcome;
use types::*;

/// The shim state, or `None` when the shim refuses CUDA (already logged at init).
#[inline]
fn shim() -> Option<&'static crate::runtime::Shim> {
    match state::get() {
        Outcome::Ready(s) => Some(s),
        Outcome::Refused(_) => None,
    }
}

/// The device of the calling thread's current context.
fn current_device() -> Option<usize> {
    let get =
        dl::real!(cuda_sym, "cuCtxGetDevice" => unsafe extern "C" fn(*mut CUdevice) -> CUresult)?;
    let mut dev: CUdevice = -1;
    // SAFETY: valid out-pointer.
    let rc = unsafe { get(&mut dev) };
    if rc == CUDA_SUCCESS {
        usize::try_from(dev).ok()
    } else {
        None
    }
}
