//! Rebuilding the books from the outside world: a controller that (re)starts records the
//! workloads that already run, as found on the API server, before it schedules anything.

use super::assign::Mode;
use super::engine::Engine;
use super::error::Result;
use super::events::PendingReason;
use super::model::WorkloadInfo;
use super::quantity::Time;

/// What [`Engine::restore_admitted`] made of a running workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restored {
    /// Admitted within its queue's quota (own nominal, then borrowing).
    Admitted,
    /// Admitted over its queue's quota (lowered since it was admitted): it keeps what
    /// it uses until it ends, counted as borrowed from its cohort, so nothing is
    /// admitted in its place and the cohort may reclaim it. Kueue keeps an admitted
    /// workload's usage the same way when a quota is lowered.
    OverQuota,
    /// Not admitted (its queue is gone, or no flavor of its queue matches its pods):
    /// left pending; the caller keeps it running and reports it.
    Pending,
}

impl Engine {
    /// Records `info` as admitted since `admitted_at`, without a scheduling decision.
    ///
    /// Flavors are assigned as an admission would (own nominal quota, then borrowing) but
    /// nothing is preempted. When that no longer fits (its quota was lowered), the first
    /// flavor its pods may run on is taken over quota ([`Restored::OverQuota`]). Its
    /// `Admitted` event is recorded like any other; callers restoring a snapshot drop the
    /// events with [`Engine::take_events`].
    pub fn restore_admitted(
        &mut self,
        now: Time,
        info: WorkloadInfo,
        admitted_at: Time,
    ) -> Result<Restored> {
        self.restore_admitted_by(now, info, admitted_at, None)
    }

    /// [`Engine::restore_admitted`] for a workload that ClusterQueue `admitted_by`
    /// admitted (as its Workload record says): when its LocalQueue is gone it is
    /// restored there, as Kueue's cache books an admitted Workload by
    /// `status.admission.clusterQueue`, so deleting a LocalQueue never frees the quota
    /// its running workloads use. Its LocalQueue, when it has one, decides; one whose
    /// ClusterQueue no longer selects its namespace keeps it there too (the selector
    /// gates admission, not what runs).
    pub fn restore_admitted_by(
        &mut self,
        now: Time,
        info: WorkloadInfo,
        admitted_at: Time,
        admitted_by: Option<&str>,
    ) -> Result<Restored> {
        let key = info.key();
        self.submit(now, info)?;
        let Some(&id) = self.wl_by_key.get(&key) else {
            return Ok(Restored::Pending);
        };
        let Some(cq) = self.wls[id]
            .cq
            .or_else(|| self.admitted_queue(id, admitted_by))
        else {
            return Ok(Restored::Pending);
        };
        let counts: Vec<u32> = self.wls[id].info.pod_sets.iter().map(|p| p.count).collect();
        let mut assignment = self.assign(id, cq, &counts, now);
        let mut restored = Restored::Admitted;
        if !matches!(assignment.mode, Mode::Fit | Mode::Borrow) {
            assignment = self.assign_with(id, cq, &counts, now, true);
            if assignment.mode != Mode::Fit {
                return Ok(Restored::Pending);
            }
            restored = Restored::OverQuota;
        }
        let order = self.wls[id].order_key(id);
        self.cqs[cq].pending.remove(&order);
        self.admit(id, cq, assignment, admitted_at.min(now));
        if restored == Restored::OverQuota {
            self.over_quota.insert(id);
        }
        Ok(restored)
    }

    /// The ClusterQueue that keeps running workload `id`, submitted without one: the
    /// one that admitted it (`admitted_by`) when its LocalQueue is gone, its
    /// LocalQueue's when that no longer selects its namespace. Taken out of the
    /// queueless, it is restored there.
    fn admitted_queue(&mut self, id: usize, admitted_by: Option<&str>) -> Option<usize> {
        let name = match &self.wls[id].reason {
            PendingReason::LocalQueueNotFound => admitted_by?,
            PendingReason::NamespaceNotAllowed(cq) => cq.as_str(),
            _ => return None,
        };
        let cq = *self.cq_by_name.get(name)?;
        self.orphans.remove(&id);
        self.wls[id].cq = Some(cq);
        Some(cq)
    }
}

#[cfg(test)]
mod tests {
    use super::Restored;
    use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
    use crate::quota::{Engine, EngineConfig, WorkloadInfo};

    fn engine(nominal: i64) -> Engine {
        let mut e = Engine::new(EngineConfig::default());
        e.apply_flavor(&flavor("h100"), 0).unwrap();
        e.apply_cluster_queue(
            &cluster_queue("cq")
                .quota("h100", "nvidia.com/gpu", nominal)
                .build(),
            0,
        )
        .unwrap();
        e.apply_local_queue(&local_queue("ns", "lq", "cq"), 0)
            .unwrap();
        e
    }

