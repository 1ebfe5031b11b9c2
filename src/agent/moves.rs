//! The agent's side of each GPU's ownership ([`super::handover`]): it reads the node (the
//! checkpoints, claims being prepared, the claims and slices on the API server), turns
//! what it read into the machine's events, and carries out the effects: the split put in
//! force for the DRA driver, MIG layouts freed, the split recorded, what each path
//! advertises rebuilt, blocked moves reported. Phase 2 of a move off the DRA driver
//! ([`super::withdraw`]) is driven from here too.
//!
//! ```text
//! apply ─▶ read holders ─▶ machine.step(Observed) per GPU ──┐ a GPU leaves the driver?
//!            ▲                                              ├─▶ LIST claims, observe again
//!            │ claims being prepared took a GPU             ▼
//!            └──────────────── commit the split for the DRA driver
//!                                  ─▶ free MIG of GPUs withdrawn from the device plugin
//!                                  ─▶ record the split ─▶ build ─▶ report effects
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::handover::{Action, Effect, Event, Machine, Paths, State};
use super::ownership::{self, Assignment, BlockedMove, Owner};
use super::{split_record, usage, withdraw, Agent, Built, Error, Result, CDI_SPEC_STEM};
use crate::cdi;
use crate::cdi::migcaps::MigCaps;
use crate::deviceplugin::topology::Topology;
use crate::dra::owned::{GpuSplit, OwnedDevices, SplitBefore};
use crate::gpu::Inventory;
use crate::partition::config::NodeConfig;
use crate::partition::layout;

/// Each GPU's path in `assignment`, for the DRA driver's [`OwnedDevices`].
fn split_of(inventory: &Inventory, assignment: &Assignment) -> Vec<GpuSplit> {
    inventory
        .gpus
        .iter()
        .map(|g| GpuSplit {
            index: g.index,
            uuid: g.uuid.clone(),
            dra: assignment.owner(g) == Owner::Dra,
        })
        .collect()
}

/// Add `more` (GPU UUID → holders) to `into`, without duplicates.
fn merge_holders(into: &mut BTreeMap<String, Vec<String>>, more: BTreeMap<String, Vec<String>>) {
    for (uuid, who) in more {
        let list = into.entry(uuid).or_default();
        for w in who {
            if !list.contains(&w) {
                list.push(w);
            }
        }
    }
}

/// Whether `a` and `b` put the same split in force (a decided one).
fn same_split(a: &Machine, b: &Machine) -> bool {
    a.decided() && a.owners() == b.owners() && a.withdrawing() == b.withdrawing()
}

/// What one apply read besides the holders: the inventory, the config, phase 2's LIST.
struct Reading<'a> {
    before: &'a Inventory,
    config: &'a NodeConfig,
    phase2: &'a BTreeMap<String, Vec<String>>,
}

/// What one apply decided: the machine after it and the effects of getting there.
struct Decided {
    next: Machine,
    effects: Vec<Effect>,
}

impl Agent {
    /// Apply the config in force again when a blocked move may have become possible.
    pub(super) async fn recheck(&mut self) {
        if self.gpus.blocked().next().is_none() {
            return;
        }
        let Some(config) = self.current.clone() else {
            return;
        };
        if let Err(e) = self.apply(config).await {
            warn!(error = %e, "cannot re-apply the config to move GPUs between paths");
        }
    }

