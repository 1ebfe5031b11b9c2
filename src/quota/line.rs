//! A ClusterQueue's line: each waiting workload's place as its message shows it, and the
//! `Pending` event when that changes without its reason being re-decided (a workload
//! ahead of it left or arrived).
//!
//! With [`Positions::Ranged`] a message shows the exact place only for a queue's first
//! [`exact_places`] workloads and a range further back, so a workload's message moves
//! only when its place crosses the bound of a range. Between two looks at a queue, every
//! place moved by at most the keys put into or taken out of the queue's sets meanwhile
//! ([`KeySet::changes`](super::keyset::KeySet::changes)): only the places that close to
//! the front or to a range's bound are looked at ([`places_to_check`]), so the look costs
//! the changes, not the queue's length. [`LineMarks`] keeps the count from which every
//! reported place is known to hold.

use super::engine::{Engine, OrderKey, WlState};
use super::events::{exact_places, place_range, Event, EventType, Positions};
use super::model::{CqId, WlId};
use super::quantity::Time;
use std::collections::{HashMap, HashSet};

/// Forgotten workloads ([`Engine::forget_reported`]) of one queue above which a look at
/// it walks the whole line rather than counting each one's place alone.
const FORGOTTEN_ALONE: usize = 16;

/// What [`Engine::report_line`] knows of one queue between two looks at it.
#[derive(Clone, Debug, Default)]
pub(crate) struct LineMarks {
    /// Every waiting workload's reported place was its place at some moment when the
    /// queue's changes count was at least this (or it is forgotten).
    base: u64,
    /// The changes count at the first report in the queue since the last look: those
    /// reports' places held then, not (necessarily) at the look.
    first_report: Option<u64>,
}

/// Which places of a line to look at.
#[derive(Debug, PartialEq)]
enum Check {
    All,
    /// 1-based places, inclusive ranges in order, not overlapping.
    Places(Vec<(usize, usize)>),
}

/// The places of a line of `len` whose message may have moved when every place moved by
/// at most `moved`: with exact places every place behind the first change; ranged, a
/// workload now at `r` came from `r ± moved`, and its message changed only if a bound
/// lies between the two — the exact places, and `moved` either side of each range's end.
fn places_to_check(positions: Positions, moved: u64, len: usize) -> Check {
    if moved == 0 {
        return Check::Places(Vec::new());
    }
    let Ok(moved) = usize::try_from(moved) else {
        return Check::All;
    };
    if positions != Positions::Ranged || moved >= len {
        return Check::All;
    }
    let mut out: Vec<(usize, usize)> = vec![(1, exact_places().saturating_add(moved))];
    let mut next = exact_places() + 1;
    while let Some((_, hi)) = place_range(next) {
        let from = (hi + 1).saturating_sub(moved).max(1);
        if from > len {
            break;
        }
        let to = hi.saturating_add(moved);
        match out.last_mut() {
            Some(last) if from <= last.1.saturating_add(1) => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
        next = hi + 1;
    }
    Check::Places(out)
}

/// What of a workload's place its message shows: nothing, the exact place `(p, p)`, or
/// with [`Positions::Ranged`] the range holding it further back.
pub(crate) fn place_key(position: Option<usize>, positions: Positions) -> (usize, usize) {
    match position {
        None => (0, 0),
        Some(p) if positions == Positions::Ranged => place_range(p).unwrap_or((p, p)),
        Some(p) => (p, p),
    }
}

/// The workloads of two key walks in one order (`first(x, y)`: `x` comes before `y`),
/// merged as far as the caller goes.
fn merge<'a, I: Iterator<Item = &'a OrderKey> + 'a>(
    a: I,
    b: I,
    first: fn(&OrderKey, &OrderKey) -> bool,
) -> impl Iterator<Item = WlId> + 'a {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if first(x, y) => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        next.map(|key| key.3)
    })
}

