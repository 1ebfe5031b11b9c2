//! Flavor assignment: for each pod set and resource group, the first flavor in the queue's
//! order that fits, following `flavorFungibility` when a flavor needs borrowing or
//! preemption (Kueue's documented rules).

use super::api::{BorrowWithinCohortPolicy, WhenCanBorrow, WhenCanPreempt};
use super::engine::Engine;
use super::events::FlavorMap;
use super::model::{CqId, FrId, Group, PodSetInfo, WlId, PODS};
use super::preempt::Victims;
use super::quantity::Time;
use std::collections::BTreeMap;

/// How a request fits a flavor, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    /// Fits in the queue's unused nominal quota.
    Fit,
    /// Fits by borrowing unused quota of the cohort.
    Borrow,
    /// Could fit by preempting admitted workloads (victims not searched yet).
    Preempt,
    NoFit,
}

/// Why no flavor could be assigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    NoFlavor(String),
    ExceedsMax(String),
    /// `message` names the quota free now; `brief` only what was requested, in every
    /// flavor tried, short or not (it changes only when the workload's own request or
    /// the flavors tried change, not with the books).
    Insufficient {
        message: String,
        brief: String,
    },
}

/// What [`Engine::describe_shorts`] says of each shortfall.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// The most the queue could ever get.
    Max,
    /// The quota free now.
    Free,
}

/// The outcome of assigning flavors to every pod set of a workload.
#[derive(Clone, Debug)]
pub(crate) struct Assignment {
    pub mode: Mode,
    pub flavors: FlavorMap,
    /// Total request per `(flavor, resource)`, sorted by id.
    pub usage: Vec<(FrId, i64)>,
    pub counts: Vec<u32>,
    pub borrowing: bool,
    pub failure: Option<Failure>,
    /// `(fr, request, available)` for every considered flavor that was short.
    pub shortfalls: Vec<(FrId, i64, i64)>,
}

struct Option_ {
    slot: usize,
    mode: Mode,
    exceeds: bool,
    shorts: Vec<(FrId, i64, i64)>,
}

impl Engine {
    /// Whether a pod set may run on a flavor's nodes (node labels and taints).
    pub(crate) fn flavor_matches(&self, ps: &PodSetInfo, flavor: &str) -> Result<(), String> {
        let Some(spec) = self.flavors.get(flavor) else {
            return Err(format!("ResourceFlavor {flavor:?} does not exist"));
        };
        for (k, v) in &ps.node_selector {
            if let Some(fv) = spec.node_labels.get(k) {
                if fv != v {
                    return Err(format!(
                        "flavor {flavor} has node label {k}={fv}, pod set {} selects {k}={v}",
                        ps.name
                    ));
                }
            }
        }
        for t in &spec.node_taints {
            if t.effect == "PreferNoSchedule" {
                continue;
            }
            if !ps.tolerations.iter().any(|tol| tol.tolerates(t)) {
                return Err(format!(
                    "flavor {flavor} has taint {}={}:{} that pod set {} does not tolerate",
                    t.key,
                    t.value.as_deref().unwrap_or(""),
                    t.effect,
                    ps.name
                ));
            }
        }
        Ok(())
    }

    fn borrow_within_cohort(&self, cq: CqId) -> bool {
        self.cqs[cq]
            .spec
            .preemption
            .borrow_within_cohort
            .as_ref()
            .is_some_and(|b| b.policy != BorrowWithinCohortPolicy::Never)
    }

    /// Assigns flavors to workload `id` in queue `cq` with `counts` pods per pod set.
    pub(crate) fn assign(&mut self, id: WlId, cq: CqId, counts: &[u32], now: Time) -> Assignment {
        self.assign_with(id, cq, counts, now, false)
    }

