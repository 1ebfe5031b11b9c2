//! Queue objects and namespaces changed since the last pass, followed on the kept
//! engine: each change goes to the engine as the event it is (`update_cluster_queue`,
//! `apply_local_queue`, ...), in the order a fresh pass builds its engine (namespaces,
//! flavors, priority classes, ClusterQueues, LocalQueues), instead of deciding the pass
//! from scratch.
//!
//! What the engine re-decides on each event is its own rule (a ClusterQueue changed:
//! what the change can move in its cohort, `Engine::update_cluster_queue`; a LocalQueue
//! or ClusterQueue created, held with `stopPolicy: Hold` or not: the workloads waiting
//! for it are queued there). What a fresh pass would build otherwise is caught after: running workloads are restored onto a fresh engine of the new queue
//! objects and compared (`Kept::books_differ`), and the scopes where a restore differs
//! or no longer fits are re-decided from their workloads.
//!
//! A ClusterQueue moving between cohorts, changing its `namespaceSelector` or
//! `queueingStrategy` (which workloads it holds, in which order, sharing quota with
//! whom) or held and released (`stopPolicy: Hold`), and a LocalQueue pointing to
//! another ClusterQueue (its workloads move) or deleted (its waiting workloads wait
//! `LocalQueueNotFound`) re-decide the preemption scopes concerned, before and after,
//! from their workloads as a fresh pass builds them (`Kept::rebuild_scope`): the other
//! scopes are untouched. A namespace's first LocalQueue, or its last one deleted, is
//! followed where the namespace has no serving owner and no DRA claim: a pass reads
//! those only in namespaces with a LocalQueue.
//!
//! The changes it cannot follow exactly make the pass decide from scratch, each with its
//! reason: a ResourceFlavor or ClusterQueue deleted; a LocalQueue deleted under a
//! running workload whose `Workload` record names no admission yet (one that does
//! stays booked in that ClusterQueue); a ClusterQueue draining (`stopPolicy:
//! HoldAndDrain`) while workloads run or terminate in it (a fresh pass evicts them;
//! [`Kept::draining_busy`]); a namespace's first or
//! last LocalQueue where it has serving owners or DRA claims; a priority class that a
//! running workload without a queue names (one waiting for a LocalQueue is submitted
//! again with its new priority); queue objects that cannot be read (their problems
//! are reported by the fresh pass). All are rare next to quota edits and new queues,
//! and the fresh pass is exact. A priority class that queued workloads name, and a
//! namespace's labels where some ClusterQueue selects namespaces by label, re-decide
//! the scopes of the workloads concerned (their priorities, their queues read again).

use super::{Kept, State};
use crate::controller::cache::Cache;
use crate::controller::decide::{Scopes, UNKNOWN_SCOPE};
use crate::controller::model::Snapshot;
use crate::controller::snapshot::{queued_namespaces, record_admission};
use crate::controller::time::Millis;
use crate::quota::api::{ClusterQueue, LabelSelector, LocalQueue, ResourceFlavor, StopPolicy};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::Hash;

/// Whether ClusterQueue `q` drains (`stopPolicy: HoldAndDrain`).
fn draining(q: &ClusterQueue) -> bool {
    q.spec.stop_policy == StopPolicy::HoldAndDrain
}