    /// Phase 2 of the moves off the DRA driver ([`withdraw`]): once the API server's slices
    /// name none of the withdrawing GPUs (for `move_settle`), LIST the claims allocated on
    /// this node and let the machine hand the GPUs no claim slipped onto to the device
    /// plugin and take the others back (a `GpuMoveBlocked` Event names the claim). Errors
    /// are retried.
    pub(super) async fn confirm_withdrawal(&mut self) {
        let withdrawing = self.gpus.withdrawing();
        if withdrawing.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        // Unless told otherwise below: the watch's next event, or the slow poll.
        self.next_confirm = now + withdraw::MOVE_POLL;
        let (Some((client, node)), Some(config)) = (self.claims_api.clone(), self.current.clone())
        else {
            return;
        };
        let inventory = match self.backend.inventory() {
            Ok(i) => i,
            Err(e) => return warn!(error = %e, "no GPU inventory: GPU moves wait"),
        };
        let timeout = Duration::from_secs(5);
        let unanswered = |e: String| format!("the API server does not answer ({e})");
        match withdraw::list_published(client.clone(), &node, &inventory, timeout).await {
            Ok(published) if published.is_disjoint(&withdrawing) => {}
            Ok(published) => {
                self.clear_since = None;
                self.feed(&withdrawing, || Event::SlicesNamed);
                let named: BTreeSet<String> =
                    published.intersection(&withdrawing).cloned().collect();
                return self.stalled(
                    &inventory,
                    &named,
                    "this node's ResourceSlices on the API server still name it (the DRA \
                     driver has not published its slices without it; see its \
                     \"ResourceSlices not published\" warnings)",
                );
            }
            Err(e) => {
                self.next_confirm = now + withdraw::MOVE_RETRY;
                return self.stalled(&inventory, &withdrawing, &unanswered(e));
            }
        }
        let since = *self.clear_since.get_or_insert(now);
        if since.elapsed() < self.move_settle {
            self.next_confirm = since + self.move_settle;
            return;
        }
        self.feed(&withdrawing, || Event::SlicesCleared);
        let allocated = match usage::list_allocated(client, &node, &inventory, timeout).await {
            Ok(a) => a,
            Err(e) => {
                self.next_confirm = now + withdraw::MOVE_RETRY;
                return self.stalled(&inventory, &withdrawing, &unanswered(e));
            }
        };
        let listed: BTreeMap<String, Vec<String>> = self
            .gpus
            .awaiting_claims()
            .into_iter()
            .map(|uuid| {
                let who = allocated.get(&uuid).cloned().unwrap_or_default();
                if !who.is_empty() {
                    warn!(gpu = %uuid, claims = ?who,
                        "a claim was allocated on a GPU while it left the DRA driver; it goes back to the driver");
                }
                (uuid, who)
            })
            .collect();
        if let Err(e) = self.apply_with(config, &listed).await {
            self.next_confirm = now + withdraw::MOVE_RETRY;
            warn!(error = %e, "cannot finish moving GPUs off the DRA driver; retrying");
        }
    }

    /// Feed `event` to each of `gpus` (phase 2's bookkeeping: no GPU changes path).
    fn feed(&mut self, gpus: &BTreeSet<String>, event: impl Fn() -> Event) {
        for uuid in gpus {
            for effect in self.gpus.step(uuid, event()) {
                debug!(gpu = %effect.gpu, action = ?effect.action, "phase 2 of a GPU move");
            }
        }
    }

    /// Watch this node's slices while a move off the DRA driver is pending, and only then.
    pub(super) fn follow_slices_while_withdrawing(&mut self) {
        match (&self.following, self.gpus.withdrawing().is_empty()) {
            (None, false) => {
                let Some((client, node)) = self.claims_api.clone() else {
                    return;
                };
                let stop = CancellationToken::new();
                tokio::spawn(withdraw::follow_slices(
                    client,
                    node,
                    self.slices_changed.clone(),
                    withdraw::MOVE_RETRY,
                    stop.clone(),
                ));
                self.following = Some(stop);
            }
            (Some(stop), true) => {
                stop.cancel();
                self.following = None;
            }
            _ => {}
        }
    }

    /// Phase 2 could not finish for `gpus` because of `reason`: once it has waited
    /// `move_stall_warn`, warn naming each GPU and the reason (then at most once per that
    /// interval), record one `GpuMoveStalled` Event per GPU and wait, and set the gauge.
    /// Nothing else changes: the next look (watch event, retry or poll) retries.
    fn stalled(&mut self, inventory: &Inventory, gpus: &BTreeSet<String>, reason: &str) {
        let Some(waited) = self
            .stall
            .due(tokio::time::Instant::now(), self.move_stall_warn)
        else {
            return;
        };
        self.opts.metrics.gpu_moves_stalled.set(gpus.len() as i64);
        for uuid in gpus {
            let index = inventory
                .gpu(uuid)
                .map_or_else(|| "?".to_string(), |g| g.index.to_string());
            let message = format!(
                "GPU {index} ({uuid}) is on neither kubelet path: its move off the DRA driver \
                 has waited {:.1} s because {reason}; retrying",
                waited.as_secs_f64()
            );
            if self.stall.first_report(uuid) {
                self.recorder.gpu_move_stalled(&message);
            } else {
                warn!(%message, "GPU move off the DRA driver stalled");
            }
        }
    }

