//! Hooks for memory the driver keeps after a free: stream-ordered pool management
//! (`cuMemPoolTrimTo`, `cuMemPoolSetAttribute`, `cuMemPoolDestroy`), the synchronisation
//! points where pools release memory, and graph memory (allocation nodes, instantiation,
//! `cuDeviceGraphMemTrim`, `cuDeviceGetGraphMemAttribute`). The accounting itself is
//! [`crate::account::reservoirs`]; graph launches are in [`super::launch`].

use std::ffi::c_void;

use super::dl::real;
use super::memory::refuse;
use super::shim;
use super::types::*;
use crate::account::graph_walk::{self, GraphView, WalkError};
use crate::account::reservoirs::Key;
use crate::account::Refusal;

/// What the driver says reservoir `key` holds (`RESERVED_MEM_CURRENT`).
pub fn reserved(key: Key) -> Option<u64> {
    let mut v: u64 = 0;
    let rc = match key {
        Key::Pool(h) => {
            type F = unsafe extern "C" fn(Handle, i32, *mut c_void) -> CUresult;
            let f = real!(cuda_sym, "cuMemPoolGetAttribute" => F)?;
            // SAFETY: the attribute's value is a cuuint64_t.
            unsafe {
                f(
                    h as Handle,
                    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                    (&mut v as *mut u64).cast(),
                )
            }
        }
        Key::Graph(dev) => {
            type F = unsafe extern "C" fn(CUdevice, i32, *mut c_void) -> CUresult;
            let f = real!(cuda_sym, "cuDeviceGetGraphMemAttribute" => F)?;
            // SAFETY: the attribute's value is a cuuint64_t.
            unsafe {
                f(
                    CUdevice::try_from(dev).ok()?,
                    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                    (&mut v as *mut u64).cast(),
                )
            }
        }
    };
    (rc == CUDA_SUCCESS).then_some(v)
}

/// The device's current stream-ordered pool (what `cuMemAllocAsync` allocates from).
pub fn current_pool(dev: usize) -> Option<u64> {
    type F = unsafe extern "C" fn(*mut Handle, CUdevice) -> CUresult;
    let f = real!(cuda_sym, "cuDeviceGetMemPool" => F)?;
    let mut p: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { f(&mut p, CUdevice::try_from(dev).ok()?) };
    (rc == CUDA_SUCCESS && !p.is_null()).then_some(p as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Handle,
    props: *const MemPoolProps,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut Handle, *const MemPoolProps) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemPoolCreate" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(pool, props);
    if rc == CUDA_SUCCESS {
        if let (Some(s), Some(p), Some(h)) = (shim(), props.as_ref(), pool.as_ref()) {
            let dev = (p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE)
                .then(|| usize::try_from(p.location.id).ok())
                .flatten();
            s.ledger.pool_created(*h as u64, dev);
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Handle, keep: usize) -> CUresult {
    type F = unsafe extern "C" fn(Handle, usize) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemPoolTrimTo" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(pool, keep);
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            s.ledger.resync_reservoir(Key::Pool(pool as u64));
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Handle,
    attr: i32,
    value: *mut c_void,
) -> CUresult {
    type F = unsafe extern "C" fn(Handle, i32, *mut c_void) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemPoolSetAttribute" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(pool, attr, value);
    if rc == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && !value.is_null() {
        if let Some(s) = shim() {
            // SAFETY: the release threshold is a cuuint64_t the driver just read.
            s.ledger.pool_threshold(pool as u64, *value.cast::<u64>());
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    type F = unsafe extern "C" fn(Handle) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuMemPoolDestroy" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(pool);
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            s.ledger.pool_destroyed(pool as u64);
        }
    }
    rc
}

/// After a synchronisation: pools holding more than their release threshold may have
/// given memory back; ask the driver (one atomic load when nothing is pending).
fn synced(rc: CUresult) -> CUresult {
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            if s.ledger.release_pending() {
                s.ledger.resync_reservoirs(true);
            }
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuStreamSynchronize" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    synced(real(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: Handle) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuStreamSynchronize_ptsz" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    synced(real(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let Some(real) = real!(cuda_sym, "cuCtxSynchronize" => unsafe extern "C" fn() -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    synced(real())
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuEventSynchronize" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    synced(real(event))
}

/// A graph allocation node whose size alone is past the device's limit can never run:
/// refused when it is added. Everything else is counted when the graph is launched.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    type F = unsafe extern "C" fn(
        *mut Handle,
        Handle,
        *const Handle,
        usize,
        *mut MemAllocNodeParams,
    ) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuGraphAddMemAllocNode" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let Some(s) = shim() else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if let Some(p) = params.as_ref() {
        if let Some((dev, bytes)) = node_need(s, p) {
            if let Some(limit) = s.ledger.limit(dev).filter(|l| bytes > *l) {
                let r = Refusal::OverLimit {
                    dev,
                    want: bytes,
                    used: s.ledger.used(dev),
                    limit,
                };
                return refuse("cuGraphAddMemAllocNode", &r);
            }
        }
    }
    real(node, graph, deps, ndeps, params)
}

/// (device, bytes at its granularity) an allocation node needs.
fn node_need(s: &crate::runtime::Shim, p: &MemAllocNodeParams) -> Option<(usize, u64)> {
    let loc = &p.pool_props.location;
    if loc.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return None;
    }
    let dev = usize::try_from(loc.id).ok()?;
    super::memory::ensure_granularity(s, dev);
    Some((dev, s.ledger.round(dev, p.bytesize as u64)))
}

type GetNodes = unsafe extern "C" fn(Handle, *mut Handle, *mut usize) -> CUresult;
type NodeGetType = unsafe extern "C" fn(Handle, *mut i32) -> CUresult;
type AllocNodeParams = unsafe extern "C" fn(Handle, *mut MemAllocNodeParams) -> CUresult;
type ChildGraph = unsafe extern "C" fn(Handle, *mut Handle) -> CUresult;

/// Graph introspection through the real driver, for [`graph_walk`].
struct DriverGraphs<'a> {
    shim: &'a crate::runtime::Shim,
    nodes: GetNodes,
    kind: NodeGetType,
    params: AllocNodeParams,
    child: Option<ChildGraph>,
}