impl Kept {
    /// Applies the queue objects and namespaces of `new` (read from the stores now) to
    /// the kept engine and bookkeeping; the ClusterQueues changed go to `stale` so their
    /// cohorts' reasons are re-decided in this pass. Returns the preemption scopes to
    /// re-decide from their workloads: those a ClusterQueue left or joined, or whose
    /// ClusterQueue now selects other namespaces, orders its queue otherwise, or was
    /// held or released, those of both ClusterQueues of a LocalQueue pointing to
    /// another, and that of a deleted LocalQueue's ClusterQueue.
    pub(super) fn follow_queue_objects(
        &mut self,
        new: Snapshot,
        cache: &Cache,
        now: Millis,
    ) -> Result<BTreeSet<String>, &'static str> {
        if !self.base_problems.is_empty() {
            return Err("queue objects changed beside unusable ones");
        }
        // ClusterQueues whose workloads, their order or the queues they share quota
        // with change under them.
        let mut regrouped = self.follow_namespaces(&new)?;
        follow_named(
            &self.base.flavors,
            &new.flavors,
            |f: &ResourceFlavor| &f.metadata.name,
            |_, f| match f {
                None => Err("a ResourceFlavor deleted"),
                Some(f) => self
                    .engine
                    .apply_flavor(f, now)
                    .map_err(|_| "a ResourceFlavor the engine refuses"),
            },
        )?;
        regrouped.extend(self.follow_priority_classes(&new, now)?);
        let mut changed_cqs = Vec::new();
        let mut deleted_lqs = BTreeSet::new();
        follow_named(
            &self.base.cluster_queues,
            &new.cluster_queues,
            |q: &ClusterQueue| &q.metadata.name,
            |old, q| {
                let q = q.ok_or("a ClusterQueue deleted")?;
                // Draining with workloads in it: they are evicted, as a fresh pass
                // restoring them into the queue evicts them (`Engine::drain_stopped`).
                if draining(q) && self.engine.uses_quota(&q.metadata.name) {
                    return Err("a ClusterQueue draining with workloads in it");
                }
                match old {
                    // Other workloads, another order or cohort, or held, drained or
                    // released: its scopes are re-decided (its waiting workloads told
                    // anew).
                    Some(o)
                        if !same_membership(o, q) || o.spec.stop_policy != q.spec.stop_policy =>
                    {
                        regrouped.push(q.metadata.name.clone());
                    }
                    // Unchanged membership; or created, held, draining or not: the
                    // workloads waiting for it queue there (told it is stopped when it
                    // is).
                    Some(_) | None => {}
                }
                self.engine
                    .update_cluster_queue(q, now)
                    .map_err(|_| "a ClusterQueue the engine refuses")?;
                changed_cqs.push(q.metadata.name.clone());
                Ok(())
            },
        )?;
        follow_named(
            &self.base.local_queues,
            &new.local_queues,
            lq_key,
            |old, q| {
                let Some(q) = q else {
                    // Its waiting workloads leave their queue for none (below) and the
                    // queue's scope is re-decided without them.
                    let o = old.ok_or("bookkeeping")?;
                    let (ns, name) = lq_key(o);
                    self.engine.remove_local_queue(&ns, &name);
                    regrouped.push(o.spec.cluster_queue.clone());
                    deleted_lqs.insert((ns, name));
                    return Ok(());
                };
                match old {
                    Some(o) if o.spec.cluster_queue != q.spec.cluster_queue => {
                        // Its workloads move: both queues' scopes are re-decided.
                        self.engine
                            .apply_local_queue(q, now)
                            .map_err(|_| "a LocalQueue the engine refuses")?;
                        regrouped.push(o.spec.cluster_queue.clone());
                        regrouped.push(q.spec.cluster_queue.clone());
                        Ok(())
                    }
                    Some(_) => Ok(()),
                    None => {
                        self.engine
                            .apply_local_queue(q, now)
                            .map_err(|_| "a LocalQueue the engine refuses")?;
                        // Its waiting workloads queue there now: decided with the
                        // others of the pass, as a fresh pass submits them.
                        self.stale.insert(q.spec.cluster_queue.clone());
                        Ok(())
                    }
                }
            },
        )?;
        if !changed_cqs.is_empty() {
            // A fresh restore may assign the running workloads otherwise, or find one no
            // longer fits: checked before deciding (`books_differ`).
            self.verify = true;
        }
        self.stale.extend(changed_cqs);
        self.follow_queued_namespaces(&new, cache)?;
        self.read_admissions_under(&deleted_lqs, cache);
        let scopes = Scopes::new(&new);
        let mut redecide: BTreeSet<String> = regrouped
            .iter()
            .map(|cq| self.scopes.of_cluster_queue(cq))
            .collect();
        redecide.extend(regrouped.iter().map(|cq| scopes.of_cluster_queue(cq)));
        // The workloads that change scope leave the engine first: booked in their old
        // queue, they would take its quota while the scopes are re-decided one by one.
        // Those left without a queue (their LocalQueue deleted) are submitted again, as
        // a fresh pass submits them: waiting `LocalQueueNotFound`. A running one stays
        // booked in the ClusterQueue its record says admitted it (its scope, unless
        // the LocalQueue had moved it since).
        for key in self.rescope(scopes, &redecide) {
            self.drop_from_engine(&key, now)?;
            let l = self.lives.remove(&key).ok_or("bookkeeping")?;
            let queueless = self.scopes.of(&l) == UNKNOWN_SCOPE;
            let done = match (queueless, l.state) {
                (false, _) => Ok(()),
                (true, State::Waiting) => self.submit(&key, &l, now, &mut BTreeSet::new()),
                (true, _) => {
                    Err("a LocalQueue deleted under a running workload not recorded admitted")
                }
            };
            self.lives.insert(key, l);
            done?;
        }
        self.simple_cqs = simple_cluster_queues(&new.cluster_queues);
        self.flavor_labels = flavor_labels(&new.flavors);
        self.base = Snapshot {
            flavors: new.flavors,
            cluster_queues: new.cluster_queues,
            local_queues: new.local_queues,
            priority_classes: new.priority_classes,
            namespaces: new.namespaces,
            ..std::mem::take(&mut self.base)
        };
        Ok(redecide)
    }

    /// Whether a draining ClusterQueue still holds workloads (running, terminating, or
    /// booked there by the engine): a fresh pass restores and evicts them
    /// ([`crate::quota::Engine::drain_stopped`]), so such a pass decides from scratch.
    /// Cost: the ClusterQueues, and the running workloads while one drains.
    pub(super) fn draining_busy(&self) -> bool {
        let queues: BTreeSet<&String> = self
            .base
            .cluster_queues
            .iter()
            .filter(|q| draining(q))
            .map(|q| &q.metadata.name)
            .collect();
        if queues.is_empty() {
            return false;
        }
        queues.iter().any(|q| self.engine.uses_quota(q))
            || self
                .running
                .iter()
                .filter_map(|k| self.lives.get(k))
                .any(|l| {
                    self.scopes
                        .cluster_queue_of(l)
                        .is_some_and(|q| queues.contains(q))
                })
    }

    /// Reads again, from their `Workload` records in the cache, which ClusterQueue
    /// admitted the running workloads of LocalQueues `deleted` (a fresh pass reads it
    /// there; a record is written after its pass). Cost: the running workloads.
    fn read_admissions_under(&mut self, deleted: &BTreeSet<(String, String)>, cache: &Cache) {
        if deleted.is_empty() {
            return;
        }
        for key in &self.running {
            let Some(l) = self.lives.get_mut(key) else {
                continue;
            };
            let under = l
                .info
                .as_ref()
                .is_some_and(|i| deleted.contains(&(i.namespace.clone(), i.queue_name.clone())));
            if under {
                l.admitted_by = record_admission(cache, key);
            }
        }
    }

    /// The namespaces with a LocalQueue (whose serving owners and DRA claims a pass
    /// reads) after `new`: one that gained its first (or lost its last) is followed
    /// only where it has no serving owner and no DRA claim to start (or stop) reading.
    fn follow_queued_namespaces(
        &mut self,
        new: &Snapshot,
        cache: &Cache,
    ) -> Result<(), &'static str> {
        let now = queued_namespaces(&new.local_queues);
        if now == self.queued_ns {
            return Ok(());
        }
        if self
            .queued_ns
            .symmetric_difference(&now)
            .any(|ns| !without_owners_or_claims(cache, ns))
        {
            return Err(
                "a namespace's first or last LocalQueue, with serving owners or DRA claims",
            );
        }
        self.queued_ns = now;
        Ok(())
    }

    /// Namespaces created, relabelled or deleted: noted on the engine. Returns the
    /// ClusterQueues selecting namespaces by label that hold workloads of those
    /// namespaces (they may admit them or not now: their scopes are re-decided); a
    /// workload without a ClusterQueue resolves its queue with the labels of the moment
    /// it gets one. Cost: the workloads, where some ClusterQueue reads labels.
    fn follow_namespaces(&mut self, new: &Snapshot) -> Result<Vec<String>, &'static str> {
        let old: BTreeMap<&String, &BTreeMap<String, String>> =
            self.base.namespaces.iter().map(|(n, l)| (n, l)).collect();
        let now: BTreeMap<&String, &BTreeMap<String, String>> =
            new.namespaces.iter().map(|(n, l)| (n, l)).collect();
        let moved: BTreeSet<&String> = old
            .keys()
            .chain(now.keys())
            .filter(|n| old.get(*n) != now.get(*n))
            .copied()
            .collect();
        if moved.is_empty() {
            return Ok(Vec::new());
        }
        for ns in &moved {
            self.engine
                .note_namespace(ns, now.get(ns).map(|l| (*l).clone()));
        }
        // Labels matter only to a ClusterQueue whose selector reads them (before or
        // after), and only for the workloads of that namespace.
        let selective: BTreeSet<&String> = new
            .cluster_queues
            .iter()
            .chain(&self.base.cluster_queues)
            .filter(|q| q.spec.namespace_selector.as_ref().is_some_and(reads_labels))
            .map(|q| &q.metadata.name)
            .collect();
        if selective.is_empty() {
            return Ok(Vec::new());
        }
        let mut queues = BTreeSet::new();
        for (key, l) in &self.lives {
            let in_moved = key
                .split_once('/')
                .is_some_and(|(ns, _)| moved.iter().any(|m| m.as_str() == ns));
            match self.scopes.cluster_queue_of(l) {
                Some(cq)
                    if in_moved
                        && selective.contains(cq)
                        && self.scopes.of_cluster_queue(cq) != UNKNOWN_SCOPE =>
                {
                    queues.insert(cq.clone());
                }
                _ => {}
            }
        }
        Ok(queues.into_iter().collect())
    }

    /// Priority classes created, changed or deleted. Returns the ClusterQueues of the
    /// workloads naming one by class (their priorities change: their scopes are
    /// re-decided, which reads them again); those waiting for a queue are submitted
    /// again, with their new priority (or told the class is gone), as a fresh pass
    /// submits them. One running without a queue cannot be followed. Cost: the
    /// workloads.
    fn follow_priority_classes(
        &mut self,
        new: &Snapshot,
        at: Millis,
    ) -> Result<Vec<String>, &'static str> {
        let old: BTreeMap<&String, i32> = self
            .base
            .priority_classes
            .iter()
            .map(|c| (&c.metadata.name, c.value))
            .collect();
        let now: BTreeMap<&String, i32> = new
            .priority_classes
            .iter()
            .map(|c| (&c.metadata.name, c.value))
            .collect();
        let moved: BTreeSet<&String> = old
            .keys()
            .chain(now.keys())
            .filter(|n| old.get(*n) != now.get(*n))
            .copied()
            .collect();
        if moved.is_empty() {
            return Ok(Vec::new());
        }
        let mut queues = BTreeSet::new();
        let mut queueless = Vec::new();
        for (key, l) in &self.lives {
            let named = l.info.as_ref().is_some_and(|i| {
                i.priority.is_none() && i.priority_class.as_ref().is_some_and(|c| moved.contains(c))
            });
            if !named {
                continue;
            }
            match self.scopes.cluster_queue_of(l) {
                Some(cq) => {
                    queues.insert(cq);
                }
                None if l.state == State::Waiting => queueless.push(key.clone()),
                None => {
                    return Err("a priority class that a running workload without a queue names")
                }
            }
        }
        let queues: Vec<String> = queues.into_iter().cloned().collect();
        for c in &new.priority_classes {
            if moved.contains(&c.metadata.name) {
                self.engine
                    .apply_priority_class(c)
                    .map_err(|_| "a priority class the engine refuses")?;
            }
        }
        for name in moved.iter().filter(|n| !now.contains_key(**n)) {
            self.engine.remove_priority_class(name);
        }
        for key in queueless {
            self.drop_from_engine(&key, at)?;
            let l = self.lives.remove(&key).ok_or("bookkeeping")?;
            let done = self.submit(&key, &l, at, &mut BTreeSet::new());
            self.lives.insert(key, l);
            done?;
        }
        Ok(queues)
    }

    /// Moves to `scopes`. The workloads of no known scope before (their LocalQueue or
    /// ClusterQueue missing) and those of scopes `moved` (a ClusterQueue left or joined
    /// them) are indexed under the scope they have now; every other workload keeps its
    /// scope (the caller refused the changes that would move one). Returns the keys of
    /// the workloads that left a known scope for another. Cost: those scopes'
    /// workloads.
    fn rescope(&mut self, scopes: Scopes, moved: &BTreeSet<String>) -> Vec<String> {
        self.scopes = scopes;
        let old = std::iter::once(UNKNOWN_SCOPE).chain(moved.iter().map(String::as_str));
        let mut leaving = Vec::new();
        for scope in old {
            let Some(keys) = self.scope_keys.get(scope) else {
                continue;
            };
            for key in keys {
                if let Some(l) = self.lives.get(key) {
                    let to = self.scopes.of(l);
                    if to != scope {
                        leaving.push((scope.to_string(), to, key.clone(), super::sort_key(l)));
                    }
                }
            }
        }
        let mut keys = Vec::with_capacity(leaving.len());
        for (from, to, key, sk) in leaving {
            if let Some(keys) = self.scope_keys.get_mut(&from) {
                keys.remove(&key);
            }
            if self
                .terminating
                .get_mut(&from)
                .is_some_and(|t| t.remove(&sk))
            {
                self.terminating.entry(to.clone()).or_default().insert(sk);
            }
            self.scope_keys.entry(to).or_default().insert(key.clone());
            if from != UNKNOWN_SCOPE {
                keys.push(key);
            }
        }
        self.scope_keys.retain(|_, keys| !keys.is_empty());
        self.terminating.retain(|_, t| !t.is_empty());
        keys
    }
}

