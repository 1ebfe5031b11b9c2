//! Record writes that do not hold a pass up: the updates that only tell a waiting
//! workload its reason and place ([`deferrable`]). An admission from the head of a long
//! queue moves the places of dozens of waiting workloads, one record write each; the
//! pass writes its admissions, evictions and pod statuses, hands those place writes to a
//! task and returns, as Kueue's scheduler hands its admission writes to a goroutine.
//!
//! ```text
//! pass ─► records ─┬─ deferrable ─► ask the place (cache.asked_places) ─► task: write ─► answered
//!                  └─ the rest ──► written in the pass (after the task, when it writes the same records)
//! ```
//! Order per record holds: each task first waits for the one before it, and a pass that
//! writes a record a running task also writes waits for that task first. A pass reads a
//! record's place through the asks not yet answered ([`super::asked_places`]). A write
//! that failed is tried again with the next pass's, unless that pass wrote the record
//! itself (its update replaces the failed one).

use super::asked_places::Ticket;
use super::cache::Cache;
use super::time::Millis;
use super::workload_record::Update;
use super::workload_writer;
use std::collections::BTreeSet;
use std::sync::Arc;
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

/// A task writing deferred updates, and the records it writes.
#[derive(Debug)]
struct Running {
    keys: BTreeSet<String>,
    handle: JoinHandle<Vec<Asked>>,
}

/// The deferred record writes of a controller's passes.
#[derive(Debug, Default)]
pub struct DeferredRecords {
    running: Option<Running>,
    /// Updates whose write failed, to try again with the next pass's.
    failed: Vec<Asked>,
}

impl DeferredRecords {
    /// How many deferred updates failed and wait for the next pass.
    pub fn failed(&self) -> usize {
        self.failed.len()
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
            Ok(failed) => self.failed.extend(failed),
            Err(e) => {
                // The task panicked or was cancelled: its asks are answered by nothing,
                // so the next pass reads the records' own places again.
                tracing::warn!(error = %e, "deferred Workload record writes lost");
                for key in &r.keys {
                    cache.asked_places.forget(key);
                }
            }
        }
    }

    /// Starts writing `later` (this pass's deferrable updates) and the failed ones of
    /// earlier passes whose records this pass did not write (`written`: every record
    /// this pass has an update for), after the task under way.
    pub fn start(
        &mut self,
        client: &kube::Client,
        cache: &Arc<Cache>,
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
        if todo.is_empty() {
            return;
        }
        let before = self.running.take();
        let mut keys: BTreeSet<String> = todo.iter().map(|a| a.update.key.clone()).collect();
        if let Some(b) = &before {
            keys.extend(b.keys.iter().cloned());
        }
        let (client, cache) = (client.clone(), Arc::clone(cache));
        let handle = tokio::spawn(async move {
            if let Some(b) = before {
                let failed = b.handle.await.unwrap_or_default();
                let retried = failed
                    .into_iter()
                    .filter(|a| !written.contains(&a.update.key));
                todo.splice(0..0, retried);
            }
            write(&client, &cache, todo, now).await
        });
        self.running = Some(Running { keys, handle });
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
