//! Health watching: one dedicated thread blocks in `nvmlEventSetWait` for critical XID
//! and double-bit ECC events, forwards them as raw [`HealthEvent`]s, and probes each GPU
//! that reported one until [`RecoveryWatch`] says it has recovered.
//!
//! ```text
//! watch_health ─spawn─▶ thread: register events per GPU ─ready─▶ watch_health returns
//!                         loop until tx closed:
//!                           wait(≤1 s or next probe) ─event─▶ Xid / EccUncorrectable ─▶ tx
//!                                                   └──────▶ RecoveryWatch::fault
//!                           due probes ─▶ probe GPU ─▶ record ─3 clean─▶ Recovered ─▶ tx
//! ```
//!
//! Nothing here decides whether an XID matters; [`crate::gpu::health`] does.

use std::collections::BTreeSet;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use tessera_nvml_raw as raw;

use crate::gpu::{Error, HealthEvent, HealthSender, Result};

use super::nvml_err;
use super::probe::{ProbeConfig, ProbeSample, RecoveryWatch};

/// Longest single wait, so a closed channel is noticed within this time.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// XID NVML reports when it does not know the XID (`XidError::Unknown`).
pub const UNKNOWN_XID: u64 = 999;

/// The events the backend listens for.
fn wanted_events() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR
}

/// A raw signal in one NVML event (before it is tied to a GPU UUID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Xid(u64),
    DoubleBitEcc,
}

/// The signals an event carries (an event may set several type bits).
pub fn signals(types: EventTypes, xid: Option<&XidError>) -> Vec<Signal> {
    let mut out = Vec::new();
    if types.contains(EventTypes::CRITICAL_XID_ERROR) {
        out.push(Signal::Xid(match xid {
            Some(XidError::Value(v)) => *v,
            Some(XidError::Unknown) | None => UNKNOWN_XID,
        }));
    }
    if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        out.push(Signal::DoubleBitEcc);
    }
    out
}

/// Start the health thread; returns once its events are registered.
pub fn spawn(nvml: Arc<Nvml>, tx: HealthSender, config: ProbeConfig) -> Result<()> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<usize>>();
    std::thread::Builder::new()
        .name("nvml-health".into())
        .spawn(move || run(&nvml, &tx, config, ready_tx))
        .map_err(|e| Error::Nvml {
            call: "spawn health thread",
            gpu: "*".into(),
            reason: e.to_string(),
        })?;
    match ready_rx.recv() {
        Ok(Ok(registered)) => {
            tracing::info!(registered, "NVML health events registered");
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Nvml {
            call: "health thread start",
            gpu: "*".into(),
            reason: "the health thread exited before registering events".into(),
        }),
    }
}

/// Register the wanted events on every GPU that supports them. A GPU whose
/// registration fails is skipped with a warning (the set is rebuilt without it, since a
/// failed registration frees the set).
fn register(nvml: &Nvml) -> Result<(Option<EventSet<'_>>, usize)> {
    let count = nvml
        .device_count()
        .map_err(nvml_err("nvmlDeviceGetCount", "*"))?;
    let mut candidates = Vec::new();
    for index in 0..count {
        let dev = nvml
            .device_by_index(index)
            .map_err(nvml_err("nvmlDeviceGetHandleByIndex", index.to_string()))?;
        let uuid = dev.uuid().unwrap_or_else(|_| format!("index {index}"));
        match dev.supported_event_types() {
            Ok(t) if !(t & wanted_events()).is_empty() => {
                candidates.push((index, uuid, t & wanted_events()))
            }
            Ok(_) => tracing::warn!(gpu = %uuid, "GPU supports no XID/ECC events; not watched"),
            Err(e) => {
                tracing::warn!(gpu = %uuid, error = %e, "GPU does not support events; not watched")
            }
        }
    }
    let mut skipped = BTreeSet::new();
    loop {
        let mut set = Some(
            nvml.create_event_set()
                .map_err(nvml_err("nvmlEventSetCreate", "*"))?,
        );
        let mut failed = None;
        let mut registered = 0;
        for (index, uuid, types) in candidates.iter().filter(|c| !skipped.contains(&c.0)) {
            let Some(current) = set.take() else {
                break;
            };
            let dev = nvml
                .device_by_index(*index)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", uuid))?;
            match dev.register_events(*types, current) {
                Ok(current) => set = Some(current),
                Err(e) => {
                    tracing::warn!(gpu = %uuid, error = %e.error, "event registration failed; not watched");
                    failed = Some(*index);
                    break;
                }
            }
            registered += 1;
        }
        match failed {
            Some(index) => {
                skipped.insert(index);
            }
            None if registered == 0 => return Ok((None, 0)),
            None => return Ok((set, registered)),
        }
    }
}