/// Walks the objects of one kind by name: `apply(old, new)` for every object of `new`
/// that is new or differs from `old`, the one of the same name before; then
/// `apply(Some(old), None)` for every one gone.
fn follow_named<'a, T: PartialEq, K: Eq + Hash>(
    old: &'a [T],
    new: &'a [T],
    name: impl Fn(&'a T) -> K,
    mut apply: impl FnMut(Option<&'a T>, Option<&'a T>) -> Result<(), &'static str>,
) -> Result<(), &'static str> {
    let before: HashMap<K, &T> = old.iter().map(|o| (name(o), o)).collect();
    let after: HashSet<K> = new.iter().map(&name).collect();
    for o in new {
        let was = before.get(&name(o)).copied();
        if was != Some(o) {
            apply(was, Some(o))?;
        }
    }
    for o in old.iter().filter(|o| !after.contains(&name(o))) {
        apply(Some(o), None)?;
    }
    Ok(())
}

/// The name a LocalQueue is known by: (namespace, name), no namespace read as `default`.
/// Whether namespace `ns` has no serving owner (ReplicaSet, Deployment, StatefulSet)
/// and no DRA claim or claim template cached. Read after the pass took its stores'
/// generations: an object cached later is a change of the next pass.
fn without_owners_or_claims(cache: &Cache, ns: &str) -> bool {
    [
        &cache.replica_sets,
        &cache.deployments,
        &cache.stateful_sets,
        &cache.claims,
        &cache.claim_templates,
    ]
    .iter()
    .all(|s| !s.any_in_namespace(ns))
}

