//! What the DRA driver owns right now, as NodePrepareResources checks it: the GPUs the
//! node agent's split gives the driver ([`crate::agent::ownership`]) and the devices the
//! driver publishes in its ResourceSlices. A claim allocated on a device outside both is
//! refused before anything is written (the scheduler allocated from slices that are out of
//! date: a GPU a reload moved to the device plugin, a MIG placement of a layout that
//! changed, a device name this driver never published); preparing it would give one GPU
//! to two pods, one through each kubelet path.
//!
//! ```text
//! agent reload ─▶ decide split ─▶ try_set_split ──(a leaving GPU has a claim in flight,
//!                                   │              or one prepared meanwhile)──▶ re-decide
//!                                   ▼
//!                                 split in force ─▶ build, advertise, DraView
//! DraView ─▶ slices ─▶ publish(device names)
//! prepare(claim) ─▶ admit(devices): every device published and on a DRA GPU?
//!                     ├ no  ─▶ per-claim error, nothing created, checkpoint unchanged
//!                     └ yes ─▶ in flight (holds its GPUs) ─▶ Started … Completed ─▶ released
//! ```
//!
//! The race the other way: from [`OwnedDevices::admit`] until the prepare has written its
//! checkpoint record (where [`crate::agent::usage`] sees it), the claim is *in flight* and
//! holds its GPUs; [`OwnedDevices::try_set_split`] refuses to take a GPU from the driver
//! while a claim on it is in flight, and, under the same lock, asks the caller who holds
//! the leaving GPUs now (the checkpoint, re-read), so a prepare that finished between the
//! agent's first look and the split is seen too.
//!
//! Until the agent applied a first config nothing is owned, and until the first slices are
//! built nothing is published: new claims are refused (the kubelet retries).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::names::{mig_name, parse_device_name, vgpu_name, whole_name, DeviceKind, DRIVER};
use crate::gpu::Inventory;
use crate::partition::catalog;

/// Why a device of a claim is not prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("device {device}: the DRA driver owns no GPU yet (no node config applied); not prepared, retry later")]
    NoSplit { device: String },
    #[error(
        "device {device}: the DRA driver has not published its devices yet; not prepared, \
         retry later"
    )]
    NothingPublished { device: String },
    #[error(
        "device {device}: {uuid} (GPU {index}) is served by the device-plugin path since \
         {since}; the DRA driver no longer owns it, so the claim is not prepared (the GPU \
         would be handed out by both paths)"
    )]
    DevicePlugin {
        device: String,
        uuid: String,
        index: u32,
        since: String,
    },
    #[error("device {device} is not published by this node ({why}); not prepared")]
    NotPublished { device: String, why: String },
}

/// One GPU's path in the agent's split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSplit {
    pub index: u32,
    pub uuid: String,
    /// Owned by the DRA driver (else by the device plugin).
    pub dra: bool,
}

/// A GPU of the split in force.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Gpu {
    uuid: String,
    dra: bool,
    /// For a device-plugin GPU: since when (the cause of the split that gave it away).
    since: String,
}

#[derive(Debug, Default)]
struct State {
    /// By GPU index; `None` until the agent applied a config.
    split: Option<BTreeMap<u32, Gpu>>,
    /// Device names in the driver's slices; `None` until the first slices were built.
    published: Option<BTreeSet<String>>,
    /// Prepares between their admission and their checkpoint record, by ticket.
    in_flight: BTreeMap<u64, InFlight>,
    next_ticket: u64,
}

#[derive(Debug)]
struct InFlight {
    who: String,
    gpus: BTreeSet<String>,
}

/// The DRA driver's GPUs and published devices, shared by the agent (which sets the
/// split), the publisher (which sets the devices) and the preparer (which admits claims).
/// Cheap to clone; clones share the state.
#[derive(Debug, Clone, Default)]
pub struct OwnedDevices {
    state: Arc<Mutex<State>>,
}

