//! The real [`ClaimPreparer`]: NodePrepareResources / NodeUnprepareResources on this node.
//!
//! ```text
//! prepare(claim) ── lock checkpoint ── already Completed? ──▶ answer from the checkpoint
//!                      │ no
//!                      ▼
//!   GET claim ─▶ plan_claim (pure; opaque config parsed strictly) ─▶ time-slice clash?
//!   ─▶ checkpoint: Started ─▶ read the MIG capability table (MIG claims; missing: fail)
//!   ─▶ set time-slices, create MIG instances (+ their gi/ci access nodes) ─▶ accounting dir
//!   ─▶ write the claim's CDI spec ─▶ checkpoint: Completed
//!   ─▶ PUT status.devices (Ready=True, or Ready=False with the error on any failure)
//! unprepare(claim) ── remove CDI spec ─▶ destroy its MIG instances ─▶ default time-slice
//!   if no other claim time-slices the GPU ─▶ drop from checkpoint ─▶ clear status.devices
//! ```
//!
//! `status.devices` is written through the claim's `status` subresource with the claim's
//! resourceVersion (re-read and retried on a conflict), replacing only this driver's
//! entries for this node (see [`super::status`]); a failure to write it is logged and does
//! not fail the prepare.
//!
//! A failure between Started and Completed leaves the claim `Started`: the next start of
//! the agent rolls it back (see [`super::checkpoint::recover`]); a retried prepare redoes
//! it from scratch (every step is idempotent).
//!
//! Concurrency: the claim GET and the status write run on the async runtime without the
//! lock, so concurrent requests overlap their API round trips; everything under the
//! checkpoint's file lock (a blocking `flock`, then local reads, NVML calls, fsyncs) runs
//! on the blocking pool (`spawn_blocking`), never on the runtime's threads. The checkpoint
//! is re-read under the lock, so each claim's Started/Completed writes see every other
//! claim's record (no lost entry).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::Client;
use tracing::{debug, info, instrument, warn};

use super::checkpoint::{self, Phase, PreparedClaim, Store, TimeSliceRecord};
use super::plugin::{ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice};
use super::prepare::{cdi_device_name, plan_claim, ClaimPlan};
use super::status;
use crate::cdi;
use crate::cdi::migcaps::MigCaps;
use crate::deviceplugin::allocate::AllocateSettings;
use crate::gpu::{GpuBackend, TimeSlice};

/// Tries of the read-modify-write of a claim's status before giving up.
const STATUS_ATTEMPTS: usize = 5;

/// Prepares claims on this node. Cheap to clone (the blocking part runs on a clone).
#[derive(Clone)]
pub struct NodePreparer {
    pub client: Client,
    pub node: String,
    pub backend: Arc<dyn GpuBackend>,
    pub checkpoint: Store,
    pub cdi_root: PathBuf,
    pub settings: AllocateSettings,
    pub boot_id: String,
}

impl NodePreparer {
    fn read_checkpoint(&self) -> checkpoint::Data {
        match self.checkpoint.read() {
            Ok(d) => d,
            Err(e) => {
                // Never a crash loop: start from an empty record (the kubelet re-sends
                // every claim it still needs).
                warn!(error = %e, "starting from an empty checkpoint");
                checkpoint::Data::default()
            }
        }
    }

