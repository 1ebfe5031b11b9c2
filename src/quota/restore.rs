//! Rebuilding the books from the outside world: a controller that (re)starts records the
//! workloads that already run, as found on the API server, before it schedules anything.

use super::assign::Mode;
use super::engine::Engine;
use super::error::Result;
use super::model::WorkloadInfo;
use super::quantity::Time;

impl Engine {
    /// Records `info` as admitted since `admitted_at`, without a scheduling decision.
    ///
    /// Flavors are assigned as an admission would (own nominal quota, then borrowing) but
    /// nothing is preempted. Returns `Ok(false)` and leaves the workload pending when it
    /// does not fit any more (its queue is gone or its quota was lowered): the caller
    /// keeps it running and reports it. Its `Admitted` event is recorded like any other;
    /// callers restoring a snapshot drop the events with [`Engine::take_events`].
    pub fn restore_admitted(
        &mut self,
        now: Time,
        info: WorkloadInfo,
        admitted_at: Time,
    ) -> Result<bool> {
        let key = info.key();
        self.submit(now, info)?;
        let Some(&id) = self.wl_by_key.get(&key) else {
            return Ok(false);
        };
        let Some(cq) = self.wls[id].cq else {
            return Ok(false);
        };
        let counts: Vec<u32> = self.wls[id].info.pod_sets.iter().map(|p| p.count).collect();
        let assignment = self.assign(id, cq, &counts, now);
        if !matches!(assignment.mode, Mode::Fit | Mode::Borrow) {
            return Ok(false);
        }
        let order = self.wls[id].order_key(id);
        self.cqs[cq].pending.remove(&order);
        self.admit(id, cq, assignment, admitted_at.min(now));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
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
        assert!(e.restore_admitted(100, wl("low", 2, 0), 10).unwrap());
        assert!(e.restore_admitted(100, wl("high", 2, 9), 20).unwrap());
        e.submit(100, wl("new", 1, 100)).unwrap();
        e.schedule(100).unwrap();
        assert!(e.is_admitted("ns/low") && e.is_admitted("ns/high"));
        assert!(!e.is_admitted("ns/new"), "the quota is full");
        assert_eq!(e.usage_total(), 4000);
        assert_eq!(e.first_admitted_at("ns/low"), Some(10));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_workload_that_no_longer_fits_stays_pending() {
        let mut e = engine(2);
        assert!(e.restore_admitted(5, wl("a", 2, 0), 0).unwrap());
        assert!(!e.restore_admitted(5, wl("b", 2, 0), 0).unwrap());
        assert!(!e.is_admitted("ns/b"));
        assert_eq!(e.usage_total(), 2000);
    }
}