impl Engine {
    /// Emits a `Pending` event for waiting workload `id` at `position` when its reason or
    /// message differs from the one last reported.
    pub(crate) fn report_pending(&mut self, id: WlId, position: Option<usize>, now: Time) {
        self.wls[id].checked = self.flush_epoch;
        if let Some(c) = self.wls[id].cq {
            let changes = self.line_changes(c);
            self.cqs[c].line.first_report.get_or_insert(changes);
        }
        let place = place_key(position, self.cfg.positions);
        let w = &self.wls[id];
        let code = w.reason.code();
        let message = w.reason.message_as(position, self.cfg.positions);
        if w.reported
            .as_ref()
            .is_some_and(|(c, m)| *c == code && *m == message)
        {
            self.wls[id].reported_place = place;
            return;
        }
        let mut ev = Event::new(now, EventType::Pending, w.key.to_string());
        ev.cluster_queue = w.cq.map(|c| self.cqs[c].spec.name.clone());
        ev.reason = Some(code.to_string());
        ev.message = Some(message.clone());
        ev.position = position;
        self.events.push(ev);
        self.wls[id].reported = Some((code, message));
        self.wls[id].reported_place = place;
        self.forgotten.remove(&id);
    }

    /// Emits a `Pending` event for each workload waiting in ClusterQueue `cq` whose
    /// message changed since it was last reported without its reason being re-decided:
    /// its place in the queue moved (a workload ahead of it left or arrived). Looks at
    /// the places that can have moved that far ([`places_to_check`]) and at the
    /// workloads whose report was forgotten.
    pub fn report_line(&mut self, cq: &str, now: Time) {
        let Some(&c) = self.cq_by_name.get(cq) else {
            return;
        };
        if !self.cfg.record_events {
            return;
        }
        let positions = self.cfg.positions;
        let changes = self.line_changes(c);
        let first_report = self.cqs[c].line.first_report.take();
        let moved = changes.saturating_sub(self.cqs[c].line.base);
        let q = &self.cqs[c];
        let len = q.pending.len() + q.parked.len();
        // One that left the line since (admitted, finished, backing off) is reported
        // afresh when it queues again (`enqueue` marks it for the next flush).
        let wls = &self.wls;
        self.forgotten
            .retain(|&id| wls[id].state == WlState::Pending);
        let forgotten: Vec<WlId> = self
            .forgotten
            .iter()
            .copied()
            .filter(|&id| self.wls[id].cq == Some(c) && self.wls[id].state == WlState::Pending)
            .collect();
        let check = match places_to_check(positions, moved, len) {
            _ if forgotten.len() > FORGOTTEN_ALONE => Check::All,
            check => check,
        };
        let mut looks: Vec<(usize, WlId)> = match &check {
            Check::All => self
                .line(c)
                .enumerate()
                .map(|(i, id)| (i + 1, id))
                .collect(),
            Check::Places(ranges) => self.places_in(c, ranges),
        };
        if check != Check::All && !forgotten.is_empty() {
            let seen: HashSet<WlId> = looks.iter().map(|&(_, id)| id).collect();
            for id in forgotten {
                if !seen.contains(&id) {
                    looks.push((self.position_in(c, id), id));
                }
            }
            looks.sort_unstable();
        }
        self.stats.line_looks += looks.len() as u64;
        for (place, id) in looks {
            let w = &self.wls[id];
            // Compared at its place by the last flush already (a re-decided cohort).
            if w.state == WlState::Pending && w.checked != self.flush_epoch {
                let position = w.reason.has_position().then_some(place);
                // Its reason is the one reported (every change of a reason is flushed
                // and compared): the same place writes the same message.
                if w.reported.is_some() && w.reported_place == place_key(position, positions) {
                    continue;
                }
                self.report_pending(id, position, now);
            }
        }
        // Every place now holds as of this look, but those reported earlier in the pass
        // (and not looked at again): they held at their report.
        let line = &mut self.cqs[c].line;
        line.base = first_report.map_or(changes, |f| f.min(changes));
        line.first_report = None;
    }