    fn wl(name: &str, gpus: i64, prio: i32) -> WorkloadInfo {
        WorkloadInfo::new(&format!("ns/{name}"), "lq")
            .pod_set("main", 1, &[("nvidia.com/gpu", gpus)])
            .priority(prio)
    }

    #[test]
    fn restored_workloads_hold_quota_and_are_not_readmitted() {
        let mut e = engine(4);
        // Low priority first: restoring never preempts, whatever the order.
        for (name, prio, at) in [("low", 0, 10), ("high", 9, 20)] {
            let restored = e.restore_admitted(100, wl(name, 2, prio), at).unwrap();
            assert_ne!(restored, Restored::Pending, "{name} holds quota");
        }
        e.submit(100, wl("new", 1, 100)).unwrap();
        e.schedule(100).unwrap();
        assert!(e.is_admitted("ns/low") && e.is_admitted("ns/high"));
        assert!(!e.is_admitted("ns/new"), "the quota is full");
        assert_eq!(e.usage_total(), 4000);
        assert_eq!(e.first_admitted_at("ns/low"), Some(10));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_workload_over_a_lowered_quota_keeps_it_until_it_ends() {
        let mut e = engine(2);
        assert_eq!(
            e.restore_admitted(5, wl("a", 2, 0), 0).unwrap(),
            Restored::Admitted
        );
        assert_eq!(
            e.restore_admitted(5, wl("b", 2, 0), 0).unwrap(),
            Restored::OverQuota
        );
        assert!(e.is_admitted("ns/b"));
        assert_eq!(e.usage_total(), 4000);
        // Nothing is admitted in its place, even at a higher priority (no preemption
        // of restored workloads here: the queue cannot preempt).
        e.submit(5, wl("new", 1, 100)).unwrap();
        e.schedule(5).unwrap();
        assert!(!e.is_admitted("ns/new"));
        e.check_invariants().unwrap();
        // Once both end, the quota is free again.
        e.remove(6, "ns/a").unwrap();
        e.schedule(6).unwrap();
        assert!(!e.is_admitted("ns/new"), "still 2 in use of 2");
        e.remove(7, "ns/b").unwrap();
        e.schedule(7).unwrap();
        assert!(e.is_admitted("ns/new"));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_workload_whose_local_queue_is_gone_stays_booked_where_it_was_admitted() {
        let mut e = engine(4);
        e.remove_local_queue("ns", "lq");
        // Without its record's ClusterQueue it cannot be placed: pending, no quota held.
        assert_eq!(
            e.restore_admitted(5, wl("lost", 2, 0), 0).unwrap(),
            Restored::Pending
        );
        assert_eq!(e.usage_total(), 0);
        // A ClusterQueue that does not exist places nothing either.
        assert_eq!(
            e.restore_admitted_by(5, wl("odd", 2, 0), 0, Some("gone"))
                .unwrap(),
            Restored::Pending
        );
        for name in ["a", "b"] {
            assert_eq!(
                e.restore_admitted_by(5, wl(name, 2, 0), 0, Some("cq"))
                    .unwrap(),
                Restored::Admitted
            );
        }
        assert_eq!(e.usage_total(), 4000);
        e.check_invariants().unwrap();
        // The quota stays taken: a newcomer through a new LocalQueue waits for it.
        e.apply_local_queue(&local_queue("ns", "lq2", "cq"), 5)
            .unwrap();
        e.submit(
            5,
            WorkloadInfo::new("ns/new", "lq2").pod_set("main", 1, &[("nvidia.com/gpu", 1)]),
        )
        .unwrap();
        e.schedule(5).unwrap();
        assert!(!e.is_admitted("ns/new"), "4 of 4 in use");
        e.remove(6, "ns/a").unwrap();
        e.schedule(6).unwrap();
        assert!(e.is_admitted("ns/new"));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_workload_whose_namespace_its_queue_no_longer_selects_keeps_its_quota() {
        let mut e = engine(4);
        let mut closed = cluster_queue("cq")
            .quota("h100", "nvidia.com/gpu", 4)
            .build();
        closed.spec.namespace_selector = None;
        e.apply_cluster_queue(&closed, 0).unwrap();
        assert_eq!(
            e.restore_admitted(5, wl("a", 3, 0), 0).unwrap(),
            Restored::Admitted
        );
        assert_eq!(e.usage_total(), 3000);
        // A newcomer is not admitted there (the selector gates admission).
        e.submit(5, wl("new", 1, 0)).unwrap();
        e.schedule(5).unwrap();
        assert!(!e.is_admitted("ns/new"));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_workload_whose_queue_has_no_flavor_for_it_stays_pending() {
        let mut e = engine(2);
        let gpu_less = WorkloadInfo::new("ns/odd", "lq")
            .pod_set("main", 1, &[("example.com/fpga", 1)])
            .priority(0);
        assert_eq!(
            e.restore_admitted(5, gpu_less, 0).unwrap(),
            Restored::Pending
        );
        assert!(!e.is_admitted("ns/odd"));
        assert_eq!(e.usage_total(), 0);
    }
}
