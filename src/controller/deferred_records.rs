//! Writes that do not hold a pass up. First the record updates that only tell a waiting
//! workload its reason and place ([`deferrable`]): an admission from the head of a long
//! queue moves the places of dozens of waiting workloads, one record write each; the
//! pass writes its admissions, evictions and pod statuses, hands those place writes to a
//! task and returns. Then, when passes assume admissions
//! (`PassState::assuming_admissions`, what `tessera controller` runs), the whole of a
//! plan that only admits, records readiness, evicts for a pods-ready timeout and tells
//! reasons ([`Plan`]): its ungates, readiness records, evictions with their requeue
//! state, Events, reasons, queue status and records go to the task too, as Kueue's
//! scheduler assumes a workload in its cache and writes its admission from a
//! goroutine; until each admission's (readiness record's, eviction's) writes are
//! answered the workload is in [`Writing`], which the passes after it read.
//!
//! ```text
//! pass ─► plan ─┬─ admits, readiness, timeouts, reasons (assumed) ─► Writing ◄─ answered ─┐
//!               │                                                                        │
//!               │      task (after the one before it): the plan's writes ────────────────┘ ─► the places
//!               └─ the rest ─► written in the pass (after the tasks that write plans)
//!        records ─┬─ deferrable ─► ask the place (cache.asked_places) ─► task
//!                 └─ the rest ──► written in the pass, or by the plan's task
//! ```
//! Order per record holds: each task first waits for the one before it, and a pass that
//! writes a record a running task also writes waits for that task first. A pass reads a
//! record's place through the asks not yet answered ([`super::asked_places`]). A write
//! that failed is tried again with the next pass's, unless that pass wrote the record
//! itself (its update replaces the failed one); a plan's record updates that failed are
//! written first by the next pass, and a failure wakes the controller's loop.