    /// At start (no split in force yet): the GPUs an earlier run may have given the DRA
    /// driver that `assignment` gives to the device plugin ([`withdraw::inherited`]), and
    /// the claims LIST made to find them. Nothing is listed when DRA is off or no GPU
    /// goes to the device plugin. A GPU the kubelet records as the device plugin's (its
    /// checkpoint: listed by it last, or held by a pod) was not the driver's. When the API
    /// server cannot say, every other GPU the assignment gives to the device plugin counts
    /// as the driver's (it then waits in phase 2, on neither path, until the API server
    /// answers).
    async fn inherited_split(
        &self,
        before: &Inventory,
        assignment: &Assignment,
        holders: &ownership::Holders,
    ) -> (
        BTreeSet<String>,
        Option<std::result::Result<BTreeMap<String, Vec<String>>, String>>,
    ) {
        let (Some(_), Some((client, node))) = (&self.owned, &self.claims_api) else {
            return (BTreeSet::new(), None);
        };
        let to_device_plugin: BTreeSet<String> = before
            .gpus
            .iter()
            .filter(|g| assignment.owner(g) == Owner::DevicePlugin)
            .map(|g| g.uuid.clone())
            .collect();
        if to_device_plugin.is_empty() || !assignment.device_plugin {
            return (BTreeSet::new(), None);
        }
        if let Some(gpus) = self.recorded_split(before, holders) {
            return (gpus, None);
        }
        // Both paths wait for this answer at start: bounded tighter than later LISTs.
        let found = withdraw::inherited(client.clone(), node, before, Duration::from_secs(2)).await;
        // What the kubelet records as the device plugin's was not the driver's.
        let mut device_plugin = self.usage.device_plugin_registered(before);
        device_plugin.extend(holders.device_plugin.keys().cloned());
        let gpus = match (&found.published, &found.allocated) {
            (Ok(published), Ok(allocated)) => {
                withdraw::inherited_gpus(published, allocated, &holders.dra, &device_plugin)
            }
            (Err(e), _) | (_, Err(e)) => {
                let unknown: BTreeSet<String> = to_device_plugin
                    .difference(&device_plugin)
                    .cloned()
                    .collect();
                if !unknown.is_empty() {
                    warn!(error = %e, gpus = unknown.len(),
                        "the DRA driver's split before this start is not known: GPUs the config gives to the device plugin wait until the API server answers");
                }
                unknown
            }
        };
        let moving: BTreeSet<String> = gpus.intersection(&to_device_plugin).cloned().collect();
        if !moving.is_empty() {
            info!(gpus = ?moving, "GPUs the DRA driver may have had before this start go to the device plugin: they move in two phases");
        }
        (gpus, Some(found.allocated))
    }

    /// At start: the GPUs the DRA driver had before, from the split record
    /// ([`split_record`]) plus the GPUs the DRA checkpoint's claims hold. `None` (with a
    /// log line saying why) when there is no record, it cannot be read, or it does not
    /// cover every GPU of the node: the caller then infers the split.
    fn recorded_split(
        &self,
        before: &Inventory,
        holders: &ownership::Holders,
    ) -> Option<BTreeSet<String>> {
        let path = self.split_record.as_ref()?;
        let inferring = "inferring the split before this start from the DRA checkpoint, this \
                         node's ResourceSlices, the claims allocated on it and the kubelet's \
                         device checkpoint";
        let record = match split_record::read(path) {
            Ok(r) => r,
            Err(e @ split_record::ReadError::Missing { .. }) => {
                info!(reason = %e, "{inferring}");
                return None;
            }
            Err(e) => {
                warn!(error = %e, "{inferring}");
                return None;
            }
        };
        let Some(mut gpus) = record.previous_dra(before.gpus.iter().map(|g| &g.uuid)) else {
            warn!(path = %path.display(), "the split record does not name every GPU of this node (one was added or replaced); {inferring}");
            return None;
        };
        info!(path = %path.display(), dra = ?record.dra, withdrawing = ?record.withdrawing,
              config = %record.config,
              "the split before this start is recorded: GPUs the DRA driver had that now go to the device plugin move in two phases, the others go at once");
        gpus.extend(holders.dra.keys().cloned());
        Some(gpus)
    }

