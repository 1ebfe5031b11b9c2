//! The real [`ClaimPreparer`]: NodePrepareResources / NodeUnprepareResources on this node.
//!
//! ```text
//! prepare(claim) ── already Completed (in memory)? ──▶ answer from the checkpoint
//!                      │ no
//!                      ▼
//!   GET claim ─▶ session (file lock) ─▶ Completed meanwhile? ─▶ recorded already with
//!   the same devices (a re-prepare)? else admit: every device published, its GPU owned by
//!   the DRA driver ([`super::owned`]; refused: per-claim error, nothing written)
//!   ─▶ work lock ─▶ plan_claim
//!   (pure; opaque config parsed strictly) ─▶ MIG capability table (cached; missing: fail)
//!   ─▶ time-slice clash? ─▶ checkpoint: Started (a log record, written, not synced)
//!   ─▶ set time-slices, create MIG instances (+ their gi/ci access nodes) ─▶ accounting dir
//!   ─▶ write the claim's CDI spec ─▶ Completed in memory ─▶ release the work lock
//!   ─▶ checkpoint: Completed (a log record, written; one for all concurrent requests)
//!   ─▶ answer the kubelet; status.devices (Ready=True, or Ready=False with the error on
//!      any failure) queued, written in the background ([`super::status_queue`])
//! unprepare(claim) ── remove CDI spec ─▶ destroy its MIG instances ─▶ default time-slice
//!   if no other claim time-slices the GPU ─▶ drop from checkpoint ─▶ clear status.devices
//!   (queued behind the claim's earlier status write; waited for, at most 2 s)
//! ```
//!
//! `status.devices` is written through the claim's `status` subresource with the claim's
//! resourceVersion (re-read and retried on a conflict), replacing only this driver's
//! entries for this node (see [`super::status`]), after the kubelet got its answer: per
//! claim in order, so an unprepare's clearing is never overwritten by the prepare's
//! Ready ([`super::status_queue`]); a failure is logged and retried with backoff, and
//! never fails the prepare.
//!
//! The admission holds the claim's GPUs (the agent does not hand them to the device plugin)
//! until the claim's checkpoint record is written, which holds them from then on. A claim
//! the checkpoint already records with the same devices (Completed, or to be prepared
//! again after a reboot) is not checked again: its record pins its GPUs to the driver, so
//! a split that changed since has left them where they were.
//!
//! A failure between Started and Completed leaves the claim `Started`: the next start of
//! the agent rolls it back (see [`super::checkpoint::recover`]); a retried prepare redoes
//! it from scratch (every step is idempotent). At start, CDI specs of claims the
//! checkpoint does not hold as `Completed` are removed and MIG instances no claim owns are
//! destroyed, so a `Started` record lost to a power loss leaves nothing behind.
//!
//! Concurrency and cost: an already prepared claim is answered from the checkpoint's
//! in-memory copy before the GET. The claim GET runs on the async runtime (the status
//! write after the answer, in the background), so concurrent requests overlap their API
//! round trips; the rest runs in one
//! hop to the blocking pool (`spawn_blocking`): a checkpoint [`Session`] (file lock,
//! in-memory copy), one request per claim at a time, the plan, the `Started` record and
//! the side effects under an in-process work lock (MIG layouts are read-modify-write),
//! then the `Completed` record's durable write outside it, shared by concurrent requests
//! (group commit: a burst costs a few fsyncs, not one per claim). The MIG capability
//! table is read once and re-read only when its files change ([`mig_caps`]). Each
//! prepare's step times are logged at debug level on `tessera::dra::timing`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::Client;
use tracing::{debug, info, instrument, warn};

