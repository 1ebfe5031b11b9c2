//! Moving a GPU off the DRA driver in two phases, so that a claim the scheduler allocates
//! on it in the moment before the slices without it reach the scheduler is served, not
//! stranded on a device that is gone.
//!
//! ```text
//! reload: the split gives GPU g to the device plugin
//!   phase 1  split in force (NodePrepareResources refuses new claims on g)
//!            slices without g published; the device plugin does NOT list g yet and
//!            applies no MIG layout to it: no path advertises g
//!   phase 2  the API server's slices name no device of g (for `move_settle`)
//!            ─▶ one LIST of ResourceClaims allocated on this node
//!               ├ none on g ─▶ g goes to the device plugin (the move is done)
//!               └ claim c on g ─▶ roll back: g is the DRA driver's again (republished,
//!                                 prepare admits c), GpuMoveBlocked names c; g moves
//!                                 once c is gone, like any blocked move
//! ```
//!
//! The LIST of phase 2 sees every claim allocated from the old slices: the scheduler only
//! allocates from slices it has seen, and the old ones are gone from the API server before
//! the LIST starts (a scheduler whose watch lags more than `move_settle` behind the API
//! server is the one window left). When the last GPU leaves a driver in `--dra=auto`, the
//! driver keeps serving through phase 2 and withdraws from the kubelet only after it.
//!
//! At start the agent reads the split an earlier run recorded
//! ([`super::split_record`]); without a readable record it infers what survives of it
//! ([`inherited`]): the GPUs this node's stored slices name and the GPUs
//! claims of this node's pool are allocated on (the DRA checkpoint's claims already hold
//! their GPUs). A GPU among them that the config now gives to the device plugin moves in
//! the same two phases (or stays with the driver while a claim holds it). When the API
//! server cannot say (a LIST fails), every GPU the config gives to the device plugin is
//! treated as possibly the driver's: it waits in phase 2, on neither path, until the API
//! server answers.
//!
//! Phase 2 follows the API server's slices with a WATCH ([`follow_slices`], running while
//! a move is pending): each change of this node's slices makes the agent look again; a
//! slow poll ([`MOVE_POLL`]) covers a watch that is down, and a timer the end of
//! `move_settle`.
//!
//! Phase 2 can wait for long: a publisher that cannot write leaves the old slices in
//! place, a LIST fails. [`Stall`] says when to warn (after `move_stall_warn`, then at most
//! once per that interval); the agent logs the GPU and the reason, records one
//! `GpuMoveStalled` Event per GPU and wait, and sets the `tessera_gpu_moves_stalled`
//! gauge.
//!
//! The decisions are pure ([`published_gpus`], [`inherited_gpus`], [`Stall`]; each GPU's
//! phase, and what the LIST decides, in [`super::handover`]); the agent does the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::dra::names::{parse_device_name, DeviceKind, DRIVER};
use crate::gpu::Inventory;
use crate::retry::Backoff;

/// UUIDs of the GPUs of `inventory` that a device of `slices` (this driver's, this node's)
/// lives on. Pure.
pub fn published_gpus(slices: &[ResourceSlice], inventory: &Inventory) -> BTreeSet<String> {
    slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| match parse_device_name(&d.name)? {
            DeviceKind::Whole { gpu } | DeviceKind::Vgpu { gpu } | DeviceKind::Mig { gpu, .. } => {
                Some(gpu)
            }
        })
        .filter_map(|index| inventory.gpus.iter().find(|g| g.index == index))
        .map(|g| g.uuid.clone())
        .collect()
}

/// The GPUs an earlier run may have given the DRA driver: named by this node's stored
/// slices (`published`), allocated to a claim of this node's pool (`allocated`, GPU UUID
/// → claims), or held by a claim in the DRA checkpoint (`checkpoint`). A GPU the kubelet
/// records as the device plugin's (`device_plugin`: listed by it last, or a pod holds it)
/// was not the driver's, unless the checkpoint holds it: a slice or an allocated claim
/// naming it is left from before it moved (e.g. a claim refused at NodePrepareResources).
/// Pure.
pub fn inherited_gpus(
    published: &BTreeSet<String>,
    allocated: &BTreeMap<String, Vec<String>>,
    checkpoint: &BTreeMap<String, Vec<String>>,
    device_plugin: &BTreeSet<String>,
) -> BTreeSet<String> {
    published
        .iter()
        .chain(allocated.keys())
        .filter(|g| !device_plugin.contains(*g))
        .chain(checkpoint.keys())
        .cloned()
        .collect()
}