    /// Assigns flavors as [`Engine::assign`], or with `ignore_quota` the first flavor of
    /// each resource group whose nodes the pod set may use, whatever its quota (the
    /// flavor a running workload was admitted to, once its pods carry the flavor's
    /// labels): what restores a running workload after its quota was lowered.
    pub(crate) fn assign_with(
        &mut self,
        id: WlId,
        cq: CqId,
        counts: &[u32],
        now: Time,
        ignore_quota: bool,
    ) -> Assignment {
        let w = std::sync::Arc::clone(&self.wls[id].info);
        let spec = std::sync::Arc::clone(&self.cqs[cq].spec);
        let can_preempt = spec.can_preempt();
        let bwc = self.borrow_within_cohort(cq);
        let covers_pods = spec.group_of(PODS).is_some();
        let mut acc: BTreeMap<FrId, i64> = BTreeMap::new();
        let mut flavors = FlavorMap::new();
        let mut mode = Mode::Fit;
        let mut shortfalls = Vec::new();
        let mut failure = None;
        'podsets: for (ps, &n) in w.pod_sets.iter().zip(counts) {
            // Total requests of this pod set, grouped by resource group.
            let mut by_group: BTreeMap<usize, Vec<(String, i64)>> = BTreeMap::new();
            let mut totals: Vec<(String, i64)> = ps
                .requests
                .iter()
                .filter(|(_, q)| q.0 > 0)
                .map(|(r, q)| (r.clone(), q.0.saturating_mul(n as i64)))
                .collect();
            if covers_pods && !ps.requests.contains_key(PODS) {
                totals.push((PODS.to_string(), 1000 * n as i64));
            }
            for (r, total) in totals {
                match spec.group_of(&r) {
                    Some(g) => by_group.entry(g).or_default().push((r, total)),
                    None => {
                        failure = Some(Failure::NoFlavor(format!(
                            "resource {r} of pod set {} is not covered by ClusterQueue {}",
                            ps.name, spec.name
                        )));
                        mode = Mode::NoFit;
                        break 'podsets;
                    }
                }
            }
            for (g, reqs) in by_group {
                let group = &spec.groups[g];
                let mut options: Vec<Option_> = Vec::new();
                let mut mismatches = Vec::new();
                let mut chosen = None;
                for (si, slot) in group.flavors.iter().enumerate() {
                    if let Err(why) = self.flavor_matches(ps, &slot.flavor) {
                        mismatches.push(why);
                        continue;
                    }
                    let mut m = Mode::Fit;
                    let mut exceeds = false;
                    let mut shorts = Vec::new();
                    for (r, total) in &reqs {
                        let Some(&(_, fr)) = slot.resources.iter().find(|(name, _)| name == r)
                        else {
                            continue;
                        };
                        let val = acc.get(&fr).copied().unwrap_or(0) + total;
                        let avail = self.available_for(id, cq, fr, now).unwrap_or(0);
                        let nominal = self.nominal(cq, fr);
                        let rm = if ignore_quota {
                            Mode::Fit
                        } else if val <= avail {
                            if self.usage(cq, fr) + val <= nominal {
                                Mode::Fit
                            } else {
                                Mode::Borrow
                            }
                        } else {
                            shorts.push((fr, val, avail));
                            if val > self.max_capacity(cq, fr) {
                                exceeds = true;
                                Mode::NoFit
                            } else if val <= self.available(cq, fr).unwrap_or(0) {
                                // Only another queue's hold stands in the way: wait for
                                // it to end, never preempt for it (`hold.rs`).
                                Mode::NoFit
                            } else if can_preempt && (val <= nominal || bwc) {
                                Mode::Preempt
                            } else {
                                Mode::NoFit
                            }
                        };
                        m = m.max(rm);
                    }
                    if m == Mode::Preempt {
                        // Preemption oracle: only count the flavor as a preemption option
                        // if some victim set makes room for this pod set there.
                        let want: Vec<(FrId, i64)> =
                            shorts.iter().map(|&(fr, v, _)| (fr, v)).collect();
                        if self.find_victims(id, cq, &want, now) == Victims::None {
                            m = Mode::NoFit;
                        }
                    }
                    let stop = match m {
                        Mode::Fit => true,
                        Mode::Borrow => spec.fungibility.when_can_borrow == WhenCanBorrow::Borrow,
                        Mode::Preempt => {
                            spec.fungibility.when_can_preempt == WhenCanPreempt::Preempt
                        }
                        Mode::NoFit => false,
                    };
                    options.push(Option_ {
                        slot: si,
                        mode: m,
                        exceeds,
                        shorts,
                    });
                    if stop {
                        chosen = Some(options.len() - 1);
                        break;
                    }
                }
                let chosen = chosen
                    .or_else(|| options.iter().position(|o| o.mode == Mode::Borrow))
                    .or_else(|| {
                        // Prefer a preemption that stays within nominal quota.
                        options.iter().position(|o| {
                            o.mode == Mode::Preempt
                                && reqs.iter().all(|(r, total)| {
                                    let slot = &group.flavors[o.slot];
                                    slot.resources.iter().find(|(n, _)| n == r).is_none_or(
                                        |&(_, fr)| {
                                            self.usage(cq, fr)
                                                + acc.get(&fr).copied().unwrap_or(0)
                                                + total
                                                <= self.nominal(cq, fr)
                                        },
                                    )
                                })
                        })
                    })
                    .or_else(|| options.iter().position(|o| o.mode == Mode::Preempt));
                for o in &options {
                    if o.mode >= Mode::Preempt {
                        shortfalls.extend(o.shorts.iter().copied());
                    }
                }
                let Some(ci) = chosen else {
                    mode = Mode::NoFit;
                    let what: Vec<&str> = reqs.iter().map(|(r, _)| r.as_str()).collect();
                    failure = Some(if options.is_empty() {
                        Failure::NoFlavor(format!(
                            "no flavor for {} of pod set {}: {}",
                            what.join(", "),
                            ps.name,
                            mismatches.join("; ")
                        ))
                    } else if options.iter().all(|o| o.exceeds) {
                        Failure::ExceedsMax(format!(
                            "pod set {} requests more than ClusterQueue {} can ever provide: {}",
                            ps.name,
                            spec.name,
                            self.describe_shorts(cq, &options, Detail::Max)
                        ))
                    } else {
                        self.insufficient(cq, &ps.name, &options, (group, &reqs, &acc))
                    });
                    break 'podsets;
                };
                let o = &options[ci];
                mode = mode.max(o.mode);
                if o.mode == Mode::Preempt && failure.is_none() {
                    failure = Some(self.insufficient(
                        cq,
                        &ps.name,
                        std::slice::from_ref(o),
                        (group, &reqs, &acc),
                    ));
                }
                let slot = &group.flavors[o.slot];
                let entry = flavors.entry(ps.name.clone()).or_default();
                for (r, total) in &reqs {
                    if let Some(&(_, fr)) = slot.resources.iter().find(|(n, _)| n == r) {
                        entry.insert(r.clone(), slot.flavor.clone());
                        *acc.entry(fr).or_insert(0) += total;
                    }
                }
            }
        }
        let usage: Vec<(FrId, i64)> = acc.into_iter().collect();
        let borrowing = usage
            .iter()
            .any(|&(fr, v)| self.usage(cq, fr) + v > self.nominal(cq, fr));
        if mode <= Mode::Borrow {
            failure = None;
        }
        Assignment {
            mode,
            flavors,
            usage,
            counts: counts.to_vec(),
            borrowing,
            failure,
            shortfalls,
        }
    }

    /// The failure of a pod set no flavor of `group` could take now. `request` is the
    /// group, the pod set's total requests in it and what earlier pod sets put on each
    /// flavor: the brief message names the request in every flavor tried, short or not
    /// (built here, on failure only, not while trying flavors).
    fn insufficient(
        &self,
        cq: CqId,
        pod_set: &str,
        options: &[Option_],
        request: (&Group, &[(String, i64)], &BTreeMap<FrId, i64>),
    ) -> Failure {
        let (group, reqs, acc) = request;
        let q = |v: i64| super::quantity::Quantity(v).to_string();
        let mut requested = Vec::new();
        for o in options {
            let slot = &group.flavors[o.slot];
            for (r, total) in reqs {
                if let Some(&(_, fr)) = slot.resources.iter().find(|(name, _)| name == r) {
                    let val = acc.get(&fr).copied().unwrap_or(0) + total;
                    requested.push(format!(
                        "{r} in flavor {}: {} requested",
                        slot.flavor,
                        q(val)
                    ));
                }
            }
        }
        Failure::Insufficient {
            message: format!(
                "insufficient unused quota for pod set {pod_set}: {}",
                self.describe_shorts(cq, options, Detail::Free)
            ),
            brief: format!(
                "insufficient unused quota for pod set {pod_set}: {}",
                requested.join("; ")
            ),
        }
    }

    fn describe_shorts(&self, cq: CqId, options: &[Option_], detail: Detail) -> String {
        let mut parts = Vec::new();
        for o in options {
            for &(fr, val, avail) in &o.shorts {
                let (f, r) = &self.fr_names[fr];
                let q = |v: i64| super::quantity::Quantity(v).to_string();
                parts.push(match detail {
                    Detail::Max => format!(
                        "{r} in flavor {f}: {} requested, at most {}",
                        q(val),
                        q(self.max_capacity(cq, fr))
                    ),
                    Detail::Free => format!(
                        "{r} in flavor {f}: {} requested, {} available",
                        q(val),
                        q(avail.max(0))
                    ),
                });
            }
        }
        parts.join("; ")
    }
}
