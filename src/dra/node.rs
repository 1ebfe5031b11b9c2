//! The real [`ClaimPreparer`]: NodePrepareResources / NodeUnprepareResources on this node.
//!
//! ```text
//! prepare(claim) ── lock checkpoint ── already Completed? ──▶ answer from the checkpoint
//!                      │ no
//!                      ▼
//!   GET claim ─▶ plan_claim (pure) ─▶ checkpoint: Started ─▶ create MIG instances
//!   ─▶ write the claim's CDI spec ─▶ accounting dir (vGPU) ─▶ checkpoint: Completed
//! unprepare(claim) ── remove CDI spec ─▶ destroy its MIG instances ─▶ drop from checkpoint
//! ```
//!
//! A failure between Started and Completed leaves the claim `Started`: the next start of
//! the agent rolls it back (see [`super::checkpoint::recover`]); a retried prepare redoes
//! it from scratch (every step is idempotent).

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use kube::Client;
use tracing::{info, instrument, warn};

use super::checkpoint::{self, Phase, PreparedClaim, Store};
use super::plugin::{ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice};
use super::prepare::{cdi_device_name, plan_claim, ClaimPlan};
use crate::cdi;
use crate::deviceplugin::allocate::AllocateSettings;
use crate::gpu::GpuBackend;

/// Prepares claims on this node.
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

    async fn prepare_one(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let mut data = self.read_checkpoint();
        data.boot_id = self.boot_id.clone();
        if let Some(done) = data
            .claims
            .get(&c.uid)
            .filter(|p| p.phase == Phase::Completed)
        {
            return Ok(answer(done));
        }
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let claim = claims
            .get(&c.name)
            .await
            .map_err(|e| format!("cannot read claim {}/{}: {e}", c.namespace, c.name))?;
        let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
        let plan = plan_claim(&claim, &c.uid, &self.node, &inventory, &self.settings)
            .map_err(|e| e.to_string())?;
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
                })
                .collect(),
        };
        data.claims.insert(c.uid.clone(), record.clone());
        self.checkpoint.write(&data).map_err(|e| e.to_string())?;

        let spec = self.apply(&c.uid, plan)?;
        cdi::write_spec(
            &self.cdi_root,
            &format!("tessera.io-claim-{}", c.uid),
            &spec,
        )
        .map_err(|e| e.to_string())?;

        record.phase = Phase::Completed;
        data.claims.insert(c.uid.clone(), record.clone());
        self.checkpoint.write(&data).map_err(|e| e.to_string())?;
        info!(claim = %format!("{}/{}", c.namespace, c.name), devices = record.devices.len(), "claim prepared");
        Ok(answer(&record))
    }

    /// Side effects: MIG instances (their UUIDs replace the parent GPU in the visible
    /// devices) and the vGPU accounting directory. Returns the final CDI spec.
    fn apply(&self, uid: &str, plan: ClaimPlan) -> Result<cdi::Spec, String> {
        let mut spec = plan.cdi;
        for d in &plan.devices {
            let Some(mig) = &d.mig else { continue };
            let inventory = self.backend.inventory().map_err(|e| e.to_string())?;
            let gpu = inventory
                .gpu(&mig.gpu_uuid)
                .ok_or_else(|| format!("GPU {} is gone", mig.gpu_uuid))?;
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
        Ok(spec)
    }

    /// At start-up: roll back claims a crash left half-prepared (their MIG instances and
    /// CDI specs), and after a reboot mark every claim for re-preparation. A corrupt
    /// checkpoint is replaced by an empty one (the kubelet re-sends the claims it needs).
    pub fn recover(&self) -> Result<checkpoint::Loaded, String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let loaded = checkpoint::recover(self.read_checkpoint(), &self.boot_id);
        for (uid, claim) in &loaded.rollback {
            warn!(claim = %format!("{}/{}", claim.namespace, claim.name), "rolling back a half-prepared claim");
            self.undo(uid, claim)?;
        }
        self.checkpoint
            .write(&loaded.data)
            .map_err(|e| e.to_string())?;
        Ok(loaded)
    }

    /// Remove a claim's CDI spec and destroy the MIG instances it recorded.
    fn undo(&self, uid: &str, record: &PreparedClaim) -> Result<(), String> {
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
        Ok(())
    }

    fn unprepare_one(&self, c: &ClaimRef) -> Result<(), String> {
        let _lock = self.checkpoint.lock().map_err(|e| e.to_string())?;
        let mut data = self.read_checkpoint();
        let record = data.claims.get(&c.uid).cloned().unwrap_or(PreparedClaim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            phase: Phase::Completed,
            devices: Vec::new(),
        });
        self.undo(&c.uid, &record)?;
        // Unknown claims are fine: unprepare is idempotent.
        data.claims.remove(&c.uid);
        self.checkpoint.write(&data).map_err(|e| e.to_string())
    }
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
        claims
            .into_iter()
            .map(|c| {
                let r = self.unprepare_one(&c);
                (c.uid, r)
            })
            .collect()
    }
}