use super::checkpoint::{
    self, Durability, Phase, PreparedClaim, Session, Store, Ticket, TimeSliceRecord,
};
use super::names::{parse_device_name, DeviceKind};
use super::owned::{Admission, OwnedDevices};
use super::plugin::{ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice};
use super::prepare::{
    cdi_device_name, claim_dir_id, claim_spec_with, devices_here, plan_claim, with_mig_instance,
    ClaimPlan, PlannedDevice,
};
use super::status;
use super::status_queue::{StatusOp, StatusWriter};
use crate::cdi;
use crate::cdi::migcaps::{MigCaps, MigCapsPaths};
use crate::deviceplugin::allocate::AllocateSettings;
use crate::gpu::{GpuBackend, Inventory, TimeSlice};

/// How long an unprepare waits for its clearing of `status.devices` (queued behind the
/// claim's earlier status write) before answering anyway; the write goes on after.
const UNPREPARE_STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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
    /// The GPUs and devices the driver owns now: claims outside them are refused.
    pub owned: OwnedDevices,
    /// Writes `status.devices` after the answer (`StatusWriter::new(client, node)`);
    /// flush it at shutdown.
    pub status: StatusWriter,
}

impl NodePreparer {
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

    async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let mut steps = Steps::new();
        // Already prepared: answered from memory (a `stat` checks nobody else wrote the
        // file), without the GET.
        if let Some(done) = self.checkpoint.completed_hint(&c.uid) {
            return Ok(answer(&done));
        }
        steps.mark("precheck");
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let get_started = Instant::now();
        let claim = claims
            .get(&c.name)
            .await
            .map_err(|e| format!("cannot read claim {}/{}: {e}", c.namespace, c.name))?;
        // For benchmarks: the issue's prepare budget excludes the claim GET.
        debug!(target: "tessera::dra::timing", claim = %format!("{}/{}", c.namespace, c.name),
               get_us = get_started.elapsed().as_micros() as u64, "claim GET");
        steps.mark("get");
        let (outcome, inner) = {
            let (c, claim) = (c.clone(), claim.clone());
            let queued = Instant::now();
            self.blocking(move |me| {
                let mut steps = Steps::new();
                steps.add("hop", queued.elapsed());
                let r = me.prepare_locked(&c, &claim, &mut steps);
                Ok((r, steps))
            })
            .await?
        };
        steps.merge(inner);
        match outcome {
            Ok(Locked::Done(record)) => Ok(answer(&record)),
            Ok(Locked::Prepared(record, report)) => {
                // Queued: written after the kubelet got its answer.
                self.report_status(c, claim, status::Outcome::Prepared(report));
                steps.mark("status");
                steps.log(c);
                info!(claim = %format!("{}/{}", c.namespace, c.name), devices = record.devices.len(), "claim prepared");
                Ok(answer(&record))
            }
            Err(e) => {
                // Not for a recreated claim: its status is not about this request.
                if claim.metadata.uid.as_deref() == Some(c.uid.as_str()) {
                    self.report_status(c, claim, status::Outcome::Failed(e.clone()));
                }
                Err(e)
            }
        }
    }

    /// In a checkpoint session (blocking): the claim may have been prepared meanwhile;
    /// otherwise [`Self::prepare_fetched`] under the work lock, then the `Completed`
    /// record's durable write outside it, shared with concurrent requests (group commit).
    fn prepare_locked(
        &self,
        c: &ClaimRef,
        claim: &ResourceClaim,
        steps: &mut Steps,
    ) -> Result<Locked, String> {
        let session = self.checkpoint.session().map_err(|e| e.to_string())?;
        let _mine = session.begin(&c.uid);
        steps.mark("lock");
        if let Some(done) = session.view(|d| completed(d, &c.uid)) {
            return Ok(Locked::Done(done));
        }
        // Held until the record below is written (or the prepare failed).
        let _admitted = self.admit(c, claim, &session)?;
        steps.mark("admit");
        let (record, report, ticket) = {
            let _work = session.work();
            steps.mark("work_lock");
            self.prepare_fetched(c, claim, &session, steps)?
        };
        // `Completed` is written but not synced, like `Started`: a crash of this process
        // keeps it (the kernel has it); only a power loss or a kernel crash can lose it,
        // and both reboot the node, after which every claim is prepared again anyway (the
        // boot ID changes, MIG instances, time-slices and `/var/run/cdi` are gone, and a
        // claim read back as `Started` or not at all is rolled back or simply prepared
        // afresh). Waiting for the disk here bought nothing but its flush tail (docs/dra.md,
        // "Durability of each record"). Unprepare records stay synced.
        if let Err(e) = session.commit(ticket, Durability::Written) {
            // Not answered as prepared: a retry redoes it (the file may say Started).
            session.update(|d| {
                if let Some(r) = d.claims.get_mut(&c.uid) {
                    r.phase = Phase::Started;
                }
            });
            return Err(e.to_string());
        }
        steps.mark("completed");
        Ok(Locked::Prepared(record, report))
    }

    /// Check the claim's devices against what the driver owns and publishes now, and hold
    /// their GPUs ([`OwnedDevices::admit`]). Not for a claim the checkpoint records with
    /// the same devices (a re-prepare), nor for a claim that is not the kubelet's or not
    /// allocated (planning reports those).
    fn admit(
        &self,
        c: &ClaimRef,
        claim: &ResourceClaim,
        session: &Session<'_>,
    ) -> Result<Option<Admission>, String> {
        if claim.metadata.uid.as_deref() != Some(c.uid.as_str()) {
            return Ok(None);
        }
        let devices = devices_here(claim, &self.node);
        if devices.is_empty() {
            return Ok(None);
        }
        let recorded = session.view(|d| {
            d.claims.get(&c.uid).map(|r| {
                r.devices
                    .iter()
                    .map(|d| d.device.as_str())
                    .collect::<BTreeSet<_>>()
                    == devices.iter().map(String::as_str).collect()
            })
        });
        if recorded == Some(true) {
            return Ok(None);
        }
        let who = format!(
            "claim {}/{} (uid {}, preparing)",
            c.namespace, c.name, c.uid
        );
        self.owned
            .admit(&who, &devices)
            .map(Some)
            .map_err(|e| format!("claim {}/{}: {e}", c.namespace, c.name))
    }

    /// Plan, record `Started` (written before any side effect), apply, write the CDI
    /// spec, record `Completed` in memory. Returns the record, the `status.devices` data
    /// per device, and the ticket to commit.
    fn prepare_fetched(
        &self,
        c: &ClaimRef,
        claim: &ResourceClaim,
        session: &Session<'_>,
        steps: &mut Steps,
    ) -> Result<(PreparedClaim, BTreeMap<String, serde_json::Value>, Ticket), String> {
        let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
        steps.mark("inventory");
        let plan = plan_claim(claim, &c.uid, &self.node, &inventory, &self.settings)
            .map_err(|e| e.to_string())?;
        // Without the capability table a MIG claim fails before any side effect.
        let caps = match plan.devices.iter().any(|d| d.mig.is_some()) {
            true => Some(mig_caps(&self.settings.mig_caps)?),
            false => None,
        };
        steps.mark("plan");
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
        let (checked, ticket) = session.update(|data| {
            check_time_slices(&c.uid, &plan, data)?;
            data.boot_id = self.boot_id.clone();
            data.claims.insert(c.uid.clone(), record.clone());
            Ok::<_, String>(())
        });
        checked?;
        // `Started` is written (a log record) but not synced: it must survive a
        // crash of this process, which it does (the kernel has it); a power loss takes the
        // side effects it guards with it (MIG instances, time-slices, `/var/run/cdi`), and
        // what persists is swept at start (see `Session::commit`).
        if let Err(e) = session.commit(ticket, Durability::Written) {
            session.update(|d| d.claims.remove(&c.uid));
            return Err(e.to_string());
        }
        steps.mark("started");

        let report = device_report(&plan);
        let (spec, report) = self.apply(&c.uid, plan, report, &inventory, caps.as_deref())?;
        steps.mark("apply");
        cdi::write_spec(
            &self.cdi_root,
            &format!("tessera.io-claim-{}", c.uid),
            &spec,
        )
        .map_err(|e| e.to_string())?;
        steps.mark("cdi");

        record.phase = Phase::Completed;
        let ((), ticket) = session.update(|d| {
            d.claims.insert(c.uid.clone(), record.clone());
        });
        Ok((record, report, ticket))
    }

    /// Queue our `status.devices` entries of the claim for writing after the answer
    /// ([`super::status_queue`]): failures are logged and retried, never fail the prepare
    /// (the containers can run without the report).
    fn report_status(&self, c: &ClaimRef, claim: ResourceClaim, outcome: status::Outcome) {
        let op = StatusOp::Report {
            claim: Box::new(claim),
            outcome,
            at: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        // Nobody waits for a prepare's report.
        drop(self.status.enqueue(c, op));
    }

    /// Side effects: MIG instances (their UUIDs replace the parent GPU in the visible
    /// devices, and in the status data; their GPU-instance and compute-instance access
    /// nodes join the device's CDI edits), compute time-slices, and the vGPU accounting
    /// directory. Returns the final CDI spec and status data. Runs under the work lock, so
    /// `inventory` (read under it) is the GPUs' current MIG layout; instances this claim
    /// creates are added to it as they come.
    fn apply(
        &self,
        uid: &str,
        plan: ClaimPlan,
        mut report: BTreeMap<String, serde_json::Value>,
        inventory: &Inventory,
        caps: Option<&MigCaps>,
    ) -> Result<(cdi::Spec, BTreeMap<String, serde_json::Value>), String> {
        let mut spec = plan.cdi;
        // Per GPU: the MIG layout as it is now (this claim's instances included).
        let mut layouts: BTreeMap<&str, Vec<(String, u8)>> = BTreeMap::new();
        for d in &plan.devices {
            if let Some(interval) = d.time_slice {
                self.backend
                    .set_time_slice(&d.visible, interval)
                    .map_err(|e| e.to_string())?;
            }
            let Some(mig) = &d.mig else { continue };
            let gpu = inventory
                .gpu(&mig.gpu_uuid)
                .ok_or_else(|| format!("GPU {} is gone", mig.gpu_uuid))?;
            let layout = layouts.entry(gpu.uuid.as_str()).or_insert_with(|| {
                gpu.mig_devices
                    .iter()
                    .map(|m| (m.profile.clone(), m.start))
                    .collect()
            });
            if !layout.contains(&(mig.profile.clone(), mig.start)) {
                layout.push((mig.profile.clone(), mig.start));
            }
            let devices = self
                .backend
                .apply_mig_layout(&mig.gpu_uuid, layout)
                .map_err(|e| format!("creating MIG {} at {}: {e}", mig.profile, mig.start))?;
            *layout = devices
                .iter()
                .map(|m| (m.profile.clone(), m.start))
                .collect();
            let created = devices
                .iter()
                .find(|m| m.profile == mig.profile && m.start == mig.start)
                .ok_or_else(|| format!("MIG {} at {} was not created", mig.profile, mig.start))?;
            if let Some(serde_json::Value::Object(o)) = report.get_mut(&d.device) {
                o.insert("uuid".into(), created.uuid.clone().into());
            }
            let nodes = match caps {
                Some(caps) => caps
                    .nodes(gpu.minor, created.gi_id, created.ci_id)
                    .map_err(|e| format!("MIG device {}: {e}", created.uuid))?,
                None => Vec::new(),
            };
            with_mig_instance(
                &mut spec,
                uid,
                &d.device,
                &mig.gpu_uuid,
                &created.uuid,
                nodes,
            );
        }
        // vGPU: the installed shim is checked (fail closed) and the claim's limits written.
        super::prepare::write_claim_files(&self.settings, uid, &plan.devices)
            .map_err(|e| format!("vGPU refused: {e}"))?;
        Ok((
            cdi::devroot::with_host_dev(spec, &self.settings.host_dev),
            report,
        ))
    }

    /// Check every prepared claim's CDI spec against what its checkpoint record says it
    /// should be ([`Self::expected_spec`]) and rewrite a missing, damaged or edited one
    /// ([`cdi::verify_spec`]); in a checkpoint session under the work lock, so no
    /// prepare or unprepare runs meanwhile. Returns the repaired claims (UID, reason) and
    /// the claims whose spec could not be checked (UID, why; left as they are). Specs of
    /// claims not prepared are left to unprepare and the start-up sweep.
    pub fn verify_claim_specs(&self) -> Result<SpecCheck, String> {
        let session = self.checkpoint.session().map_err(|e| e.to_string())?;
        let _work = session.work();
        let claims: Vec<(String, PreparedClaim)> = session.view(|d| {
            d.claims
                .iter()
                .filter(|(_, c)| c.phase == Phase::Completed)
                .map(|(uid, c)| (uid.clone(), c.clone()))
                .collect()
        });
        let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
        let mut out = SpecCheck::default();
        for (uid, record) in claims {
            let spec = match self.expected_spec(&uid, &record, &inventory) {
                Ok(spec) => spec,
                Err(e) => {
                    out.unchecked.push((uid, e));
                    continue;
                }
            };
            let stem = format!("tessera.io-claim-{uid}");
            match cdi::verify_spec(&self.cdi_root, &stem, &spec) {
                Ok(cdi::Verified::Intact) => {}
                Ok(cdi::Verified::Repaired { reason }) => out.repaired.push((uid, reason)),
                Err(e) => out.unchecked.push((uid, e.to_string())),
            }
        }
        Ok(out)
    }

    /// The CDI spec a prepared claim's record says it has: its devices as planned (the
    /// GPU by its index, a MIG device's parent from the record), the vGPU limits from the
    /// claim's units record, each MIG instance the record names found in `inventory`
    /// with its access nodes. An error when any of it cannot be found (nothing written).
    fn expected_spec(
        &self,
        uid: &str,
        record: &PreparedClaim,
        inventory: &Inventory,
    ) -> Result<cdi::Spec, String> {
        let mut devices = Vec::new();
        for d in &record.devices {
            let kind = parse_device_name(&d.device)
                .ok_or_else(|| format!("device {} is not one the driver prepares", d.device))?;
            let index = match &kind {
                DeviceKind::Whole { gpu }
                | DeviceKind::Mig { gpu, .. }
                | DeviceKind::Vgpu { gpu } => *gpu,
            };
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| g.index == index)
                .ok_or_else(|| format!("GPU {index} is not in the inventory"))?;
            devices.push(PlannedDevice {
                request: d.request_names.first().cloned().unwrap_or_default(),
                pool: d.pool.clone(),
                device: d.device.clone(),
                kind,
                visible: gpu.uuid.clone(),
                share: None,
                mig: d.mig.clone(),
                time_slice: d.time_slice.as_ref().map(|t| t.interval),
            });
        }
        let vgpu = devices
            .iter()
            .any(|d| matches!(d.kind, DeviceKind::Vgpu { .. }));
        let limits = match vgpu {
            true => self
                .settings
                .alloc_dirs()
                .read_units(&claim_dir_id(uid))
                .map_err(|e| e.to_string())?
                .ok_or("a vGPU claim without its units record")?,
            false => Vec::new(),
        };
        let mut spec = claim_spec_with(uid, inventory, &devices, &limits, &self.settings);
        let migs: Vec<_> = devices
            .iter()
            .filter_map(|d| d.mig.as_ref().map(|m| (d, m)))
            .collect();
        if !migs.is_empty() {
            let caps = mig_caps(&self.settings.mig_caps)?;
            for (d, mig) in migs {
                let gpu = inventory
                    .gpu(&mig.gpu_uuid)
                    .ok_or_else(|| format!("GPU {} is gone", mig.gpu_uuid))?;
                let created = gpu
                    .mig_devices
                    .iter()
                    .find(|m| m.profile == mig.profile && m.start == mig.start)
                    .ok_or_else(|| format!("MIG {} at {} is gone", mig.profile, mig.start))?;
                let nodes = caps
                    .nodes(gpu.minor, created.gi_id, created.ci_id)
                    .map_err(|e| format!("MIG device {}: {e}", created.uuid))?;
                with_mig_instance(
                    &mut spec,
                    uid,
                    &d.device,
                    &mig.gpu_uuid,
                    &created.uuid,
                    nodes,
                );
            }
        }
        Ok(cdi::devroot::with_host_dev(spec, &self.settings.host_dev))
    }

    /// At start-up: roll back claims a crash left half-prepared (their MIG instances,
    /// time-slices and CDI specs), remove the CDI specs of claims the checkpoint does not
    /// hold as `Completed` (left by a crash before the `Started` record reached the file,
    /// or stale after a reboot), and after a reboot mark every claim for re-preparation. A
    /// corrupt checkpoint is replaced by an empty one (the kubelet re-sends the claims it
    /// needs). The snapshot is rewritten only when that changed it or the log holds
    /// records ([`Session::settle`]).
    pub fn recover(&self) -> Result<checkpoint::Loaded, String> {
        let session = self.checkpoint.session().map_err(|e| e.to_string())?;
        let _work = session.work();
        let before = session.view(|d| d.clone());
        let loaded = checkpoint::recover(before.clone(), &self.boot_id);
        for (uid, claim) in &loaded.rollback {
            warn!(claim = %format!("{}/{}", claim.namespace, claim.name), "rolling back a half-prepared claim");
            self.undo(uid, claim, &time_sliced_gpus(&loaded.data, uid))?;
        }
        self.remove_orphan_specs(&loaded.data)?;
        super::prepare::remove_orphan_claim_files(&self.settings, |uid| {
            completed(&loaded.data, uid).is_some()
        })
        .map_err(|e| e.to_string())?;
        if before != loaded.data {
            session.update(|d| *d = loaded.data.clone());
        }
        // The log folded into a new snapshot (only when it holds records, the change
        // above, or damage): a release that reads only the snapshot sees every claim.
        session.settle().map_err(|e| e.to_string())?;
        Ok(loaded)
    }

    /// Remove `tessera.io-claim-<uid>.json` (and a temporary file a crash left) for every
    /// claim that `data` does not hold as `Completed`.
    fn remove_orphan_specs(&self, data: &checkpoint::Data) -> Result<(), String> {
        let entries = match std::fs::read_dir(&self.cdi_root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("{}: {e}", self.cdi_root.display())),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(uid) = name
                .to_str()
                .map(|n| n.trim_start_matches('.'))
                .and_then(|n| n.strip_prefix("tessera.io-claim-"))
                .and_then(|n| n.strip_suffix(".json.tmp").or(n.strip_suffix(".json")))
            else {
                continue;
            };
            if completed(data, uid).is_none() {
                warn!(claim_uid = %uid, "removing the CDI spec of a claim that is not prepared");
                let path = entry.path();
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                }
            }
        }
        Ok(())
    }

    /// At start-up, after [`Self::recover`]: destroy MIG instances on `gpus` (the GPUs the
    /// DRA driver owns) that no checkpointed claim records, e.g. left by an earlier
    /// device-plugin layout, or created by a prepare whose `Started` record was lost.
    /// Returns how many were destroyed.
    pub fn destroy_unowned_migs(&self, gpus: &BTreeSet<String>) -> Result<usize, String> {
        let session = self.checkpoint.session().map_err(|e| e.to_string())?;
        let _work = session.work();
        let owned: BTreeSet<(String, String, u8)> = session.view(|data| {
            data.claims
                .values()
                .flat_map(|c| &c.devices)
                .filter_map(|d| d.mig.as_ref())
                .map(|m| (m.gpu_uuid.clone(), m.profile.clone(), m.start))
                .collect()
        });
        let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
        let mut destroyed = 0;
        for gpu in inventory.gpus.iter().filter(|g| gpus.contains(&g.uuid)) {
            let (keep, drop): (Vec<_>, Vec<_>) = gpu
                .mig_devices
                .iter()
                .partition(|m| owned.contains(&(gpu.uuid.clone(), m.profile.clone(), m.start)));
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
    /// default time-slice on its GPUs that are not in `still_time_sliced` (GPUs other
    /// claims time-slice).
    fn undo(
        &self,
        uid: &str,
        record: &PreparedClaim,
        still_time_sliced: &BTreeSet<String>,
    ) -> Result<(), String> {
        let spec = self.cdi_root.join(format!("tessera.io-claim-{uid}.json"));
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", spec.display())),
        }
        // The claim's vGPU limits and accounting go with it.
        super::prepare::remove_claim_files(&self.settings, uid).map_err(|e| e.to_string())?;
        if record.devices.iter().any(|d| d.mig.is_some()) {
            let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
            let mut layouts: BTreeMap<&str, Vec<(String, u8)>> = BTreeMap::new();
            for mig in record.devices.iter().filter_map(|d| d.mig.as_ref()) {
                let Some(gpu) = inventory.gpu(&mig.gpu_uuid) else {
                    continue;
                };
                let layout = layouts.entry(gpu.uuid.as_str()).or_insert_with(|| {
                    gpu.mig_devices
                        .iter()
                        .map(|m| (m.profile.clone(), m.start))
                        .collect()
                });
                layout.retain(|(p, s)| !(*p == mig.profile && *s == mig.start));
                self.backend
                    .apply_mig_layout(&mig.gpu_uuid, layout)
                    .map_err(|e| format!("destroying MIG {}: {e}", mig.profile))?;
            }
        }
        for ts in record.devices.iter().filter_map(|d| d.time_slice.as_ref()) {
            if !still_time_sliced.contains(&ts.gpu_uuid) {
                self.backend
                    .set_time_slice(&ts.gpu_uuid, TimeSlice::Default)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn unprepare_local(&self, c: &ClaimRef) -> Result<(), String> {
        let session = self.checkpoint.session().map_err(|e| e.to_string())?;
        let _mine = session.begin(&c.uid);
        let ticket = {
            let _work = session.work();
            let (record, others) =
                session.view(|d| (d.claims.get(&c.uid).cloned(), time_sliced_gpus(d, &c.uid)));
            // Unknown claims are fine: unprepare is idempotent.
            let Some(record) = record else {
                let empty = PreparedClaim {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    phase: Phase::Completed,
                    devices: Vec::new(),
                };
                return self.undo(&c.uid, &empty, &others);
            };
            self.undo(&c.uid, &record, &others)?;
            session.update(|d| d.claims.remove(&c.uid)).1
        };
        session
            .commit(ticket, Durability::Durable)
            .map_err(|e| e.to_string())
    }

    async fn unprepare_one(&self, c: &ClaimRef) -> Result<(), String> {
        let local = c.clone();
        self.blocking(move |me| me.unprepare_local(&local)).await?;
        // Withdraw our status.devices entries, also for a claim the checkpoint forgot (a
        // replaced corrupt checkpoint); the claim may already be gone. Queued behind the
        // claim's earlier write (a prepare's Ready), so it lands last.
        let cleared = self.status.enqueue(c, StatusOp::Clear);
        if tokio::time::timeout(UNPREPARE_STATUS_WAIT, cleared)
            .await
            .is_err()
        {
            warn!(claim = %c.name, "status.devices not cleared yet; answering, the write goes on");
        }
        Ok(())
    }
}

/// Wall time of each step of one prepare, logged at debug level on the
/// `tessera::dra::timing` target (`prepare steps claim=NS/NAME steps=get=210,lock=12,…`, in
/// µs): `benches/dra_node.rs` turns the target on and reports each step's p50/p99.
struct Steps {
    last: Instant,
    out: Vec<(&'static str, u64)>,
}

impl Steps {
    fn new() -> Self {
        Self {
            last: Instant::now(),
            out: Vec::new(),
        }
    }

    /// The time since the previous mark (or the start) was spent on `step`.
    fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.add(step, now - self.last);
        self.last = now;
    }

    fn add(&mut self, step: &'static str, d: std::time::Duration) {
        self.out.push((step, d.as_micros() as u64));
    }

    /// Take `inner`'s steps (run elsewhere), and count from now on.
    fn merge(&mut self, inner: Steps) {
        let back = inner.last.elapsed();
        self.out.extend(inner.out);
        self.add("hop_back", back);
        self.last = Instant::now();
    }

    fn log(&self, c: &ClaimRef) {
        if !tracing::enabled!(target: "tessera::dra::timing", tracing::Level::DEBUG) {
            return;
        }
        let steps: Vec<String> = self.out.iter().map(|(s, us)| format!("{s}={us}")).collect();
        debug!(target: "tessera::dra::timing", claim = %format!("{}/{}", c.namespace, c.name),
               steps = %steps.join(","), "prepare steps");
    }
}

/// What [`NodePreparer::verify_claim_specs`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SpecCheck {
    /// Claims whose spec was rewritten: (UID, what was wrong).
    pub repaired: Vec<(String, String)>,
    /// Claims whose spec could not be checked: (UID, why); their files are left alone.
    pub unchecked: Vec<(String, String)>,
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

/// The claim's record when it is prepared.
fn completed(data: &checkpoint::Data, uid: &str) -> Option<PreparedClaim> {
    data.claims
        .get(uid)
        .filter(|p| p.phase == Phase::Completed)
        .cloned()
}

/// The GPUs some claim other than `uid` time-slices.
fn time_sliced_gpus(data: &checkpoint::Data, uid: &str) -> BTreeSet<String> {
    data.claims
        .iter()
        .filter(|(other, _)| other.as_str() != uid)
        .flat_map(|(_, c)| &c.devices)
        .filter_map(|d| d.time_slice.as_ref())
        .map(|t| t.gpu_uuid.clone())
        .collect()
}

/// A file's identity: device, inode, size, modification time.
type FileId = (u64, u64, u64, i64, i64);

fn file_id(path: &std::path::Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

/// The driver's MIG capability table, read and parsed once and reused while both files
/// keep their identity ([`FileId`]): a claim costs a `stat` of each instead of a read and
/// a parse. A missing or unreadable file is still an error for every claim that needs it.
/// One memo per process, keyed by the paths (it caches file contents, nothing else).
fn mig_caps(paths: &MigCapsPaths) -> Result<Arc<MigCaps>, String> {
    type Memo = Option<(MigCapsPaths, [FileId; 2], Arc<MigCaps>)>;
    static MEMO: Mutex<Memo> = Mutex::new(None);
    let ids = match (file_id(&paths.mig_minors), file_id(&paths.proc_devices)) {
        (Ok(a), Ok(b)) => Some([a, b]),
        // `load` names the missing file.
        _ => None,
    };
    let mut memo = MEMO.lock().unwrap_or_else(PoisonError::into_inner);
    if let (Some(ids), Some((p, have, caps))) = (ids, memo.as_ref()) {
        if p == paths && *have == ids {
            return Ok(caps.clone());
        }
    }
    let caps = Arc::new(
        MigCaps::load(paths)
            .map_err(|e| format!("MIG devices need their capability nodes: {e}"))?,
    );
    if let Some(ids) = ids {
        *memo = Some((paths.clone(), ids, caps.clone()));
    }
    Ok(caps)
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