    /// Record the split about to be put in force (`staged`: the DRA driver's GPUs with
    /// the withdrawing ones; written before anything is advertised for it). When the
    /// record cannot be written it is removed, so the next start infers the split rather
    /// than trust an old one.
    fn record_split(
        &mut self,
        inventory: &Inventory,
        config: &NodeConfig,
        staged: &Assignment,
        withdrawing: &BTreeSet<String>,
    ) {
        let Some(path) = &self.split_record else {
            return;
        };
        let dra = staged.dra_uuids(inventory);
        let record = split_record::Recorded {
            device_plugin: inventory
                .gpus
                .iter()
                .map(|g| g.uuid.clone())
                .filter(|u| !dra.contains(u))
                .collect(),
            withdrawing: withdrawing.intersection(&dra).cloned().collect(),
            dra,
            config: config.name.clone(),
        };
        if self.recorded.as_ref() == Some(&record) {
            return;
        }
        match split_record::write(path, &record) {
            Ok(()) => self.recorded = Some(record),
            Err(e) => {
                warn!(error = %e, "the split is not recorded; the next start infers it");
                self.recorded = None;
                if let Err(e) = split_record::remove(path) {
                    error!(error = %e, path = %path.display(), "cannot remove the outdated split record: the next start may take it for the split in force");
                }
            }
        }
    }

    pub(super) async fn apply(&mut self, config: NodeConfig) -> Result<bool> {
        self.apply_with(config, &BTreeMap::new()).await
    }

    /// The paths that run, for the machine.
    pub(super) fn paths(&self) -> Paths {
        Paths {
            device_plugin: self.ownership.device_plugin,
            dra: self.ownership.dra,
        }
    }

    /// The split `machine` puts in force.
    pub(super) fn assignment_of(&self, machine: &Machine) -> Assignment {
        Assignment::from_owners(
            self.ownership.device_plugin,
            self.ownership.dra,
            machine.owners(),
        )
    }

    /// Who holds each GPU: the checkpoints, and claims being prepared right now (their
    /// checkpoint record may not be written yet).
    fn read_holders(&self, inventory: &Inventory) -> ownership::Holders {
        let mut holders = self.usage.holders(inventory);
        if let Some(owned) = &self.owned {
            merge_holders(&mut holders.dra, owned.in_flight());
        }
        holders
    }

    /// `base` fed one reading of the node per GPU of `inventory`: `holders`, phase 2's
    /// `listed` claims, and the path `config` wants.
    fn observe(
        &self,
        mut base: Machine,
        inventory: &Inventory,
        config: &NodeConfig,
        holders: &ownership::Holders,
        listed: &BTreeMap<String, Vec<String>>,
    ) -> Decided {
        base.retain(&inventory.gpus.iter().map(|g| g.uuid.clone()).collect());
        let started = base.decided();
        let mut effects = Vec::new();
        for gpu in &inventory.gpus {
            let held = |map: &BTreeMap<String, Vec<String>>| {
                map.get(&gpu.uuid).cloned().unwrap_or_default()
            };
            // A GPU that appears after the start was nobody's: it starts with the device
            // plugin, as every GPU did before a split.
            if started && base.state(&gpu.uuid) == State::Unowned && base.paths().device_plugin {
                base.step(&gpu.uuid, Event::Restored(Owner::DevicePlugin));
            }
            effects.extend(base.step(
                &gpu.uuid,
                Event::Observed {
                    wants: self.ownership.desired(gpu, config),
                    device_plugin: held(&holders.device_plugin),
                    dra: held(&holders.dra),
                    listed: listed.get(&gpu.uuid).cloned(),
                },
            ));
        }
        Decided {
            next: base,
            effects,
        }
    }

    /// The machine this apply starts from: the one in force, or at start one that knows
    /// which GPUs an earlier run left with the DRA driver ([`Self::inherited_split`]),
    /// with the claims LIST made to find them.
    async fn base(
        &self,
        before: &Inventory,
        config: &NodeConfig,
        holders: &ownership::Holders,
    ) -> (
        Machine,
        Option<std::result::Result<BTreeMap<String, Vec<String>>, String>>,
    ) {
        if self.gpus.decided() {
            return (self.gpus.clone(), None);
        }
        let fresh = Machine::new(self.paths());
        let first = self.observe(fresh.clone(), before, config, holders, &BTreeMap::new());
        let assignment = self.assignment_of(&first.next);
        let (inherited, listed) = self.inherited_split(before, &assignment, holders).await;
        let mut base = fresh;
        for gpu in &before.gpus {
            if inherited.contains(&gpu.uuid) {
                base.step(&gpu.uuid, Event::Restored(Owner::Dra));
            }
        }
        (base, listed)
    }