    /// Run `f` on a clone of `self` on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&NodePreparer) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me))
            .await
            .map_err(|e| format!("driver task failed: {e}"))?
    }

    /// The claim's record when it is already prepared (read without the lock: writes are
    /// atomic renames, so the file is always whole).
    fn completed(&self, uid: &str) -> Option<PreparedClaim> {
        self.checkpoint
            .read()
            .ok()?
            .claims
            .remove(uid)
            .filter(|p| p.phase == Phase::Completed)
    }

    async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let uid = c.uid.clone();
        if let Some(done) = self.blocking(move |me| Ok(me.completed(&uid))).await? {
            return Ok(answer(&done));
        }
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let get_started = Instant::now();
        let claim = claims
            .get(&c.name)
            .await
            .map_err(|e| format!("cannot read claim {}/{}: {e}", c.namespace, c.name))?;
        // For benchmarks: the issue's prepare budget excludes the claim GET.
        debug!(target: "tessera::dra::timing", claim = %format!("{}/{}", c.namespace, c.name),
               get_us = get_started.elapsed().as_micros() as u64, "claim GET");
        let outcome = {
            let (c, claim) = (c.clone(), claim.clone());
            self.blocking(move |me| Ok(me.prepare_locked(&c, &claim)))
                .await?
        };
        match outcome {
            Ok(Locked::Done(record)) => Ok(answer(&record)),
            Ok(Locked::Prepared(record, report)) => {
                self.write_status(c, claim, &status::Outcome::Prepared(report))
                    .await;
                info!(claim = %format!("{}/{}", c.namespace, c.name), devices = record.devices.len(), "claim prepared");
                Ok(answer(&record))
            }
            Err(e) => {
                // Not for a recreated claim: its status is not about this request.
                if claim.metadata.uid.as_deref() == Some(c.uid.as_str()) {
                    self.write_status(c, claim, &status::Outcome::Failed(e.clone()))
                        .await;
                }
                Err(e)
            }
        }
    }

    /// Under the lock (blocking): re-read the checkpoint (another request may have
    /// prepared the claim meanwhile), then [`Self::prepare_fetched`].
    fn prepare_locked(&self, c: &ClaimRef, claim: &ResourceClaim) -> Result<Locked, String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let mut data = self.read_checkpoint();
        data.boot_id = self.boot_id.clone();
        if let Some(done) = data
            .claims
            .get(&c.uid)
            .filter(|p| p.phase == Phase::Completed)
        {
            return Ok(Locked::Done(done.clone()));
        }
        let (record, report) = self.prepare_fetched(c, claim, &mut data)?;
        Ok(Locked::Prepared(record, report))
    }

    /// Plan, record `Started`, apply, write the CDI spec, record `Completed`. Returns the
    /// record and the `status.devices` data per device.
    fn prepare_fetched(
        &self,
        c: &ClaimRef,
        claim: &ResourceClaim,
        data: &mut checkpoint::Data,
    ) -> Result<(PreparedClaim, BTreeMap<String, serde_json::Value>), String> {
        let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
        let plan = plan_claim(claim, &c.uid, &self.node, &inventory, &self.settings)
            .map_err(|e| e.to_string())?;
        check_time_slices(&c.uid, &plan, data)?;
        let mut record = PreparedClaim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            phase: Phase::Started,
            devices: plan
                .devices
                .iter()
                .map(|d| checkpoint::PreparedDevice {
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    request_names: vec![d.request.clone()],
                    cdi_device_ids: vec![cdi::qualified_name(&cdi_device_name(&c.uid, &d.device))],
                    mig: d.mig.clone(),
                    time_slice: d.time_slice.map(|interval| TimeSliceRecord {
                        gpu_uuid: d.visible.clone(),
                        interval,
                    }),
                })
                .collect(),
        };
        data.claims.insert(c.uid.clone(), record.clone());
        // No directory fsync for Started: see `Store::write_without_dir_sync`.
        self.checkpoint
            .write_without_dir_sync(data)
            .map_err(|e| e.to_string())?;

        let report = device_report(&plan);
        let (spec, report) = self.apply(&c.uid, plan, report)?;
        cdi::write_spec(
            &self.cdi_root,
            &format!("tessera.io-claim-{}", c.uid),
            &spec,
        )
        .map_err(|e| e.to_string())?;

        record.phase = Phase::Completed;
        data.claims.insert(c.uid.clone(), record.clone());
        self.checkpoint.write(data).map_err(|e| e.to_string())?;
        Ok((record, report))
    }

    /// Write our `status.devices` entries of the claim (status subresource, optimistic
    /// concurrency: on a conflict, re-read and retry). Failures are logged, never fail the
    /// prepare: the containers can run without the report.
    async fn write_status(&self, c: &ClaimRef, claim: ResourceClaim, outcome: &status::Outcome) {
        let node = self.node.clone();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        self.update_status(c, claim, |claim| {
            status::report(claim, &node, outcome, now.clone())
        })
        .await
    }

    /// Read-modify-write of the claim's `status.devices` with `devices` (None: no write).
    async fn update_status(
        &self,
        c: &ClaimRef,
        mut claim: ResourceClaim,
        devices: impl Fn(&ResourceClaim) -> Option<Vec<AllocatedDeviceStatus>>,
    ) {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let who = format!("{}/{}", c.namespace, c.name);
        for _ in 0..STATUS_ATTEMPTS {
            if claim.metadata.uid.as_deref() != Some(c.uid.as_str()) {
                return;
            }
            let Some(list) = devices(&claim) else { return };
            let expect_entries = !list.is_empty();
            claim.status.get_or_insert_with(Default::default).devices = Some(list);
            match api
                .replace_status(&c.name, &PostParams::default(), &claim)
                .await
            {
                Ok(stored) => {
                    let kept = stored
                        .status
                        .as_ref()
                        .and_then(|s| s.devices.as_ref())
                        .is_some_and(|d| !d.is_empty());
                    if expect_entries && !kept {
                        warn!(claim = %who, "the API server dropped status.devices: the feature gate DRAResourceClaimDeviceStatus is off");
                    }
                    return;
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => match api.get(&c.name).await {
                    Ok(fresh) => claim = fresh,
                    Err(e) => {
                        warn!(claim = %who, error = %e, "cannot re-read claim for its status");
                        return;
                    }
                },
                Err(kube::Error::Api(s)) if s.is_not_found() => return,
                Err(e) => {
                    warn!(claim = %who, error = %e, "cannot write the claim's status.devices");
                    return;
                }
            }
        }
        warn!(claim = %who, "status.devices not written: the claim kept changing");
    }

    /// Side effects: MIG instances (their UUIDs replace the parent GPU in the visible
    /// devices, and in the status data; their GPU-instance and compute-instance access
    /// nodes join the device's CDI edits), compute time-slices, and the vGPU accounting
    /// directory. Returns the final CDI spec and status data. The driver's MIG capability
    /// table is read before any side effect: without it a MIG claim fails at once.
    fn apply(
        &self,
        uid: &str,
        plan: ClaimPlan,
        mut report: BTreeMap<String, serde_json::Value>,
    ) -> Result<(cdi::Spec, BTreeMap<String, serde_json::Value>), String> {
        let caps = match plan.devices.iter().any(|d| d.mig.is_some()) {
            true => Some(
                MigCaps::load(&self.settings.mig_caps)
                    .map_err(|e| format!("MIG devices need their capability nodes: {e}"))?,
            ),
            false => None,
        };
        let mut spec = plan.cdi;
        for d in &plan.devices {
            if let Some(interval) = d.time_slice {
                self.backend
                    .set_time_slice(&d.visible, interval)
                    .map_err(|e| e.to_string())?;
            }
            let Some(mig) = &d.mig else { continue };
            let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
            let gpu = inventory
                .gpu(&mig.gpu_uuid)
                .ok_or_else(|| format!("GPU {} is gone", mig.gpu_uuid))?;
            let gpu_minor = gpu.minor;
            let mut layout: Vec<(String, u8)> = gpu
                .mig_devices
                .iter()
                .map(|m| (m.profile.clone(), m.start))
                .collect();
            if !layout.contains(&(mig.profile.clone(), mig.start)) {
                layout.push((mig.profile.clone(), mig.start));
            }
            let devices = self
                .backend
                .apply_mig_layout(&mig.gpu_uuid, &layout)
                .map_err(|e| format!("creating MIG {} at {}: {e}", mig.profile, mig.start))?;
            let created = devices
                .iter()
                .find(|m| m.profile == mig.profile && m.start == mig.start)
                .ok_or_else(|| format!("MIG {} at {} was not created", mig.profile, mig.start))?;
            if let Some(serde_json::Value::Object(o)) = report.get_mut(&d.device) {
                o.insert("uuid".into(), created.uuid.clone().into());
            }
            if let Some(caps) = &caps {
                let nodes = caps
                    .nodes(gpu_minor, created.gi_id, created.ci_id)
                    .map_err(|e| format!("MIG device {}: {e}", created.uuid))?;
                let name = cdi_device_name(uid, &d.device);
                if let Some(dev) = spec.devices.iter_mut().find(|x| x.name == name) {
                    dev.container_edits.device_nodes.extend(nodes);
                }
            }
            for e in &mut spec.container_edits.env {
                if let Some(list) = e.strip_prefix("NVIDIA_VISIBLE_DEVICES=") {
                    let replaced: Vec<&str> = list
                        .split(',')
                        .map(|v| {
                            if v == mig.gpu_uuid {
                                created.uuid.as_str()
                            } else {
                                v
                            }
                        })
                        .collect();
                    *e = format!("NVIDIA_VISIBLE_DEVICES={}", replaced.join(","));
                }
            }
        }
        if plan.devices.iter().any(|d| d.share.is_some()) {
            let dir = self.settings.vgpu_state_dir.join(uid);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok((
            cdi::devroot::with_host_dev(spec, &self.settings.host_dev),
            report,
        ))
    }

    /// At start-up: roll back claims a crash left half-prepared (their MIG instances and
    /// CDI specs), and after a reboot mark every claim for re-preparation. A corrupt
    /// checkpoint is replaced by an empty one (the kubelet re-sends the claims it needs).
    /// The checkpoint is rewritten only when that changed it.
    pub fn recover(&self) -> Result<checkpoint::Loaded, String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let before = self.checkpoint.read().ok();
        let loaded = checkpoint::recover(self.read_checkpoint(), &self.boot_id);
        for (uid, claim) in &loaded.rollback {
            warn!(claim = %format!("{}/{}", claim.namespace, claim.name), "rolling back a half-prepared claim");
            self.undo(uid, claim, &loaded.data)?;
        }
        if before.as_ref() != Some(&loaded.data) {
            self.checkpoint
                .write(&loaded.data)
                .map_err(|e| e.to_string())?;
        }
        Ok(loaded)
    }

    /// At start-up, after [`Self::recover`]: destroy MIG instances on `gpus` (the GPUs the
    /// DRA driver owns) that no checkpointed claim records, e.g. left by an earlier
    /// device-plugin layout, or created by a prepare whose `Started` record was lost.
    /// Returns how many were destroyed.
    pub fn destroy_unowned_migs(&self, gpus: &BTreeSet<String>) -> Result<usize, String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let data = self.read_checkpoint();
        let owned: BTreeSet<(&str, &str, u8)> = data
            .claims
            .values()
            .flat_map(|c| &c.devices)
            .filter_map(|d| d.mig.as_ref())
            .map(|m| (m.gpu_uuid.as_str(), m.profile.as_str(), m.start))
            .collect();
        let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
        let mut destroyed = 0;
        for gpu in inventory.gpus.iter().filter(|g| gpus.contains(&g.uuid)) {
            let (keep, drop): (Vec<_>, Vec<_>) = gpu
                .mig_devices
                .iter()
                .partition(|m| owned.contains(&(gpu.uuid.as_str(), m.profile.as_str(), m.start)));
            if drop.is_empty() {
                continue;
            }
            for m in &drop {
                warn!(gpu = %gpu.uuid, mig = %m.uuid, profile = %m.profile, start = m.start, "destroying a MIG instance no claim owns");
            }
            let layout: Vec<(String, u8)> =
                keep.iter().map(|m| (m.profile.clone(), m.start)).collect();
            self.backend
                .apply_mig_layout(&gpu.uuid, &layout)
                .map_err(|e| format!("destroying unowned MIG instances on {}: {e}", gpu.uuid))?;
            destroyed += drop.len();
        }
        Ok(destroyed)
    }

    /// Remove a claim's CDI spec, destroy the MIG instances it recorded, and put back the
    /// default time-slice on GPUs no other claim in `others` still time-slices.
    fn undo(
        &self,
        uid: &str,
        record: &PreparedClaim,
        others: &checkpoint::Data,
    ) -> Result<(), String> {
        let spec = self.cdi_root.join(format!("tessera.io-claim-{uid}.json"));
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", spec.display())),
        }
        for mig in record.devices.iter().filter_map(|d| d.mig.as_ref()) {
            let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
            if let Some(gpu) = inventory.gpu(&mig.gpu_uuid) {
                let layout: Vec<(String, u8)> = gpu
                    .mig_devices
                    .iter()
                    .filter(|m| !(m.profile == mig.profile && m.start == mig.start))
                    .map(|m| (m.profile.clone(), m.start))
                    .collect();
                self.backend
                    .apply_mig_layout(&mig.gpu_uuid, &layout)
                    .map_err(|e| format!("destroying MIG {}: {e}", mig.profile))?;
            }
        }
        for ts in record.devices.iter().filter_map(|d| d.time_slice.as_ref()) {
            let still_used = others
                .claims
                .iter()
                .filter(|(other, _)| other.as_str() != uid)
                .flat_map(|(_, c)| &c.devices)
                .any(|d| {
                    d.time_slice
                        .as_ref()
                        .is_some_and(|t| t.gpu_uuid == ts.gpu_uuid)
                });
            if !still_used {
                self.backend
                    .set_time_slice(&ts.gpu_uuid, TimeSlice::Default)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn unprepare_local(&self, c: &ClaimRef) -> Result<(), String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let mut data = self.read_checkpoint();
        let record = data.claims.remove(&c.uid).unwrap_or(PreparedClaim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            phase: Phase::Completed,
            devices: Vec::new(),
        });
        self.undo(&c.uid, &record, &data)?;
        // Unknown claims are fine: unprepare is idempotent.
        self.checkpoint.write(&data).map_err(|e| e.to_string())
    }

    async fn unprepare_one(&self, c: &ClaimRef) -> Result<(), String> {
        let local = c.clone();
        self.blocking(move |me| me.unprepare_local(&local)).await?;
        // Withdraw our status.devices entries, also for a claim the checkpoint forgot (a
        // replaced corrupt checkpoint); the claim may already be gone.
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        match api.get(&c.name).await {
            Ok(claim) => {
                let node = self.node.clone();
                self.update_status(c, claim, |claim| status::clear(claim, &node))
                    .await
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => warn!(claim = %c.name, error = %e, "cannot read claim to clear its status"),
        }
        Ok(())
    }
}