impl GraphView for DriverGraphs<'_> {
    type Graph = Handle;
    type Node = Handle;

    fn nodes(&self, graph: Handle) -> Option<Vec<Handle>> {
        let mut n: usize = 0;
        // SAFETY: a graph handle the application passed to the driver; valid out-pointers
        // and a list of the length the driver was told.
        unsafe {
            if (self.nodes)(graph, std::ptr::null_mut(), &mut n) != CUDA_SUCCESS {
                return None;
            }
            let mut list: Vec<Handle> = vec![std::ptr::null_mut(); n];
            if n > 0 && (self.nodes)(graph, list.as_mut_ptr(), &mut n) != CUDA_SUCCESS {
                return None;
            }
            list.truncate(n);
            Some(list)
        }
    }

    fn kind(&self, node: Handle) -> Option<i32> {
        let mut t: i32 = -1;
        // SAFETY: a node the driver listed; valid out-pointer.
        (unsafe { (self.kind)(node, &mut t) } == CUDA_SUCCESS).then_some(t)
    }

    fn child(&self, node: Handle) -> Option<Handle> {
        let mut g: Handle = std::ptr::null_mut();
        // SAFETY: a child graph node the driver listed; valid out-pointer.
        let rc = unsafe { (self.child?)(node, &mut g) };
        (rc == CUDA_SUCCESS && !g.is_null()).then_some(g)
    }

    fn alloc(&self, node: Handle) -> Option<Option<(usize, u64)>> {
        // SAFETY: plain C struct; zero is a valid bit pattern for every field; an
        // allocation node the driver listed.
        let mut p: MemAllocNodeParams = unsafe { std::mem::zeroed() };
        if unsafe { (self.params)(node, &mut p) } != CUDA_SUCCESS {
            return None;
        }
        Some(node_need(self.shim, &p))
    }
}

/// What one launch of `graph`'s allocation nodes needs, per device (child graphs
/// included; see [`graph_walk`]).
fn graph_needs(s: &crate::runtime::Shim, graph: Handle) -> Result<Vec<(usize, u64)>, WalkError> {
    let (Some(nodes), Some(kind), Some(params)) = (
        real!(cuda_sym, "cuGraphGetNodes" => GetNodes),
        real!(cuda_sym, "cuGraphNodeGetType" => NodeGetType),
        real!(cuda_sym, "cuGraphMemAllocNodeGetParams" => AllocNodeParams),
    ) else {
        // A driver without graph introspection has no graph memory nodes either.
        return Ok(Vec::new());
    };
    let view = DriverGraphs {
        shim: s,
        nodes,
        kind,
        params,
        // Resolved here, used only if a child graph node turns up: a driver without it
        // then fails the walk (refused), never skips the child.
        child: real!(cuda_sym, "cuGraphChildGraphNodeGetGraph" => ChildGraph),
    };
    graph_walk::launch_needs(&view, graph)
}