fn lq_key(q: &LocalQueue) -> (String, String) {
    (
        q.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        q.metadata.name.clone(),
    )
}

/// Each flavor's node labels (what an admission's node selector carries).
pub(super) fn flavor_labels(
    flavors: &[ResourceFlavor],
) -> BTreeMap<String, BTreeMap<String, String>> {
    flavors
        .iter()
        .map(|f| (f.metadata.name.clone(), f.spec.node_labels.clone()))
        .collect()
}

/// Whether ClusterQueue `new` holds the same workloads as `old`, in the same order,
/// sharing quota with the same queues: same cohort, namespace selector and queueing
/// strategy.
fn same_membership(old: &ClusterQueue, new: &ClusterQueue) -> bool {
    let (o, n) = (&old.spec, &new.spec);
    o.cohort_name == n.cohort_name
        && o.namespace_selector == n.namespace_selector
        && o.queueing_strategy == n.queueing_strategy
}

/// Whether a namespace's labels can decide what `selector` matches.
fn reads_labels(selector: &LabelSelector) -> bool {
    !selector.match_labels.is_empty() || !selector.match_expressions.is_empty()
}

/// ClusterQueues without a cohort and with one flavor per resource group: their flavor
/// assignments do not depend on the order of admissions.
pub(super) fn simple_cluster_queues(queues: &[ClusterQueue]) -> BTreeSet<String> {
    queues
        .iter()
        .filter(|q| {
            q.spec.cohort_name.is_none()
                && q.spec.resource_groups.iter().all(|g| g.flavors.len() == 1)
        })
        .map(|q| q.metadata.name.clone())
        .collect()
}