use super::asked_places::Ticket;
use super::cache::Cache;
use super::incremental::Assumed;
use super::time::Millis;
use super::workload_record::Update;
use super::workload_writer;
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Whether `u` only tells a waiting workload its reason and place (a `Pending` action's
/// update: no admission, a place, no requeue state, which a pass reads back).
pub fn deferrable(u: &Update) -> bool {
    matches!(u.admission, Some(None)) && u.position.is_some() && u.requeue_state.is_none()
}

/// This pass's record updates split into those written in the pass and those deferred:
/// the deferrable ones of records that no other update of the pass writes (a record's
/// updates keep their order).
pub fn split(records: Vec<Update>) -> (Vec<Update>, Vec<Update>) {
    let written_now: BTreeSet<String> = records
        .iter()
        .filter(|u| !deferrable(u))
        .map(|u| u.key.clone())
        .collect();
    records
        .into_iter()
        .partition(|u| !deferrable(u) || written_now.contains(&u.key))
}

/// One deferred update and the ticket of its ask.
#[derive(Clone, Debug)]
struct Asked {
    update: Update,
    ticket: Ticket,
}

/// The workloads whose admission, readiness record or pods-ready eviction is written
/// behind its pass, by key: passes assume those writes ([`Assumed`]: the kept engine
/// holds them admitted while their objects still show them waiting, recorded Ready
/// while their objects do not say so yet, and does not evict them again). A key leaves
/// once its objects' writes are answered, landed or failed.
#[derive(Debug, Default)]
pub struct Writing(Mutex<Assumed>);

impl Writing {
    fn lock(&self) -> MutexGuard<'_, Assumed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writes under way now.
    pub fn now(&self) -> Assumed {
        self.lock().clone()
    }

    /// Workload `key`'s writes are answered.
    pub fn answered(&self, key: &str) {
        let mut w = self.lock();
        w.recorded.remove(key);
        w.evicting.remove(key);
    }

    fn start(&self, plan: &Assumed) {
        let mut w = self.lock();
        w.recorded.extend(plan.recorded.iter().cloned());
        w.evicting.extend(plan.evicting.iter().cloned());
    }
}

/// What a plan's writes left to the passes after them: how many writes failed, and the
/// record updates to write again.
#[derive(Debug, Default)]
pub struct Unwritten {
    pub failed: usize,
    pub records: Vec<Update>,
}

/// A plan's writes, handed to the task ([`DeferredRecords::start`]): given the record
/// updates that earlier tasks left unwritten, to write before its own.
pub type PlanWrites =
    Box<dyn FnOnce(Vec<Update>) -> Pin<Box<dyn Future<Output = Unwritten> + Send>> + Send>;

/// A plan's writes and what they touch: the records they write and the workloads whose
/// admissions, readiness records or evictions they write (assumed until answered).
pub struct Plan {
    pub writes: PlanWrites,
    pub records: BTreeSet<String>,
    pub assumed: Assumed,
}

/// What a task left: the place updates that failed, and what its plans' writes left.
#[derive(Debug, Default)]
struct Done {
    places: Vec<Asked>,
    plan: Unwritten,
}

/// A task writing deferred updates, and the records it writes.
#[derive(Debug)]
struct Running {
    keys: BTreeSet<String>,
    /// The workloads whose assumed writes it writes (it, or a task it waits for).
    assumed: BTreeSet<String>,
    /// Whether it writes a plan's actions (or waits for a task that does).
    plans: bool,
    handle: JoinHandle<Done>,
}

/// The writes the controller's passes do not wait for: records' places, and the whole
/// of a plan that only admits, records readiness and tells reasons when passes assume
/// them.
#[derive(Debug, Default)]
pub struct DeferredRecords {
    running: Option<Running>,
    /// Updates whose write failed, to try again with the next pass's.
    failed: Vec<Asked>,
    /// What finished tasks' plans and the passes' own writes left unwritten.
    unwritten: Unwritten,
    writing: Arc<Writing>,
    /// Woken when a task's write failed (the next pass tries it again).
    wake: Option<Arc<Notify>>,
}

impl DeferredRecords {
    /// How many deferred updates failed and wait for the next pass.
    pub fn failed(&self) -> usize {
        self.failed.len()
    }

    /// Wakes `notify` when a task's write fails (no cache change would).
    pub fn wake_on_failure(&mut self, notify: Arc<Notify>) {
        self.wake = Some(notify);
    }

    /// The writes passes assume now ([`Writing`]).
    pub fn writing(&self) -> &Arc<Writing> {
        &self.writing
    }

    /// Whether a task under way writes a plan's actions.
    pub fn writes_plans(&self) -> bool {
        self.running.as_ref().is_some_and(|r| r.plans)
    }

    /// Takes what was left unwritten so far (to write with the next pass's writes).
    pub fn take_unwritten(&mut self) -> Unwritten {
        std::mem::take(&mut self.unwritten)
    }

    /// Keeps what a pass's own writes left unwritten.
    pub fn keep_unwritten(&mut self, failed: usize, records: Vec<Update>) {
        self.unwritten.failed += failed;
        self.unwritten.records.extend(records);
    }

    /// Before a pass writes records `keys` itself: waits for the task under way when it
    /// writes one of them (or is done already), keeping its failures.
    pub async fn before_writing(&mut self, cache: &Cache, keys: &BTreeSet<String>) {
        let touches = self
            .running
            .as_ref()
            .is_some_and(|r| r.handle.is_finished() || !r.keys.is_disjoint(keys));
        if touches {
            self.join(cache).await;
        }
        for key in keys {
            cache.asked_places.forget(key);
        }
    }

    /// Waits until every deferred write under way has landed (or failed).
    pub async fn join(&mut self, cache: &Cache) {
        let Some(r) = self.running.take() else {
            return;
        };
        match r.handle.await {
            Ok(done) => {
                self.failed.extend(done.places);
                self.keep_unwritten(done.plan.failed, done.plan.records);
            }
            Err(e) => {
                // The task panicked or was cancelled: its asks are answered by nothing,
                // so the next pass reads the records' own places again, and its
                // admissions are no longer assumed.
                tracing::warn!(error = %e, "deferred writes lost");
                for key in &r.keys {
                    cache.asked_places.forget(key);
                }
                for key in &r.assumed {
                    self.writing.answered(key);
                }
            }
        }
    }

    /// Starts writing `plan` (when given), then `later` (this pass's deferrable
    /// updates) and the failed ones of earlier passes whose records this pass did not
    /// write (`written`: every record this pass has an update for), after the task under
    /// way.
    pub fn start(
        &mut self,
        client: &kube::Client,
        cache: &Arc<Cache>,
        plan: Option<Plan>,
        later: Vec<Update>,
        written: BTreeSet<String>,
        now: Millis,
    ) {
        let mut todo: Vec<Asked> = std::mem::take(&mut self.failed)
            .into_iter()
            .filter(|a| !written.contains(&a.update.key))
            .collect();
        todo.extend(later.into_iter().map(|update| {
            Asked {
                ticket: cache
                    .asked_places
                    .ask(&update.key, update.position.clone().flatten()),
                update,
            }
        }));
        if todo.is_empty() && plan.is_none() {
            return;
        }
        let before = self.running.take();
        let mut keys: BTreeSet<String> = todo.iter().map(|a| a.update.key.clone()).collect();
        let mut assumed = BTreeSet::new();
        let mut writes = None;
        if let Some(p) = plan {
            keys.extend(p.records);
            self.writing.start(&p.assumed);
            assumed.extend(p.assumed.recorded);
            assumed.extend(p.assumed.evicting);
            writes = Some(p.writes);
        }
        let mut plans = writes.is_some();
        if let Some(b) = &before {
            keys.extend(b.keys.iter().cloned());
            assumed.extend(b.assumed.iter().cloned());
            plans |= b.plans;
        }
        let (client, cache) = (client.clone(), Arc::clone(cache));
        let wake = self.wake.clone();
        let handle = tokio::spawn(async move {
            let mut done = Done::default();
            if let Some(b) = before {
                let earlier = b.handle.await.unwrap_or_default();
                let retried = earlier
                    .places
                    .into_iter()
                    .filter(|a| !written.contains(&a.update.key));
                todo.splice(0..0, retried);
                done.plan = earlier.plan;
            }
            if let Some(w) = writes {
                // What earlier tasks left unwritten goes first, in its order.
                let left = w(std::mem::take(&mut done.plan.records)).await;
                done.plan.failed += left.failed;
                done.plan.records = left.records;
            }
            done.places = write(&client, &cache, todo, now).await;
            let failed = !done.places.is_empty() || done.plan.failed > 0;
            if let (true, Some(wake)) = (failed || !done.plan.records.is_empty(), wake) {
                wake.notify_one();
            }
            done
        });
        self.running = Some(Running {
            keys,
            assumed,
            plans,
            handle,
        });
    }
}

/// Writes `todo` in order; gives back the updates of the records whose write failed.
async fn write(client: &kube::Client, cache: &Cache, todo: Vec<Asked>, now: Millis) -> Vec<Asked> {
    let (updates, tickets): (Vec<Update>, Vec<Ticket>) =
        todo.into_iter().map(|a| (a.update, a.ticket)).unzip();
    let failed: BTreeSet<String> = workload_writer::write(client, &updates, Some(cache), now)
        .await
        .into_iter()
        .map(|u| u.key)
        .collect();
    let (failed, landed): (Vec<Asked>, Vec<Asked>) = updates
        .into_iter()
        .zip(tickets)
        .map(|(update, ticket)| Asked { update, ticket })
        .partition(|a| failed.contains(&a.update.key));
    for a in landed {
        cache.asked_places.answered(&a.update.key, a.ticket);
    }
    if !failed.is_empty() {
        tracing::info!(
            failed = failed.len(),
            "some Workload record writes failed; the next pass tries them again"
        );
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::workload_record::{Admission, RequeueState};

    fn update(key: &str) -> Update {
        Update::blank(key, "team", key)
    }

    fn pending(key: &str, place: Option<&str>) -> Update {
        Update {
            admission: Some(None),
            position: Some(place.map(String::from)),
            ..update(key)
        }
    }

    fn keys(updates: &[Update]) -> Vec<&str> {
        updates.iter().map(|u| u.key.as_str()).collect()
    }

    #[test]
    fn only_a_waiting_workloads_reason_and_place_wait() {
        assert!(deferrable(&pending("a", Some("3"))));
        assert!(deferrable(&pending("a", None)), "a place taken away");
        let admitted = Update {
            admission: Some(Some(Admission {
                cluster_queue: "cq".into(),
                pod_set_assignments: Vec::new(),
            })),
            position: Some(None),
            ..update("a")
        };
        assert!(!deferrable(&admitted));
        let evicted = Update {
            admission: Some(None),
            ..update("a")
        };
        assert!(!deferrable(&evicted), "an eviction names no place");
        let requeued = Update {
            requeue_state: Some(Some(RequeueState::default())),
            ..pending("a", Some("1"))
        };
        assert!(
            !deferrable(&requeued),
            "a requeue state is read back by passes"
        );
        assert!(!deferrable(&update("a")));
    }

    #[test]
    fn a_record_written_in_the_pass_keeps_its_place_update_with_it_in_order() {
        let records = vec![
            pending("a", Some("1")),
            update("b"),
            pending("b", Some("2")),
            pending("c", Some("3")),
        ];
        let (now, later) = split(records);
        assert_eq!(keys(&now), ["b", "b"]);
        assert!(
            !deferrable(&now[0]) && deferrable(&now[1]),
            "in their order"
        );
        assert_eq!(keys(&later), ["a", "c"]);
    }
}