/// After a successful instantiation: record what `exec` allocates per launch; an
/// executable that can never fit is destroyed again and refused.
unsafe fn instantiated(what: &str, exec: *mut Handle, graph: Handle, rc: CUresult) -> CUresult {
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let (Some(s), Some(e)) = (shim(), exec.as_ref().copied()) else {
        return rc;
    };
    if (0..crate::config::MAX_DEVICES).all(|d| s.ledger.limit(d).is_none()) {
        return rc;
    }
    let verdict = match graph_needs(s, graph) {
        Ok(needs) => s
            .ledger
            .graph_instantiated(e as u64, &needs)
            .map_err(|r| refuse(what, &r)),
        Err(e) => {
            crate::log::error(&format!(
                "{what}: cannot count the graph's memory allocation nodes ({e}); refused \
                 so that the memory limit holds"
            ));
            Err(CUDA_ERROR_NOT_PERMITTED)
        }
    };
    match verdict {
        Ok(()) => rc,
        Err(code) => {
            type F = unsafe extern "C" fn(Handle) -> CUresult;
            if let Some(destroy) = real!(cuda_sym, "cuGraphExecDestroy" => F) {
                destroy(e);
            }
            *exec = std::ptr::null_mut();
            code
        }
    }
}

type Instantiate5 =
    unsafe extern "C" fn(*mut Handle, Handle, *mut Handle, *mut i8, usize) -> CUresult;

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut Handle,
    graph: Handle,
    err_node: *mut Handle,
    log: *mut i8,
    log_size: usize,
) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuGraphInstantiate" => Instantiate5) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(exec, graph, err_node, log, log_size);
    instantiated("cuGraphInstantiate", exec, graph, rc)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Handle,
    graph: Handle,
    err_node: *mut Handle,
    log: *mut i8,
    log_size: usize,
) -> CUresult {
    let Some(real) = real!(cuda_sym, "cuGraphInstantiate_v2" => Instantiate5) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(exec, graph, err_node, log, log_size);
    instantiated("cuGraphInstantiate_v2", exec, graph, rc)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    flags: u64,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut Handle, Handle, u64) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuGraphInstantiateWithFlags" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(exec, graph, flags);
    instantiated("cuGraphInstantiateWithFlags", exec, graph, rc)
}

macro_rules! instantiate_with_params {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(exec: *mut Handle, graph: Handle, params: *mut c_void) -> CUresult {
            type F = unsafe extern "C" fn(*mut Handle, Handle, *mut c_void) -> CUresult;
            let Some(real) = real!(cuda_sym, stringify!($name) => F) else {
                return CUDA_ERROR_NOT_FOUND;
            };
            let rc = real(exec, graph, params);
            instantiated(stringify!($name), exec, graph, rc)
        }
    };
}
instantiate_with_params!(cuGraphInstantiateWithParams);
instantiate_with_params!(cuGraphInstantiateWithParams_ptsz);

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuGraphExecDestroy" => unsafe extern "C" fn(Handle) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(exec);
    if rc == CUDA_SUCCESS {
        if let Some(s) = shim() {
            s.ledger.graph_exec_destroyed(exec as u64);
        }
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    let Some(real) =
        real!(cuda_sym, "cuDeviceGraphMemTrim" => unsafe extern "C" fn(CUdevice) -> CUresult)
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(dev);
    if rc == CUDA_SUCCESS {
        if let (Some(s), Ok(d)) = (shim(), usize::try_from(dev)) {
            s.ledger.resync_reservoir(Key::Graph(d));
        }
    }
    rc
}

/// Reports the driver's values unchanged; a reading of the reserved size also brings the
/// shim's charge for the graph pool in line with it.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: i32,
    value: *mut c_void,
) -> CUresult {
    type F = unsafe extern "C" fn(CUdevice, i32, *mut c_void) -> CUresult;
    let Some(real) = real!(cuda_sym, "cuDeviceGetGraphMemAttribute" => F) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let rc = real(dev, attr, value);
    if rc == CUDA_SUCCESS && attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT {
        if let (Some(s), Ok(d)) = (shim(), usize::try_from(dev)) {
            s.ledger.resync_reservoir(Key::Graph(d));
        }
    }
    rc
}

/// Graph launch: charge the growth of the graph pools (see [`super::launch`]).
pub fn graph_launch_begin(
    exec: Handle,
) -> Result<Vec<crate::account::reservoirs::Ticket>, CUresult> {
    let Some(s) = shim() else {
        return Ok(Vec::new());
    };
    s.ledger
        .graph_launch_begin(exec as u64)
        .map_err(|r| refuse("cuGraphLaunch", &r))
}

pub fn graph_launch_end(t: Vec<crate::account::reservoirs::Ticket>, rc: CUresult) {
    if t.is_empty() {
        return;
    }
    if let Some(s) = shim() {
        s.ledger.graph_launch_end(t, rc == CUDA_SUCCESS);
    }
}