/// What the locked part of a prepare did.
enum Locked {
    /// Already prepared (by an earlier or a concurrent request): nothing written.
    Done(PreparedClaim),
    /// Prepared now, with the `status.devices` data per device.
    Prepared(PreparedClaim, BTreeMap<String, serde_json::Value>),
}

/// A time-slice asked for on a GPU another prepared claim time-slices differently is a
/// conflict (the setting is per GPU): refuse it before any side effect.
fn check_time_slices(uid: &str, plan: &ClaimPlan, data: &checkpoint::Data) -> Result<(), String> {
    for d in &plan.devices {
        let Some(want) = d.time_slice else { continue };
        let clash = data
            .claims
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .find_map(|(other, c)| {
                c.devices
                    .iter()
                    .filter_map(|x| x.time_slice.as_ref())
                    .find(|t| t.gpu_uuid == d.visible && t.interval != want)
                    .map(|t| (other, c, t.interval))
            });
        if let Some((other, c, have)) = clash {
            return Err(format!(
                "device {}: GPU {} is time-sliced {have:?} by claim {}/{} ({other}); this claim asks for {want:?}",
                d.device, d.visible, c.namespace, c.name
            ));
        }
    }
    Ok(())
}

/// The `status.devices` data of each planned device (MIG UUIDs are added once created).
fn device_report(plan: &ClaimPlan) -> BTreeMap<String, serde_json::Value> {
    plan.devices
        .iter()
        .map(|d| {
            let mut o = serde_json::Map::new();
            match &d.mig {
                Some(m) => {
                    o.insert("parentUUID".into(), m.gpu_uuid.clone().into());
                    o.insert("profile".into(), m.profile.clone().into());
                }
                None => {
                    o.insert("uuid".into(), d.visible.clone().into());
                }
            }
            if let Some((memory, cores)) = d.share {
                o.insert("memory".into(), format!("{memory}Mi").into());
                o.insert("cores".into(), cores.into());
            }
            if let Some(ts) = d.time_slice {
                o.insert("timeSlice".into(), format!("{ts:?}").into());
            }
            (d.device.clone(), serde_json::Value::Object(o))
        })
        .collect()
}

fn answer(record: &PreparedClaim) -> Vec<PreparedDevice> {
    record
        .devices
        .iter()
        .map(|d| PreparedDevice {
            request_names: d.request_names.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
        })
        .collect()
}

impl ClaimPreparer for NodePreparer {
    #[instrument(skip_all, fields(claims = claims.len()))]
    async fn prepare(&self, claims: Vec<ClaimRef>) -> ClaimResults<Vec<PreparedDevice>> {
        let mut out = ClaimResults::new();
        for c in claims {
            let r = self.prepare_one(&c).await;
            if let Err(e) = &r {
                warn!(claim = %c.name, error = %e, "prepare failed");
            }
            out.insert(c.uid, r);
        }
        out
    }

    #[instrument(skip_all, fields(claims = claims.len()))]
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> ClaimResults<()> {
        let mut out = ClaimResults::new();
        for c in claims {
            let r = self.unprepare_one(&c).await;
            out.insert(c.uid, r);
        }
        out
    }
}
