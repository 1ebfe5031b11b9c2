//! Launch hooks: with no SM limit the only work is one load of the state and a branch;
//! with one, a token is taken (one atomic) and only an overdrawn bucket sleeps.

use std::ffi::c_void;
use std::sync::Arc;

use super::dl::real;
use super::state::{self, Outcome};
use super::types::*;
use super::{current_device, nvml};
use crate::limiter::{self, Throttle};
use crate::runtime::Shim;

fn start_throttle(dev: usize, pct: u8) -> Option<Arc<Throttle>> {
    type Attr = unsafe extern "C" fn(*mut i32, i32, CUdevice) -> CUresult;
    let mut sms: i32 = 0;
    if let Some(f) = real!(cuda_sym, "cuDeviceGetAttribute" => Attr) {
        // SAFETY: valid out-pointer.
        if unsafe {
            f(
                &mut sms,
                CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                dev as CUdevice,
            )
        } != CUDA_SUCCESS
        {
            sms = 0;
        }
    }
    let th = Arc::new(Throttle::new(pct, u32::try_from(sms).unwrap_or(1).max(1)));
    if nvml::utilization(dev).is_none() {
        crate::log::warn(&format!(
            "device {dev}: NVML utilization unavailable; SM limit {pct}% runs without feedback"
        ));
    }
    let watched = Arc::clone(&th);
    let spawned = std::thread::Builder::new()
        .name(format!("tessera-sm{dev}"))
        .spawn(move || limiter::watch(&watched, || nvml::utilization(dev)));
    match spawned {
        Ok(_) => {
            crate::log::info(&format!("device {dev}: SM limit {pct}% on {sms} SMs"));
            Some(th)
        }
        Err(e) => {
            crate::log::error(&format!(
                "device {dev}: cannot start the SM limiter thread: {e}"
            ));
            None
        }
    }
}

#[cold]
fn throttle(s: &Shim, blocks: u64) {
    let Some(dev) = current_device() else {
        return;
    };
    if let Some(th) = s.throttle(dev, |pct| start_throttle(dev, pct)) {
        if th.take(th.cost(blocks)) {
            th.hold(std::thread::sleep);
        }
    }
}

/// Gate a launch: `Some(code)` to return instead of launching.
#[inline(always)]
fn gate(blocks: impl FnOnce() -> u64) -> Option<CUresult> {
    match state::get() {
        Outcome::Ready(s) => {
            if s.any_sm_limit {
                throttle(s, blocks());
            }
            None
        }
        Outcome::Refused(_) => Some(CUDA_ERROR_NOT_PERMITTED),
    }
}

fn blocks(x: u32, y: u32, z: u32) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

type LaunchKernel = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
type LaunchEx = unsafe extern "C" fn(
    *const LaunchConfig,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
type LaunchCoop = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut c_void,
) -> CUresult;
type GraphLaunch = unsafe extern "C" fn(Handle, Handle) -> CUresult;

macro_rules! launch_hooks {
    ($kernel:ident, $ex:ident, $coop:ident, $graph:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $kernel(
            f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
            shmem: u32, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void,
        ) -> CUresult {
            let Some(real) = real!(cuda_sym, stringify!($kernel) => LaunchKernel) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            if let Some(rc) = gate(|| blocks(gx, gy, gz)) {
                return rc;
            }
            real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
        }

        #[no_mangle]
        pub unsafe extern "C" fn $ex(cfg: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult {
            let Some(real) = real!(cuda_sym, stringify!($ex) => LaunchEx) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            let n = || cfg.as_ref().map_or(1, |c| blocks(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z));
            if let Some(rc) = gate(n) {
                return rc;
            }
            real(cfg, f, params, extra)
        }

        #[no_mangle]
        pub unsafe extern "C" fn $coop(
            f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
            shmem: u32, stream: Handle, params: *mut *mut c_void,
        ) -> CUresult {
            let Some(real) = real!(cuda_sym, stringify!($coop) => LaunchCoop) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            if let Some(rc) = gate(|| blocks(gx, gy, gz)) {
                return rc;
            }
            real(f, gx, gy, gz, bx, by, bz, shmem, stream, params)
        }

        #[no_mangle]
        pub unsafe extern "C" fn $graph(exec: Handle, stream: Handle) -> CUresult {
            let Some(real) = real!(cuda_sym, stringify!($graph) => GraphLaunch) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            if let Some(rc) = gate(|| 1) {
                return rc;
            }
            // Graph memory: only executables with allocation nodes reach the lock.
            let tickets = match super::pools::graph_launch_begin(exec) {
                Ok(t) => t,
                Err(rc) => return rc,
            };
            let rc = real(exec, stream);
            super::pools::graph_launch_end(tickets, rc);
            rc
        }
    };
}

launch_hooks!(
    cuLaunchKernel,
    cuLaunchKernelEx,
    cuLaunchCooperativeKernel,
    cuGraphLaunch
);
launch_hooks!(
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel_ptsz,
    cuGraphLaunch_ptsz
);