/// What survives at start of the split an earlier run left: the GPUs this node's stored
/// slices name (`Err`: the LIST failed) and the claims allocated on this node's GPUs
/// (`Err`: the LIST failed). Both LISTs run concurrently, each bounded by `timeout`.
pub struct Inherited {
    pub published: Result<BTreeSet<String>, String>,
    pub allocated: Result<BTreeMap<String, Vec<String>>, String>,
}

/// Read [`Inherited`] from the API server.
pub async fn inherited(
    client: kube::Client,
    node: &str,
    inventory: &Inventory,
    timeout: Duration,
) -> Inherited {
    let (published, allocated) = tokio::join!(
        list_published(client.clone(), node, inventory, timeout),
        super::usage::list_allocated(client, node, inventory, timeout),
    );
    Inherited {
        published,
        allocated,
    }
}

/// When a phase 2 that cannot finish is worth a warning: once it has waited `after`, then
/// at most once per `after`. Reset when the set of withdrawing GPUs changes.
#[derive(Debug, Clone, Default)]
pub struct Stall {
    /// Since when phase 2 waits (the first poll that could not finish).
    since: Option<tokio::time::Instant>,
    /// The last warning.
    warned: Option<tokio::time::Instant>,
    /// GPUs already named in an Event during this wait.
    reported: BTreeSet<String>,
}

impl Stall {
    /// Phase 2 could not finish at `now`: whether to warn, and for how long it has waited.
    pub fn due(&mut self, now: tokio::time::Instant, after: Duration) -> Option<Duration> {
        let since = *self.since.get_or_insert(now);
        let waited = now.saturating_duration_since(since);
        if waited < after {
            return None;
        }
        if self
            .warned
            .is_some_and(|w| now.saturating_duration_since(w) < after)
        {
            return None;
        }
        self.warned = Some(now);
        Some(waited)
    }

    /// Whether `gpu` is named in an Event for the first time in this wait (records it).
    pub fn first_report(&mut self, gpu: &str) -> bool {
        self.reported.insert(gpu.to_string())
    }

    /// Whether a warning was given in this wait.
    pub fn warned(&self) -> bool {
        self.warned.is_some()
    }
}