    /// Decide the split: observe the node from `base`; when a GPU is about to leave the
    /// DRA driver, a claim allocated on it but not prepared yet holds it too (one LIST,
    /// only then; `listed`: the one made at start) and the node is observed again.
    async fn decide(
        &self,
        base: &Machine,
        before: &Inventory,
        config: &NodeConfig,
        holders: &mut ownership::Holders,
        phase2: &BTreeMap<String, Vec<String>>,
        listed: Option<std::result::Result<BTreeMap<String, Vec<String>>, String>>,
    ) -> Decided {
        let decided = self.observe(base.clone(), before, config, holders, phase2);
        let (was, now) = (base.owners(), decided.next.owners());
        let leaving: Vec<&String> = was
            .iter()
            .filter(|(uuid, o)| **o == Owner::Dra && now.get(*uuid) == Some(&Owner::DevicePlugin))
            .map(|(uuid, _)| uuid)
            .collect();
        let Some((client, node)) = self.claims_api.as_ref().filter(|_| !leaving.is_empty()) else {
            return decided;
        };
        let allocated = match listed {
            Some(listed) => listed,
            None => {
                usage::list_allocated(client.clone(), node, before, Duration::from_secs(5)).await
            }
        };
        let allocated = match allocated {
            Ok(a) => a,
            // At start the GPUs are not served by either path yet: they wait in phase 2,
            // which lists the claims again before the device plugin gets them.
            Err(e) if !base.decided() => {
                warn!(error = %e, "cannot list ResourceClaims at start: GPUs the config gives to the device plugin wait until the API server answers");
                BTreeMap::new()
            }
            // Unknown: keep the GPUs where they are and retry.
            Err(e) => leaving
                .iter()
                .map(|u| (u.to_string(), vec![format!("(not known: {e})")]))
                .collect(),
        };
        for uuid in leaving {
            let Some(who) = allocated.get(uuid) else {
                continue;
            };
            let list = holders.dra.entry(uuid.clone()).or_default();
            for w in who {
                // A prepared claim is already listed from the checkpoint.
                if !list.contains(&w.replace(", allocated)", ")")) && !list.contains(w) {
                    list.push(w.clone());
                }
            }
        }
        self.observe(base.clone(), before, config, holders, phase2)
    }

    /// [`Self::apply`] with phase 2's LIST (`phase2`: withdrawing GPU → the claims
    /// allocated on it).
    pub(super) async fn apply_with(
        &mut self,
        config: NodeConfig,
        phase2: &BTreeMap<String, Vec<String>>,
    ) -> Result<bool> {
        let before = self.backend.inventory()?;
        // `/readyz` on a node without a GPU (from this inventory: no extra driver call).
        self.opts.metrics.probes.gpus(before.gpus.len());
        let mut holders = self.read_holders(&before);
        let (base, listed) = self.base(&before, &config, &holders).await;
        let mut decided = self
            .decide(&base, &before, &config, &mut holders, phase2, listed)
            .await;
        if self.unchanged(&before, &config, &decided) {
            return Ok(false);
        }
        if self.current.as_ref() != Some(&config) {
            if let Some(note) = self.ownership.config_note(&config) {
                info!(config = %config.name, "{note}");
            }
        }
        // GPUs the DRA driver takes over lose the device plugin's MIG layout: the driver
        // creates instances per claim in slots it assumes free. Only once the config is
        // known to fit the GPUs (a rejected config must change nothing), and gives no
        // resource name of the device plugin two meanings.
        let plan = layout::plan(&before, &config)?;
        let assignment = self.assignment_of(&decided.next);
        let (_, device_plugin_plan) = assignment.part(&before, &plan, Owner::DevicePlugin);
        layout::check_split_names(&before, &config, &device_plugin_plan)?;
        // Put the split in force for the DRA driver before anything is built for it: from
        // here on it refuses claims on the GPUs it gives up.
        let split_before = match &self.owned {
            Some(owned) => {
                let read = Reading {
                    before: &before,
                    config: &config,
                    phase2,
                };
                let split;
                (decided, split) = self.commit_split(owned, &base, &read, &mut holders, decided)?;
                if self.unchanged(&before, &config, &decided) {
                    return Ok(false);
                }
                Some(split)
            }
            None => None,
        };
        let built = match self.take_over_and_build(&before, &config, &decided) {
            Ok(built) => built,
            Err(e) => {
                if let (Some(owned), Some(split)) = (&self.owned, split_before) {
                    owned.restore(split);
                }
                return Err(e);
            }
        };
        self.put_in_force(&before, config, decided, built)?;
        Ok(true)
    }