impl OwnedDevices {
    /// Nothing owned, nothing published: every new claim is refused until the agent sets
    /// a split and the publisher the devices.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every GPU of `inventory` owned, and every device the driver can publish for them
    /// in any mode (whole, vGPU, every MIG placement of the model) published: for a
    /// preparer run on its own, without an agent deciding a split.
    pub fn every_device_of(inventory: &Inventory) -> Self {
        let me = Self::new();
        let split: Vec<GpuSplit> = inventory
            .gpus
            .iter()
            .map(|g| GpuSplit {
                index: g.index,
                uuid: g.uuid.clone(),
                dra: true,
            })
            .collect();
        me.set_split(&split, "the start");
        let mut names = Vec::new();
        for g in &inventory.gpus {
            names.push(whole_name(g.index));
            names.push(vgpu_name(g.index));
            if let Some(model) = catalog::lookup(&g.product_name, g.memory_mib) {
                for p in model.profiles {
                    for &start in p.placements {
                        names.push(mig_name(g.index, p.name, start));
                    }
                }
            }
        }
        me.publish(names);
        me
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Put `gpus` in force, whatever is in flight (at start, or to restore a split).
    /// `cause` says when and why (`the config reload at … (config "x")`); a GPU that
    /// stays with the device plugin keeps the cause it had.
    pub fn set_split(&self, gpus: &[GpuSplit], cause: &str) {
        let mut state = self.lock();
        let next = merged(state.split.as_ref(), gpus, cause);
        state.split = Some(next);
    }

    /// Put `gpus` in force unless a GPU it takes from the driver is in use: by a claim in
    /// flight, or by a holder `in_use` names (GPU UUID → holders; called under the lock,
    /// only when some GPU leaves the driver: re-read the checkpoint there). On refusal
    /// nothing changes and the holders of the leaving GPUs are returned (GPU UUID →
    /// holders), for the caller to pin them and decide again. On success, the split it
    /// replaced (for [`Self::restore`] if applying the new one fails).
    pub fn try_set_split(
        &self,
        gpus: &[GpuSplit],
        cause: &str,
        in_use: impl FnOnce() -> BTreeMap<String, Vec<String>>,
    ) -> Result<SplitBefore, BTreeMap<String, Vec<String>>> {
        let mut state = self.lock();
        let leaving = leaving(state.split.as_ref(), gpus);
        if !leaving.is_empty() {
            let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for f in state.in_flight.values() {
                for uuid in f.gpus.intersection(&leaving) {
                    push_unique(held.entry(uuid.clone()).or_default(), &f.who);
                }
            }
            for (uuid, who) in in_use() {
                if leaving.contains(&uuid) {
                    let list = held.entry(uuid).or_default();
                    for w in &who {
                        push_unique(list, w);
                    }
                }
            }
            if !held.is_empty() {
                return Err(held);
            }
        }
        let next = merged(state.split.as_ref(), gpus, cause);
        Ok(SplitBefore(state.split.replace(next)))
    }

    /// Put back the split [`Self::try_set_split`] replaced (giving GPUs back to the
    /// driver never races a prepare).
    pub fn restore(&self, before: SplitBefore) {
        self.lock().split = before.0;
    }

    /// The device names the driver publishes now (before health withholds any: a claim
    /// allocated before its GPU turned unhealthy is still prepared).
    pub fn publish(&self, devices: impl IntoIterator<Item = String>) {
        self.lock().published = Some(devices.into_iter().collect());
    }

    /// GPU UUID → the claims in flight on it (`claim ns/name (uid …, preparing)`).
    pub fn in_flight(&self) -> BTreeMap<String, Vec<String>> {
        let state = self.lock();
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for f in state.in_flight.values() {
            for uuid in &f.gpus {
                push_unique(out.entry(uuid.clone()).or_default(), &f.who);
            }
        }
        out
    }

    /// Check every device of a claim (`who` names it for the holders list) and, if all
    /// are owned and published, hold their GPUs until the returned [`Admission`] is
    /// dropped. Devices of other drivers or pools are not passed here.
    pub fn admit(&self, who: &str, devices: &[String]) -> Result<Admission, Refused> {
        let mut state = self.lock();
        let mut gpus = BTreeSet::new();
        for d in devices {
            gpus.insert(check(&state, d)?);
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.in_flight.insert(
            ticket,
            InFlight {
                who: who.to_string(),
                gpus,
            },
        );
        Ok(Admission {
            owned: self.clone(),
            ticket,
        })
    }
}

/// The split in force before [`OwnedDevices::try_set_split`] changed it.
#[derive(Debug)]
pub struct SplitBefore(Option<BTreeMap<u32, Gpu>>);

/// A claim admitted by [`OwnedDevices::admit`]: its GPUs count as in use until this is
/// dropped (after the prepare's checkpoint record is written, or its failure).
#[derive(Debug)]
#[must_use = "the claim's GPUs are held only while the admission lives"]
pub struct Admission {
    owned: OwnedDevices,
    ticket: u64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.owned.lock().in_flight.remove(&self.ticket);
    }
}

/// The GPU UUID of `device` if the driver owns its GPU and publishes it.
fn check(state: &State, device: &str) -> Result<String, Refused> {
    let not_published = |why: String| Refused::NotPublished {
        device: device.to_string(),
        why,
    };
    let split = state.split.as_ref().ok_or_else(|| Refused::NoSplit {
        device: device.to_string(),
    })?;
    let index = match parse_device_name(device) {
        Some(
            DeviceKind::Whole { gpu } | DeviceKind::Mig { gpu, .. } | DeviceKind::Vgpu { gpu },
        ) => gpu,
        None => return Err(not_published(format!("not a device name of {DRIVER}"))),
    };
    let gpu = split
        .get(&index)
        .ok_or_else(|| not_published(format!("this node has no GPU {index}")))?;
    if !gpu.dra {
        return Err(Refused::DevicePlugin {
            device: device.to_string(),
            uuid: gpu.uuid.clone(),
            index,
            since: gpu.since.clone(),
        });
    }
    let published = state
        .published
        .as_ref()
        .ok_or_else(|| Refused::NothingPublished {
            device: device.to_string(),
        })?;
    if !published.contains(device) {
        return Err(not_published(format!(
            "GPU {index} ({}) has no such device in its current layout",
            gpu.uuid
        )));
    }
    Ok(gpu.uuid.clone())
}

/// UUIDs of the GPUs `current` gives the driver and `next` does not.
fn leaving(current: Option<&BTreeMap<u32, Gpu>>, next: &[GpuSplit]) -> BTreeSet<String> {
    let keeps: BTreeSet<&str> = next
        .iter()
        .filter(|g| g.dra)
        .map(|g| g.uuid.as_str())
        .collect();
    current
        .into_iter()
        .flat_map(|m| m.values())
        .filter(|g| g.dra && !keeps.contains(g.uuid.as_str()))
        .map(|g| g.uuid.clone())
        .collect()
}

/// The split `next` with each device-plugin GPU's cause: kept from `current` when it was
/// there already on the device plugin, else `cause`.
fn merged(
    current: Option<&BTreeMap<u32, Gpu>>,
    next: &[GpuSplit],
    cause: &str,
) -> BTreeMap<u32, Gpu> {
    next.iter()
        .map(|g| {
            let since = current
                .and_then(|m| m.get(&g.index))
                .filter(|old| !old.dra && old.uuid == g.uuid && !g.dra)
                .map(|old| old.since.clone())
                .unwrap_or_else(|| cause.to_string());
            (
                g.index,
                Gpu {
                    uuid: g.uuid.clone(),
                    dra: g.dra,
                    since,
                },
            )
        })
        .collect()
}

fn push_unique(list: &mut Vec<String>, who: &str) {
    if !list.iter().any(|w| w == who) {
        list.push(who.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPUs 0..n with UUIDs `GPU-<i>`; `dra` lists the DRA ones.
    fn split(n: u32, dra: &[u32]) -> Vec<GpuSplit> {
        (0..n)
            .map(|i| GpuSplit {
                index: i,
                uuid: format!("GPU-{i}"),
                dra: dra.contains(&i),
            })
            .collect()
    }

    fn owned(dra: &[u32], published: &[&str]) -> OwnedDevices {
        let o = OwnedDevices::new();
        o.set_split(&split(4, dra), "the agent's start (config \"a\")");
        o.publish(published.iter().map(|s| s.to_string()));
        o
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn devices_are_checked_against_split_and_slices() {
        let o = owned(&[0, 1], &["gpu-0", "gpu-1-mig-1g-10gb-0", "gpu-2"]);
        // (device, Ok(GPU) or a fragment of the error)
        let table: &[(&str, Result<&str, &str>)] = &[
            ("gpu-0", Ok("GPU-0")),
            ("gpu-1-mig-1g-10gb-0", Ok("GPU-1")),
            (
                "gpu-2",
                Err("GPU-2 (GPU 2) is served by the device-plugin path since the agent's start (config \"a\")"),
            ),
            ("gpu-3-vgpu", Err("GPU-3 (GPU 3) is served by the device-plugin path")),
            (
                "gpu-1-mig-1g-10gb-1",
                Err("device gpu-1-mig-1g-10gb-1 is not published by this node (GPU 1 (GPU-1) has no such device in its current layout)"),
            ),
            (
                "gpu-0-mig-1g.10gb-0",
                Err("device gpu-0-mig-1g.10gb-0 is not published by this node"),
            ),
            ("gpu-9", Err("not published by this node (this node has no GPU 9)")),
            ("nic-0", Err("not a device name of gpu.tessera.io")),
        ];
        for (device, want) in table {
            let got = check(&o.lock(), device);
            match (want, &got) {
                (Ok(uuid), Ok(g)) => assert_eq!(g, uuid, "{device}"),
                (Err(frag), Err(e)) => assert!(e.to_string().contains(frag), "{device}: {e}"),
                _ => panic!("{device}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn nothing_is_admitted_before_a_split_and_slices() {
        let o = OwnedDevices::new();
        let e = o.admit("c", &names(&["gpu-0"])).unwrap_err();
        assert!(matches!(e, Refused::NoSplit { .. }), "{e}");
        o.set_split(&split(1, &[0]), "x");
        let e = o.admit("c", &names(&["gpu-0"])).unwrap_err();
        assert!(matches!(e, Refused::NothingPublished { .. }), "{e}");
        o.publish(names(&["gpu-0"]));
        assert!(o.admit("c", &names(&["gpu-0"])).is_ok());
    }

    #[test]
    fn a_refused_device_refuses_the_whole_claim_and_holds_nothing() {
        let o = owned(&[0], &["gpu-0"]);
        assert!(o.admit("c", &names(&["gpu-0", "gpu-1"])).is_err());
        assert!(o.in_flight().is_empty());
    }

    #[test]
    fn the_cause_is_kept_while_a_gpu_stays_with_the_device_plugin() {
        let o = owned(&[0, 1], &["gpu-0", "gpu-1"]);
        o.set_split(&split(4, &[0]), "the config reload at T1 (config \"b\")");
        o.set_split(&split(4, &[0]), "the config reload at T2 (config \"c\")");
        let e = o.admit("c", &names(&["gpu-1"])).unwrap_err().to_string();
        assert!(
            e.contains("since the config reload at T1 (config \"b\")"),
            "{e}"
        );
        // GPU 2 never was the driver's: since the start.
        let e = o.admit("c", &names(&["gpu-2"])).unwrap_err().to_string();
        assert!(e.contains("since the agent's start"), "{e}");
    }

    #[test]
    fn a_claim_in_flight_keeps_its_gpu_until_released() {
        let o = owned(&[0, 1], &["gpu-0", "gpu-1"]);
        let admitted = o
            .admit("claim ml/a (uid u, preparing)", &names(&["gpu-1"]))
            .unwrap();
        assert_eq!(
            o.in_flight(),
            BTreeMap::from([(
                "GPU-1".to_string(),
                names(&["claim ml/a (uid u, preparing)"])
            )])
        );
        // Taking GPU 1 from the driver is refused, naming the claim; nothing changes.
        let held = o
            .try_set_split(&split(4, &[0]), "r1", BTreeMap::new)
            .unwrap_err();
        assert_eq!(held.keys().collect::<Vec<_>>(), vec!["GPU-1"]);
        assert!(o.admit("b", &names(&["gpu-1"])).is_ok(), "split unchanged");
        // Taking GPU 0 only is fine; giving the driver more GPUs never waits.
        o.try_set_split(&split(4, &[1, 2]), "r2", BTreeMap::new)
            .unwrap();
        drop(admitted);
        assert!(o.in_flight().is_empty());
        let before = o
            .try_set_split(&split(4, &[2]), "r3", BTreeMap::new)
            .unwrap();
        let e = o.admit("c", &names(&["gpu-1"])).unwrap_err().to_string();
        assert!(
            e.contains("GPU-1 (GPU 1) is served by the device-plugin path since r3"),
            "{e}"
        );
        // Applying that split failed: the one before is back.
        o.restore(before);
        assert!(o.admit("c", &names(&["gpu-1"])).is_ok());
    }

    #[test]
    fn holders_read_under_the_lock_also_refuse_and_only_for_leaving_gpus() {
        let o = owned(&[0, 1], &["gpu-0", "gpu-1"]);
        let in_use = || {
            BTreeMap::from([
                ("GPU-0".to_string(), names(&["claim ml/x (uid x)"])),
                ("GPU-1".to_string(), names(&["claim ml/y (uid y)"])),
            ])
        };
        let held = o.try_set_split(&split(4, &[1]), "r", in_use).unwrap_err();
        assert_eq!(
            held,
            BTreeMap::from([("GPU-0".to_string(), names(&["claim ml/x (uid x)"]))])
        );
        // Nothing leaves: the holders are not even asked.
        o.try_set_split(&split(4, &[0, 1, 3]), "r", || panic!("not asked"))
            .unwrap();
    }

    #[test]
    fn every_device_of_an_inventory_is_published() {
        let inv = crate::gpu::fake::FakeBackend::from_spec("2xA100-80GB")
            .and_then(|b| crate::gpu::GpuBackend::inventory(&b))
            .unwrap();
        let o = OwnedDevices::every_device_of(&inv);
        for d in [
            "gpu-0",
            "gpu-1-vgpu",
            "gpu-0-mig-3g-40gb-4",
            "gpu-1-mig-1g-10gb-6",
        ] {
            assert!(o.admit("c", &names(&[d])).is_ok(), "{d}");
        }
        assert!(o.admit("c", &names(&["gpu-0-mig-3g-40gb-1"])).is_err());
        assert!(o.admit("c", &names(&["gpu-2"])).is_err());
    }
}