fn run(nvml: &Nvml, tx: &HealthSender, config: ProbeConfig, ready: mpsc::Sender<Result<usize>>) {
    let set = match register(nvml) {
        Ok((set, n)) => {
            if set.is_none() {
                tracing::warn!("no GPU supports XID/ECC events: health watching is off");
            }
            let _ = ready.send(Ok(n));
            set
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut watch = RecoveryWatch::new(config);
    while !tx.is_closed() {
        let now = Instant::now();
        let wait = watch
            .next_deadline()
            .map_or(MAX_WAIT, |d| d.saturating_duration_since(now))
            .min(MAX_WAIT);
        match &set {
            Some(set) => match set.wait(wait.as_millis() as u32) {
                Ok(event) => {
                    for ev in
                        to_health_events(&event.device, event.event_type, event.event_data.as_ref())
                    {
                        watch.fault(ev.gpu_uuid(), Instant::now());
                        if tx.send(ev).is_err() {
                            return;
                        }
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "nvmlEventSetWait failed");
                    std::thread::sleep(MAX_WAIT);
                }
            },
            None => std::thread::sleep(wait),
        }
        let now = Instant::now();
        for gpu in watch.due(now) {
            let sample = probe(nvml, &gpu);
            tracing::debug!(gpu, ?sample, "recovery probe");
            if watch.record(&gpu, sample.is_clean(), now)
                && tx.send(HealthEvent::Recovered { gpu_uuid: gpu }).is_err()
            {
                return;
            }
        }
    }
}

/// UUID of the physical GPU behind `dev` (its parent when `dev` is a MIG device).
fn parent_uuid(dev: &Device<'_>) -> std::result::Result<String, NvmlError> {
    if dev.mig_is_mig_device_handle().unwrap_or(false) {
        return dev.mig_parent_device()?.uuid();
    }
    let uuid = dev.uuid()?;
    if uuid.starts_with("MIG-") {
        return dev.mig_parent_device()?.uuid();
    }
    Ok(uuid)
}

fn to_health_events(
    dev: &Device<'_>,
    types: EventTypes,
    xid: Option<&XidError>,
) -> Vec<HealthEvent> {
    let gpu_uuid = match parent_uuid(dev) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, ?types, "event for a GPU NVML cannot name; dropped");
            return Vec::new();
        }
    };
    signals(types, xid)
        .into_iter()
        .map(|s| match s {
            Signal::Xid(xid) => HealthEvent::Xid {
                gpu_uuid: gpu_uuid.clone(),
                xid,
            },
            Signal::DoubleBitEcc => HealthEvent::EccUncorrectable {
                gpu_uuid: gpu_uuid.clone(),
                count: dev
                    .nvml()
                    .device_by_uuid(gpu_uuid.as_str())
                    .and_then(|gpu| {
                        gpu.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    })
                    .unwrap_or(1)
                    .max(1),
            },
        })
        .collect()
}

/// `Some(true)` (not clean) for any failure other than "not supported here".
fn check(result: std::result::Result<bool, NvmlError>) -> Option<bool> {
    match result {
        Ok(b) => Some(b),
        Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => None,
        Err(_) => Some(true),
    }
}

/// One recovery probe of `gpu_uuid`.
pub fn probe(nvml: &Nvml, gpu_uuid: &str) -> ProbeSample {
    let Ok(dev) = nvml.device_by_uuid(gpu_uuid) else {
        return ProbeSample::unreachable();
    };
    let (remap_pending, remap_failed) = match raw::remapped_rows(&dev) {
        Ok(r) => (Some(r.pending), Some(r.failure)),
        Err(e) => {
            let c = check(Err(e));
            (c, c)
        }
    };
    ProbeSample {
        reachable: true,
        memory_ok: dev.memory_info().is_ok(),
        retirement_pending: check(dev.are_pages_pending_retired()),
        remap_pending,
        remap_failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_translate_to_raw_signals() {
        let xid = EventTypes::CRITICAL_XID_ERROR;
        let dbe = EventTypes::DOUBLE_BIT_ECC_ERROR;
        let cases: Vec<(EventTypes, Option<XidError>, Vec<Signal>)> = vec![
            (xid, Some(XidError::Value(79)), vec![Signal::Xid(79)]),
            (xid, Some(XidError::Value(13)), vec![Signal::Xid(13)]),
            (xid, Some(XidError::Unknown), vec![Signal::Xid(UNKNOWN_XID)]),
            (dbe, None, vec![Signal::DoubleBitEcc]),
            (
                xid | dbe,
                Some(XidError::Value(48)),
                vec![Signal::Xid(48), Signal::DoubleBitEcc],
            ),
            (EventTypes::PSTATE_CHANGE, None, vec![]),
            (EventTypes::SINGLE_BIT_ECC_ERROR, None, vec![]),
        ];
        for (types, data, want) in cases {
            assert_eq!(signals(types, data.as_ref()), want, "{types:?}");
        }
    }

    #[test]
    fn unsupported_checks_do_not_block_recovery_but_failures_do() {
        assert_eq!(check(Ok(false)), Some(false));
        assert_eq!(check(Ok(true)), Some(true));
        assert_eq!(check(Err(NvmlError::NotSupported)), None);
        assert_eq!(check(Err(NvmlError::GpuLost)), Some(true));
    }
}