/// Follow this node's slices of the driver on the API server until `cancel` (or the
/// receiver is gone): send `()` on `changed` after each LIST that (re)starts the WATCH and
/// on each of its events, so phase 2 looks again exactly when the slices may have
/// dropped a GPU instead of polling. A watch that ends (server timeout, `410 Gone` after
/// a compaction, a dropped connection) is started again from a fresh LIST; a failed LIST
/// or WATCH is retried after `retry`, doubling to 8 × `retry`. The agent keeps a slow
/// poll besides ([`MOVE_POLL`]), so a watch that cannot be had strands nothing.
pub async fn follow_slices(
    client: kube::Client,
    node: String,
    changed: tokio::sync::mpsc::UnboundedSender<()>,
    retry: Duration,
    cancel: tokio_util::sync::CancellationToken,
) {
    use futures::TryStreamExt;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    let api: kube::Api<ResourceSlice> = kube::Api::all(client);
    let fields = format!("spec.nodeName={node},spec.driver={DRIVER}");
    let mut backoff = Backoff::doubling(retry, retry.saturating_mul(8));
    let follow = async {
        loop {
            let version = match api.list(&ListParams::default().fields(&fields)).await {
                Ok(list) => list.metadata.resource_version.unwrap_or_default(),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list ResourceSlices to watch them; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
            };
            if changed.send(()).is_err() {
                return;
            }
            let wp = WatchParams::default().fields(&fields).timeout(290);
            let mut stream = match api.watch(&wp, &version).await {
                Ok(s) => Box::pin(s),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch ResourceSlices; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
            };
            backoff.reset();
            loop {
                match stream.try_next().await {
                    Ok(Some(
                        WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                    )) => {
                        if changed.send(()).is_err() {
                            return;
                        }
                    }
                    Ok(Some(WatchEvent::Bookmark(_))) => {}
                    // 410 Gone (compacted) or another error: LIST and watch again.
                    Ok(Some(WatchEvent::Error(e))) => {
                        tracing::debug!(error = %e, "the ResourceSlice watch ended; watching again");
                        break;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "the ResourceSlice watch failed; watching again");
                        // The watch had started: the first delay, and the LIST that
                        // follows still starts from it.
                        tokio::time::sleep(retry).await;
                        break;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = cancel.cancelled() => {}
        () = follow => {}
    }
}

/// How often phase 2 looks at the API server when nothing told it to (the watch of
/// [`follow_slices`] is down or missed a change).
pub const MOVE_POLL: Duration = Duration::from_secs(2);

/// How soon phase 2 tries again after the API server failed to answer.
pub const MOVE_RETRY: Duration = Duration::from_millis(500);

/// [`published_gpus`] of this node's stored slices (one LIST with a field selector,
/// bounded by `timeout`).
pub async fn list_published(
    client: kube::Client,
    node: &str,
    inventory: &Inventory,
    timeout: Duration,
) -> Result<BTreeSet<String>, String> {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client);
    let params = kube::api::ListParams::default()
        .fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
    let list = tokio::time::timeout(timeout, api.list(&params))
        .await
        .map_err(|_| format!("listing ResourceSlices timed out after {timeout:?}"))?
        .map_err(|e| format!("cannot list ResourceSlices: {e}"))?;
    Ok(published_gpus(&list.items, inventory))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;

    fn inv() -> Inventory {
        FakeBackend::from_spec("4xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap()
    }

    fn slice(driver: &str, devices: &[&str]) -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "spec": {"driver": driver, "nodeName": "n",
                     "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices.iter().map(|d| serde_json::json!({"name": d})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn published_gpus_by_device_kind_and_driver() {
        let inv = inv();
        let cases: &[(&[ResourceSlice], &[usize])] = &[
            (&[], &[]),
            (&[slice(DRIVER, &[])], &[]),
            (&[slice(DRIVER, &["gpu-0", "gpu-2-vgpu"])], &[0, 2]),
            (
                &[
                    slice(DRIVER, &["gpu-3-mig-3g-40gb-4"]),
                    slice(DRIVER, &["gpu-1"]),
                ],
                &[1, 3],
            ),
            // Another driver's devices, names that are not ours, GPUs not on the node.
            (&[slice("other.example.com", &["gpu-0"])], &[]),
            (&[slice(DRIVER, &["bogus", "gpu-9"])], &[]),
        ];
        for (slices, want) in cases {
            let want: BTreeSet<String> = want.iter().map(|i| inv.gpus[*i].uuid.clone()).collect();
            assert_eq!(published_gpus(slices, &inv), want, "{want:?}");
        }
    }

    #[test]
    fn inherited_gpus_are_the_union_of_what_survives() {
        let set = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        let map = |v: &[&str]| -> BTreeMap<String, Vec<String>> {
            v.iter()
                .map(|s| (s.to_string(), vec!["x".to_string()]))
                .collect()
        };
        // (published, allocated, checkpoint, the device plugin's, want)
        type Case<'a> = (
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: &[Case] = &[
            (&[], &[], &[], &[], &[]),
            (&["a"], &[], &[], &[], &["a"]),
            (&[], &["b"], &[], &[], &["b"]),
            (&[], &[], &["c"], &[], &["c"]),
            (&["a", "b"], &["b", "c"], &["d"], &[], &["a", "b", "c", "d"]),
            // The device plugin's: a stale slice or a stranded claim does not make it the
            // driver's; a checkpointed claim does.
            (&["a"], &["b"], &["c"], &["a", "b", "c"], &["c"]),
            (&["a", "e"], &[], &[], &["a"], &["e"]),
        ];
        for (published, allocated, checkpoint, device_plugin, want) in cases {
            assert_eq!(
                inherited_gpus(
                    &set(published),
                    &map(allocated),
                    &map(checkpoint),
                    &set(device_plugin)
                ),
                set(want),
                "{published:?} {allocated:?} {checkpoint:?} {device_plugin:?}"
            );
        }
    }

    #[test]
    fn stall_warns_after_the_wait_then_at_most_once_per_interval() {
        let after = Duration::from_secs(10);
        let t0 = tokio::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut stall = Stall::default();
        // (seconds since the first poll, warned with this wait)
        let cases: &[(u64, Option<u64>)] = &[
            (0, None),
            (5, None),
            (10, Some(10)),
            (11, None),
            (19, None),
            (20, Some(20)),
            (45, Some(45)),
            (50, None),
        ];
        for (t, want) in cases {
            assert_eq!(
                stall.due(at(*t), after),
                want.map(Duration::from_secs),
                "at {t} s"
            );
        }
        assert!(stall.warned());
        assert!(stall.first_report("g"));
        assert!(!stall.first_report("g"));
        assert!(stall.first_report("h"));
        // A new wait starts over.
        let mut stall = Stall::default();
        assert!(!stall.warned());
        assert_eq!(stall.due(at(100), after), None);
        assert_eq!(stall.due(at(110), after), Some(after));
    }
}