    /// Whether `decided` changes nothing under `config` (then its reports are carried
    /// out and it is kept: only holders changed).
    fn unchanged(&mut self, inventory: &Inventory, config: &NodeConfig, decided: &Decided) -> bool {
        if self.current.as_ref() != Some(config) || !same_split(&self.gpus, &decided.next) {
            return false;
        }
        debug!(
            blocked = decided.next.blocked().count(),
            "config re-applied: nothing moves"
        );
        self.gpus = decided.next.clone();
        self.carry_out(inventory, &decided.effects);
        true
    }

    /// The split `decided` is built (`built`): record it, write the CDI spec, hand each
    /// path its part, and carry out the effects.
    fn put_in_force(
        &mut self,
        before: &Inventory,
        config: NodeConfig,
        decided: Decided,
        built: Built,
    ) -> Result<()> {
        let withdrawing = decided.next.withdrawing();
        let assignment = self.assignment_of(&decided.next);
        // Withdrawing GPUs stay off the device plugin (no MIG layout, not listed) until
        // their move is confirmed.
        let staged = assignment.with_dra(&withdrawing);
        self.record_split(before, &config, &staged, &withdrawing);
        let (inventory, _) = staged.part(&built.inventory, &built.plan, Owner::DevicePlugin);
        if assignment.device_plugin && !inventory.gpus.is_empty() {
            self.write_cdi(&inventory)?;
        }
        if let Some(view) = built.dra {
            self.send_dra_view(view, &withdrawing);
        }
        if withdrawing != self.gpus.withdrawing() {
            self.clear_since = None;
            // Phase 2 of a new move starts at once.
            self.next_confirm = tokio::time::Instant::now();
            if self.stall.warned() {
                info!(gpus = ?withdrawing, "the stalled GPU move off the DRA driver went on");
            }
            self.stall = withdraw::Stall::default();
            self.opts.metrics.gpu_moves_stalled.set(0);
        }
        self.gpus = decided.next;
        self.health.set_policy(config.health.clone());
        self.snapshot.advertisement = built.advertisement;
        self.snapshot.allocation = config.allocation.clone();
        self.snapshot.topology = Topology::from_inventory(&inventory);
        self.dp_inventory = inventory;
        info!(config = %config.name, resources = ?self.snapshot.resource_names(),
              dra_gpus = assignment.dra_uuids(before).len(), "config applied");
        self.current = Some(config);
        self.carry_out(before, &decided.effects);
        self.publish();
        Ok(())
    }

    /// Write the CDI spec of the device plugin's GPUs.
    fn write_cdi(&mut self, inventory: &Inventory) -> Result<()> {
        // The capability table is read only when there is a MIG device to resolve.
        let has_mig = inventory.gpus.iter().any(|g| !g.mig_devices.is_empty());
        let caps = has_mig
            .then(|| MigCaps::load(&self.opts.allocate.mig_caps))
            .and_then(|r| {
                r.map_err(|e| warn!(error = %e, "MIG devices in the CDI spec lack their capability nodes"))
                    .ok()
            });
        let spec = cdi::devroot::with_host_dev(
            cdi::node_spec_with(inventory, &self.opts.dev_root, caps.as_ref()),
            &self.opts.allocate.host_dev,
        );
        cdi::write_spec(&self.opts.cdi_root, CDI_SPEC_STEM, &spec)?;
        self.cdi_written = Some(spec);
        Ok(())
    }