    /// The workloads at the 1-based places in `ranges` (in order, not overlapping) of
    /// `cq`'s line, in place order: each range found by its first place
    /// ([`Engine::line_split`]) and walked from there, so the look costs the ranges, not
    /// the way to them.
    fn places_in(&self, cq: CqId, ranges: &[(usize, usize)]) -> Vec<(usize, WlId)> {
        let q = &self.cqs[cq];
        let len = q.pending.len() + q.parked.len();
        let mut out = Vec::new();
        for &(first, last) in ranges {
            if first == 0 || first > len {
                continue;
            }
            let (queued, parked) = self.line_split(cq, first - 1);
            let walk = merge(
                q.pending.range_idx(queued..),
                q.parked.range_idx(parked..),
                |x, y| x <= y,
            );
            out.extend((first..=last.min(len)).zip(walk));
        }
        out
    }

    /// How the first `k` places of `cq`'s line split between its two sets: `(i, k - i)`,
    /// the line's first `k` workloads being the first `i` queued and the first `k - i`
    /// parked (each set ordered as the line). A binary search on `i` with the sets'
    /// select: `k` within the line's length.
    fn line_split(&self, cq: CqId, k: usize) -> (usize, usize) {
        let q = &self.cqs[cq];
        let (a, b) = (&q.pending, &q.parked);
        let (mut lo, mut hi) = (k.saturating_sub(b.len()), k.min(a.len()));
        // For `i` in `lo..hi`, queued key `i` is among the first `k` exactly when it comes
        // before parked key `k - i - 1` (both exist there); true up to the split.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match (a.get_index(mid), b.get_index(k - mid - 1)) {
                (Some(x), Some(y)) if x < y => lo = mid + 1,
                _ => hi = mid,
            }
        }
        (lo, k - lo)
    }

    /// Keys put into or taken out of `cq`'s queued and parked sets so far.
    fn line_changes(&self, cq: CqId) -> u64 {
        let q = &self.cqs[cq];
        q.pending.changes() + q.parked.changes()
    }

    /// Forgets what was last reported for `key`: the controller wrote something else
    /// (or kept the recorded reason), so its next report is a change again.
    pub fn forget_reported(&mut self, key: &str) {
        if let Some(&id) = self.wl_by_key.get(key) {
            self.wls[id].reported = None;
            self.forgotten.insert(id);
        }
    }

    /// The 1-based place of every workload queued or parked in `cq`, in one walk over
    /// both (each in queue order).
    pub(crate) fn queue_ranks(&self, cq: CqId) -> HashMap<WlId, usize> {
        self.line(cq)
            .enumerate()
            .map(|(i, id)| (id, i + 1))
            .collect()
    }

    /// The workloads queued or parked in `cq`, in queue order, as a merge of both sets
    /// walked as far as the caller goes.
    pub(crate) fn line(&self, cq: CqId) -> impl Iterator<Item = WlId> + '_ {
        let q = &self.cqs[cq];
        merge(q.pending.iter(), q.parked.iter(), |x, y| x <= y)
    }

    /// 1-based place among the pending workloads of its ClusterQueue, when the reason
    /// is about waiting in line.
    pub(crate) fn position(&self, id: WlId) -> Option<usize> {
        let w = &self.wls[id];
        if !w.reason.has_position() || w.state != WlState::Pending {
            return None;
        }
        Some(self.position_in(w.cq?, id))
    }

    /// 1-based place of `id` among the waiting workloads (queued or parked) of `cq`:
    /// the keys before its own in both sets, counted by rank (no walk).
    pub(crate) fn position_in(&self, cq: CqId, id: WlId) -> usize {
        let q = &self.cqs[cq];
        let key = self.wls[id].order_key(id);
        q.pending.rank(&key) + q.parked.rank(&key) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::events::set_exact_places_for_tests;
    use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
    use crate::quota::keyset::KeySet;
    use crate::quota::{EngineConfig, WorkloadInfo};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    const GPU: &str = "nvidia.com/gpu";

    #[test]
    fn the_places_to_check_are_the_front_and_each_ranges_end() {
        set_exact_places_for_tests(10);
        let ranged = Positions::Ranged;
        assert_eq!(places_to_check(ranged, 0, 1000), Check::Places(vec![]));
        assert_eq!(places_to_check(Positions::Exact, 1, 1000), Check::All);
        assert_eq!(places_to_check(ranged, 1000, 1000), Check::All);
        // Ranges 11-20, 21-50, 51-100, ...: `moved` either side of 20, 50, 100, ...,
        // up to the line's end (1000; the range ending at 2000 starts past it).
        assert_eq!(
            places_to_check(ranged, 2, 1000),
            Check::Places(vec![
                (1, 12),
                (19, 22),
                (49, 52),
                (99, 102),
                (199, 202),
                (499, 502),
                (999, 1002)
            ])
        );
        // Windows that meet are one: 1-25, then 6-35 and 36-65 around 20 and 50.
        assert_eq!(
            places_to_check(ranged, 15, 60),
            Check::Places(vec![(1, 65)])
        );
    }

    /// A one-GPU workload of priority `priority`: each its own shape, so leaving the line
    /// wakes no other (a wake-up moves keys between the queue's sets, which counts as
    /// more moves than there were and would hide a look too narrow).
    fn one_gpu(key: &str, priority: i32) -> WorkloadInfo {
        WorkloadInfo::new(key, "q")
            .pod_set("main", 1, &[(GPU, 1)])
            .priority(priority)
    }

    /// One queue of 4 GPUs kept full by `big`, with `n` one-GPU workloads waiting, in
    /// the order of their names.
    fn long_line(n: usize) -> Engine {
        let mut e = Engine::new(EngineConfig {
            positions: Positions::Ranged,
            ..EngineConfig::default()
        });
        e.apply_flavor(&flavor("h100"), 0).unwrap();
        e.apply_cluster_queue(&cluster_queue("q").quota("h100", GPU, 4).build(), 0)
            .unwrap();
        e.apply_local_queue(&local_queue("ml", "q", "q"), 0)
            .unwrap();
        let big = WorkloadInfo::new("ml/big", "q")
            .pod_set("main", 1, &[(GPU, 4)])
            .priority(i32::MAX);
        e.submit(0, big).unwrap();
        for i in 0..n {
            e.submit(1, one_gpu(&format!("ml/w{i:05}"), line_priority(i)))
                .unwrap();
        }
        e.schedule(1).unwrap();
        e
    }

    /// The priority that puts a workload at `i` in [`long_line`]'s order (arrivals take
    /// others in between).
    fn line_priority(i: usize) -> i32 {
        1_000_000_000 - 10_000 * i as i32
    }

    /// The last `Pending` message of each workload, from `events`.
    fn note(said: &mut BTreeMap<String, String>, events: Vec<Event>) {
        for ev in events {
            if ev.kind == EventType::Pending {
                said.insert(ev.workload, ev.message.unwrap_or_default());
            }
        }
    }

    /// After each change and a look at the line, every waiting workload's last reported
    /// message is the one its place gives now (`pending_entry`), whatever moved where:
    /// removals and arrivals anywhere, the head admitted, forgotten reports.
    #[test]
    fn every_reported_place_holds_after_each_look() {
        set_exact_places_for_tests(3);
        let mut e = long_line(300);
        let mut said = BTreeMap::new();
        e.report_line("q", 1);
        note(&mut said, e.take_events());
        let mut waiting: Vec<String> = (0..300).map(|i| format!("ml/w{i:05}")).collect();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rand = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for step in 0..400u64 {
            let now = 10 + step;
            match rand(4) {
                // One leaves from anywhere in the line.
                0 if !waiting.is_empty() => {
                    let k = waiting.remove(rand(waiting.len()));
                    e.remove(now, &k).unwrap();
                    said.remove(&k);
                }
                // One arrives anywhere in the line (by its creation time).
                1 => {
                    let k = format!("ml/n{step:05}");
                    let priority = line_priority(rand(400)) + step as i32 + 1;
                    e.submit(now, one_gpu(&k, priority)).unwrap();
                    waiting.push(k);
                }
                // The controller wrote something else for one: forgotten.
                2 if !waiting.is_empty() => {
                    let k = waiting[rand(waiting.len())].clone();
                    e.forget_reported(&k);
                    said.remove(&k);
                }
                _ => {}
            }
            e.schedule(now).unwrap();
            e.report_line("q", now);
            note(&mut said, e.take_events());
            for k in &waiting {
                let (_, want) = e.pending_entry(k).unwrap();
                assert_eq!(said.get(k), Some(&want), "{k} at step {step}");
            }
        }
    }

    /// One arrival at the back of a line of 5,000 looks at the front and around each
    /// range's end, not at the whole line.
    #[test]
    fn a_look_after_one_change_costs_the_change_not_the_line() {
        set_exact_places_for_tests(10);
        let mut e = long_line(5_000);
        e.report_line("q", 1);
        e.take_events();
        // Once more with nothing changed: nothing to look at.
        let before = e.stats.line_looks;
        e.report_line("q", 2);
        assert_eq!(e.stats.line_looks, before);
        e.submit(3, one_gpu("ml/late", 0)).unwrap();
        e.schedule(3).unwrap();
        let before = e.stats.line_looks;
        e.report_line("q", 3);
        let looked = e.stats.line_looks - before;
        assert!(looked < 100, "looked at {looked} of 5,001");
        // An arrival at the front moves everyone: the messages at the range ends
        // change, each once.
        e.take_events();
        e.submit(4, one_gpu("ml/first", i32::MAX - 1)).unwrap();
        e.schedule(4).unwrap();
        e.report_line("q", 4);
        let moved: Vec<String> = e
            .take_events()
            .into_iter()
            .filter(|ev| ev.kind == EventType::Pending)
            .map(|ev| ev.workload)
            .collect();
        // `first`, the 10 exact places and one at the end of each range up to 5,000
        // (20, 50, ..., 5,000: 8 of them).
        assert_eq!(moved.len(), 1 + 10 + 8, "{moved:?}");
    }

    /// The places found by rank and select are the places of a walk along the line,
    /// however its workloads are spread between the queued and the parked set: every
    /// split point, every range (empty, single, past the end), every key's rank.
    #[test]
    fn places_found_by_rank_are_the_walked_places() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for (n, parked_share) in [(0, 2), (1, 2), (7, 1), (300, 2), (300, 10), (1_000, 1)] {
            let mut e = long_line(0);
            let c = e.cq_by_name["q"];
            let q = &mut e.cqs[c];
            q.pending = KeySet::default();
            q.parked = KeySet::default();
            for i in 0..n {
                let key: OrderKey = (rand(50) as i64, rand(5), Arc::from(format!("w{i}")), i, 0);
                if rand(parked_share + 1) == 0 {
                    q.pending.insert(key);
                } else {
                    q.parked.insert(key);
                }
            }
            let walked: Vec<WlId> = e.line(c).collect();
            assert_eq!(walked.len(), n);
            for k in 0..=n {
                let (queued, parked) = e.line_split(c, k);
                let firsts: HashSet<WlId> = e.cqs[c]
                    .pending
                    .iter()
                    .take(queued)
                    .chain(e.cqs[c].parked.iter().take(parked))
                    .map(|key| key.3)
                    .collect();
                assert_eq!(
                    firsts,
                    walked[..k].iter().copied().collect(),
                    "n {n}, k {k}"
                );
            }
            for (first, last) in [
                (1, 1),
                (1, 3),
                (2, 9),
                ((n / 2).max(1), n / 2 + 4),
                (n, n + 5),
                (n + 1, n + 9),
            ] {
                let want: Vec<(usize, WlId)> = (1..=n)
                    .zip(walked.iter().copied())
                    .filter(|(p, _)| (first..=last).contains(p))
                    .collect();
                assert_eq!(
                    e.places_in(c, &[(first, last)]),
                    want,
                    "n {n}, {first}-{last}"
                );
            }
            for key in e.cqs[c].pending.iter().chain(e.cqs[c].parked.iter()) {
                let rank = e.cqs[c].pending.rank(key) + e.cqs[c].parked.rank(key);
                assert_eq!(walked[rank], key.3, "n {n}");
            }
        }
    }
}