    /// Hand the DRA driver its GPUs, less the `withdrawing` ones.
    fn send_dra_view(&mut self, mut view: super::dra::DraView, withdrawing: &BTreeSet<String>) {
        // Serve while the driver owns a GPU, or a move off it is being confirmed and it
        // already serves (a driver that does not serve, e.g. at start, does not begin to
        // only to withdraw).
        let with_withdrawing = view.inventory.gpus.len();
        view.inventory
            .gpus
            .retain(|g| !withdrawing.contains(&g.uuid));
        view.plan.gpus.retain(|uuid, _| !withdrawing.contains(uuid));
        view.active = self.ownership.dra_serves(view.inventory.gpus.len())
            || (self.dra_serving && self.ownership.dra_serves(with_withdrawing));
        self.dra_serving = view.active;
        info!(
            gpus = view.inventory.gpus.len(),
            withdrawing = withdrawing.len(),
            active = view.active,
            "DRA devices updated"
        );
        self.dra_tx.send_replace(Some(view));
    }

    /// Carry out what the machine asked for besides building: report blocked moves
    /// (once per move), log the rest. Publishing and withdrawing happened in the build.
    fn carry_out(&self, inventory: &Inventory, effects: &[Effect]) {
        let index = |uuid: &str| inventory.gpu(uuid).map(|g| g.index);
        for Effect { gpu, action } in effects {
            match action {
                Action::ReportBlocked { at, wants, by } => {
                    let blocked = BlockedMove {
                        gpu_uuid: gpu.clone(),
                        gpu_index: index(gpu).unwrap_or_default(),
                        from: *at,
                        to: *wants,
                        holders: by.clone(),
                    };
                    self.recorder.gpu_move_blocked(&blocked.to_string());
                }
                Action::Unblocked { was_at, wanted } => {
                    info!(gpu = %gpu, stays = %was_at, wanted = %wanted, "GPU no longer held: its move between paths is no longer blocked");
                }
                Action::Warn(why) => warn!(gpu = %gpu, %why, "unexpected GPU ownership event"),
                Action::ListClaims => debug!(gpu = %gpu, "phase 2: listing claims"),
                other => info!(gpu = %gpu, action = ?other, "GPU moved between kubelet paths"),
            }
        }
    }

    /// Put the split `decided` gives in force in `owned`. A GPU it takes from the DRA
    /// driver that a claim is being prepared on (or got prepared on since `holders` was
    /// read) stays with the driver: the holders are added, the node observed again from
    /// `base`, and the split tried again (each round pins at least one more GPU, so this
    /// ends). Returns the split decided and the one it replaced.
    fn commit_split(
        &self,
        owned: &OwnedDevices,
        base: &Machine,
        read: &Reading,
        holders: &mut ownership::Holders,
        mut decided: Decided,
    ) -> Result<(Decided, SplitBefore)> {
        let Reading {
            before,
            config,
            phase2,
        } = *read;
        let cause = match self.gpus.decided() {
            false => format!("the agent's start (config {:?})", config.name),
            true => format!(
                "the config reload applied at {} (config {:?})",
                k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                config.name
            ),
        };
        let usage = self.usage.clone();
        for _ in 0..=before.gpus.len() {
            let split = split_of(before, &self.assignment_of(&decided.next));
            match owned.try_set_split(&split, &cause, || usage.holders(before).dra) {
                Ok(replaced) => return Ok((decided, replaced)),
                Err(held) => {
                    merge_holders(&mut holders.dra, held);
                    decided = self.observe(base.clone(), before, config, holders, phase2);
                }
            }
        }
        Err(Error::Split(
            "the GPUs kept being taken by new claims while the split was decided".into(),
        ))
    }

    /// Destroy the device plugin's MIG instances on GPUs the DRA driver takes over (the
    /// machine withdrew them from the device plugin), then build the node's devices for
    /// the split `decided` stages (withdrawing GPUs on the DRA side).
    fn take_over_and_build(
        &self,
        before: &Inventory,
        config: &NodeConfig,
        decided: &Decided,
    ) -> Result<Built> {
        for effect in &decided.effects {
            let uuid = &effect.gpu;
            if effect.action == Action::WithdrawFromDevicePlugin
                && decided.next.owners().get(uuid) == Some(&Owner::Dra)
                && before.gpu(uuid).is_some_and(|g| !g.mig_devices.is_empty())
            {
                info!(gpu = %uuid, "destroying the device plugin's MIG instances of a GPU moving to the DRA driver");
                self.backend.apply_mig_layout(uuid, &[])?;
            }
        }
        let withdrawing = decided.next.withdrawing();
        let staged = self.assignment_of(&decided.next).with_dra(&withdrawing);
        super::build_owned(self.backend.as_ref(), config, &staged)
    }
}
