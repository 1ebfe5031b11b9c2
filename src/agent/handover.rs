//! Each GPU's ownership between the two kubelet paths as one state machine: which path
//! has the GPU, whether a move is blocked by what holds it, and the two-phase move off
//! the DRA driver ([`super::withdraw`]). Pure: events in, the new state and effects (data)
//! out; the agent reads the node (checkpoints, claims, slices), turns what it reads into
//! [`Event`]s, and carries out the [`Effect`]s (builds what each path advertises, records
//! Events, lists claims).
//!
//! States ([`State`]):
//!
//! | state | advertised by | meaning |
//! |---|---|---|
//! | `Unowned` | nobody | no split decided yet (before the first config) |
//! | `Owned(p)` | `p` | on path `p`, where the split wants it |
//! | `Blocked { at, wants, by }` | `at` | the split wants `wants`; `by` holds it on `at` |
//! | `Withdrawing { slices_clear }` | nobody | leaving the DRA driver for the device plugin |
//!
//! Each GPU keeps, besides its state, the inputs the last events gave it: the path the
//! split wants ([`Event::Wanted`]) and what holds it on each path ([`Event::Held`]).
//! Every event updates those inputs and the state is then resolved once from the old
//! state and the inputs, so an event that changes nothing yields no effect.
//!
//! Resolving (`at`: where the GPU is; a withdrawing GPU is still at the DRA driver for
//! this, since a claim there takes it back; a path that does not run holds nothing):
//!
//! | situation | next state |
//! |---|---|
//! | held on `at` and the split wants the other path | `Blocked { at, .. }` |
//! | held on `at`, wanted there | `Owned(at)` |
//! | held only on the path it is not on (e.g. at start) | that path, `Blocked` if not wanted there |
//! | free, wanted on the DRA driver | `Owned(Dra)` (the device plugin stops listing it first) |
//! | free, wanted on the device plugin, at the DRA driver | `Withdrawing { slices_clear: false }` |
//! | `Withdrawing { slices_clear: true }` and [`Event::ClaimsListed`] empty | `Owned(DevicePlugin)` |
//! | `Withdrawing { slices_clear: true }` and a claim listed | `Blocked { at: Dra, .. }` (rolled back) |
//! | free, wanted on the device plugin, elsewhere | `Owned(DevicePlugin)` |
//!
//! Only the move off the DRA driver takes two phases: the scheduler may allocate a claim
//! from slices it saw before they dropped the GPU, so the device plugin lists the GPU only
//! after the slices are gone from the API server ([`Event::SlicesCleared`]) and a LIST of
//! the claims allocated on the node found none on it ([`Event::ClaimsListed`]). A move to
//! the DRA driver is withdrawn from the device plugin and published in one step: the
//! device plugin's list is the kubelet's, and a pod holding the GPU is in the kubelet's
//! checkpoint ([`Event::Held`]), which blocks the move.
//!
//! Effects ([`Action`]) follow from the change of state: what each path advertises
//! (withdrawals before publications), a `GpuMoveBlocked` report when a move becomes
//! blocked (once per blocked move, not when only its holders change), a note when it no
//! longer is, the request to list claims in phase 2, and a warning for an event that
//! does not fit the state (the state stays).
//!
//! At start ([`Event::Restored`]) a GPU the DRA driver had before (the split record, or
//! what survives of it) starts as `Owned(Dra)`; the others start `Unowned`, so the first
//! [`Event::Wanted`] gives them their path without a handover (nothing withdrawn from the
//! device plugin, which served nothing yet). Fed the same holders and wishes, a machine
//! rebuilt this way reaches the state the old one had (a phase 2 under way starts over).

use std::collections::{BTreeMap, BTreeSet};

use super::ownership::Owner;

/// Which kubelet paths run. A path that does not run advertises and holds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paths {
    pub device_plugin: bool,
    pub dra: bool,
}

impl Paths {
    fn runs(self, path: Owner) -> bool {
        match path {
            Owner::DevicePlugin => self.device_plugin,
            Owner::Dra => self.dra,
        }
    }
}

/// Where one GPU is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum State {
    /// No split decided yet.
    #[default]
    Unowned,
    /// On this path, where the split wants it.
    Owned(Owner),
    /// On `at`, which `by` (pods' containers, claims) hold; the split wants `wants`.
    Blocked {
        at: Owner,
        wants: Owner,
        by: Vec<String>,
    },
    /// Leaving the DRA driver for the device plugin: on neither path. `slices_clear`: the
    /// API server's slices have stopped naming it, the claims LIST is due.
    Withdrawing { slices_clear: bool },
}

impl State {
    /// The path that advertises the GPU in this state.
    pub fn advertised_by(&self) -> Option<Owner> {
        match self {
            State::Owned(p) | State::Blocked { at: p, .. } => Some(*p),
            State::Unowned | State::Withdrawing { .. } => None,
        }
    }

    /// The path the GPU is at for pinning: a withdrawing GPU is still the driver's.
    fn at(&self) -> Option<Owner> {
        match self {
            State::Withdrawing { .. } => Some(Owner::Dra),
            other => other.advertised_by(),
        }
    }
}

/// Something the agent read about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// At start: an earlier run left the GPU with this path.
    Restored(Owner),
    /// The split (flags, node config) wants the GPU on this path.
    Wanted(Owner),
    /// What holds the GPU on one path now (replaces the earlier list; empty: nothing).
    Held { on: Owner, by: Vec<String> },
    /// Phase 2: the API server's slices have named no device of the GPU for the settle
    /// time.
    SlicesCleared,
    /// Phase 2: the API server's slices name the GPU (again).
    SlicesNamed,
    /// Phase 2: the claims allocated on the GPU, listed after its slices cleared.
    ClaimsListed(Vec<String>),
    /// One reading of the node: the holders on both paths, then the phase-2 LIST if one
    /// was made, then the split's wish, resolved once.
    Observed {
        wants: Owner,
        device_plugin: Vec<String>,
        dra: Vec<String>,
        listed: Option<Vec<String>>,
    },
}

/// What the agent does for one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop listing the GPU in the device plugin (its MIG layout goes with it).
    WithdrawFromDevicePlugin,
    /// Publish the DRA driver's slices without the GPU.
    UnpublishFromDra,
    /// List the GPU in the device plugin.
    AdvertiseOnDevicePlugin,
    /// Publish the GPU in the DRA driver's slices.
    PublishToDra,
    /// Phase 2: list the claims allocated on the node.
    ListClaims,
    /// A move became blocked: record a `GpuMoveBlocked` Event.
    ReportBlocked {
        at: Owner,
        wants: Owner,
        by: Vec<String>,
    },
    /// A blocked move is no longer blocked (it happened, or the split changed).
    Unblocked { was_at: Owner, wanted: Owner },
    /// An event that does not fit the state; the state stays.
    Warn(String),
}

/// An action for a GPU (by UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub gpu: String,
    pub action: Action,
}

/// One GPU: its state and the inputs the events gave it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gpu {
    pub state: State,
    /// The path the split wants (`None` before the first [`Event::Wanted`]).
    wants: Option<Owner>,
    device_plugin: Vec<String>,
    dra: Vec<String>,
}

impl Gpu {
    fn held(&self, on: Owner) -> &[String] {
        match on {
            Owner::DevicePlugin => &self.device_plugin,
            Owner::Dra => &self.dra,
        }
    }

    fn held_mut(&mut self, on: Owner) -> &mut Vec<String> {
        match on {
            Owner::DevicePlugin => &mut self.device_plugin,
            Owner::Dra => &mut self.dra,
        }
    }
}

fn other(p: Owner) -> Owner {
    match p {
        Owner::DevicePlugin => Owner::Dra,
        Owner::Dra => Owner::DevicePlugin,
    }
}

/// The next GPU and its actions for `event`. Never panics: an event that does not fit
/// leaves the GPU as it is with an [`Action::Warn`].
pub fn transition(gpu: &Gpu, paths: Paths, event: Event) -> (Gpu, Vec<Action>) {
    let mut next = gpu.clone();
    let phase2 = match take(&mut next, paths, event) {
        Ok(phase2) => phase2,
        Err(why) => return (gpu.clone(), vec![Action::Warn(why)]),
    };
    let mut actions = Vec::new();
    if phase2 == Phase2::ListClaims {
        actions.push(Action::ListClaims);
    }
    if let Some(wants) = next.wants {
        next.state = resolve(&next, paths, wants, phase2 == Phase2::Confirmed);
    }
    actions.extend(effects(&gpu.state, &next.state));
    (next, actions)
}

/// What an event did to phase 2 of a move off the DRA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase2 {
    Nothing,
    /// The slices cleared: the claims LIST is due.
    ListClaims,
    /// The LIST found no claim on the GPU: the move is done.
    Confirmed,
}

/// Update `gpu`'s inputs from `event`; `Err` says why the event does not fit.
fn take(gpu: &mut Gpu, paths: Paths, event: Event) -> Result<Phase2, String> {
    match event {
        Event::Restored(p) => match (&gpu.state, paths.runs(p)) {
            (State::Unowned, true) => gpu.state = State::Owned(p),
            (State::Unowned, false) => return Err(format!("restored to {p}, which does not run")),
            (s, _) => return Err(format!("restored to {p} while {s:?}: only at start")),
        },
        Event::Wanted(p) if !paths.runs(p) => {
            return Err(format!("wanted on {p}, which does not run"));
        }
        Event::Wanted(p) => gpu.wants = Some(p),
        Event::Held { on, by } => *gpu.held_mut(on) = by,
        Event::SlicesCleared => match &gpu.state {
            State::Withdrawing {
                slices_clear: false,
            } => {
                gpu.state = State::Withdrawing { slices_clear: true };
                return Ok(Phase2::ListClaims);
            }
            State::Withdrawing { slices_clear: true } => {}
            s => return Err(format!("slices cleared while {s:?}: not withdrawing")),
        },
        Event::SlicesNamed => match &gpu.state {
            State::Withdrawing { .. } => {
                gpu.state = State::Withdrawing {
                    slices_clear: false,
                }
            }
            s => return Err(format!("slices name it while {s:?}: not withdrawing")),
        },
        Event::ClaimsListed(claims) => return listed(gpu, claims),
        Event::Observed {
            wants,
            device_plugin,
            dra,
            listed: list,
        } => {
            if !paths.runs(wants) {
                return Err(format!("wanted on {wants}, which does not run"));
            }
            gpu.device_plugin = device_plugin;
            gpu.dra = dra;
            gpu.wants = Some(wants);
            // A LIST for a GPU that stopped waiting for it (a claim took it back) is stale.
            if let (Some(claims), State::Withdrawing { slices_clear: true }) = (list, &gpu.state) {
                return listed(gpu, claims);
            }
        }
    }
    Ok(Phase2::Nothing)
}

/// Phase 2's LIST: no claim confirms the move, a claim pins the GPU to the driver.
fn listed(gpu: &mut Gpu, claims: Vec<String>) -> Result<Phase2, String> {
    if gpu.state != (State::Withdrawing { slices_clear: true }) {
        return Err(format!(
            "claims listed while {:?}: not waiting for them",
            gpu.state
        ));
    }
    if claims.is_empty() {
        return Ok(Phase2::Confirmed);
    }
    for c in claims {
        if !gpu.dra.contains(&c) {
            gpu.dra.push(c);
        }
    }
    Ok(Phase2::Nothing)
}

/// The state `gpu`'s inputs call for, from its current state (see the module table).
fn resolve(gpu: &Gpu, paths: Paths, wants: Owner, confirmed: bool) -> State {
    let pinned = |p: Owner| paths.runs(p) && !gpu.held(p).is_empty();
    let at = gpu.state.at().filter(|p| paths.runs(*p));
    let target = match at {
        Some(at) if pinned(at) => at,
        _ if pinned(other(wants)) => other(wants),
        _ => wants,
    };
    let settled = |t: Owner| {
        if t == wants {
            State::Owned(t)
        } else {
            State::Blocked {
                at: t,
                wants,
                by: gpu.held(t).to_vec(),
            }
        }
    };
    match (target, at) {
        // Off the DRA driver only in two phases.
        (Owner::DevicePlugin, Some(Owner::Dra)) if paths.device_plugin => match gpu.state {
            State::Withdrawing { slices_clear: true } if confirmed => settled(target),
            State::Withdrawing { slices_clear } => State::Withdrawing { slices_clear },
            _ => State::Withdrawing {
                slices_clear: false,
            },
        },
        (t, _) => settled(t),
    }
}

/// The actions a change from `from` to `to` calls for.
fn effects(from: &State, to: &State) -> Vec<Action> {
    let mut out = Vec::new();
    let (was, is) = (from.advertised_by(), to.advertised_by());
    if was != is {
        match was {
            Some(Owner::DevicePlugin) => out.push(Action::WithdrawFromDevicePlugin),
            Some(Owner::Dra) => out.push(Action::UnpublishFromDra),
            None => {}
        }
        // A first placement (or a GPU restored at start) is published by the first build.
        match is {
            Some(Owner::DevicePlugin) => out.push(Action::AdvertiseOnDevicePlugin),
            Some(Owner::Dra) => out.push(Action::PublishToDra),
            None => {}
        }
    }
    let blocked = |s: &State| match s {
        State::Blocked { at, wants, by } => Some((*at, *wants, by.clone())),
        _ => None,
    };
    match (blocked(from), blocked(to)) {
        (Some((a, w, _)), Some((b, v, by))) if (a, w) != (b, v) => {
            out.push(Action::ReportBlocked {
                at: b,
                wants: v,
                by,
            });
        }
        (None, Some((at, wants, by))) => out.push(Action::ReportBlocked { at, wants, by }),
        (Some((was_at, wanted, _)), None) => out.push(Action::Unblocked { was_at, wanted }),
        _ => {}
    }
    out
}

/// Every GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    paths: Paths,
    gpus: BTreeMap<String, Gpu>,
}

impl Machine {
    pub fn new(paths: Paths) -> Self {
        Self {
            paths,
            gpus: BTreeMap::new(),
        }
    }

    pub fn paths(&self) -> Paths {
        self.paths
    }

    /// Feed `event` to GPU `gpu` (a GPU not seen before starts `Unowned`).
    pub fn step(&mut self, gpu: &str, event: Event) -> Vec<Effect> {
        let current = self.gpus.get(gpu).cloned().unwrap_or_default();
        let (next, actions) = transition(&current, self.paths, event);
        self.gpus.insert(gpu.to_string(), next);
        actions
            .into_iter()
            .map(|action| Effect {
                gpu: gpu.to_string(),
                action,
            })
            .collect()
    }

    /// Forget the GPUs not in `present` (gone from the node).
    pub fn retain(&mut self, present: &BTreeSet<String>) {
        self.gpus.retain(|uuid, _| present.contains(uuid));
    }

    /// GPU `gpu`'s state (`Unowned` when not seen).
    pub fn state(&self, gpu: &str) -> State {
        self.gpus
            .get(gpu)
            .map(|g| g.state.clone())
            .unwrap_or_default()
    }

    /// Whether a split was decided (some GPU was given a path).
    pub fn decided(&self) -> bool {
        self.gpus.values().any(|g| g.wants.is_some())
    }

    /// The path each GPU belongs to in the split (a withdrawing GPU is the device
    /// plugin's; an unowned one too).
    pub fn owners(&self) -> BTreeMap<String, Owner> {
        self.gpus
            .iter()
            .map(|(uuid, g)| {
                let owner = match &g.state {
                    State::Owned(p) | State::Blocked { at: p, .. } => *p,
                    State::Unowned | State::Withdrawing { .. } => Owner::DevicePlugin,
                };
                (uuid.clone(), owner)
            })
            .collect()
    }

    /// GPUs leaving the DRA driver, not advertised by either path.
    pub fn withdrawing(&self) -> BTreeSet<String> {
        self.select(|s| matches!(s, State::Withdrawing { .. }))
    }

    /// GPUs waiting for phase 2's claims LIST.
    pub fn awaiting_claims(&self) -> BTreeSet<String> {
        self.select(|s| *s == State::Withdrawing { slices_clear: true })
    }

    /// The blocked moves: GPU UUID, where it stays, where the split wants it, holders.
    pub fn blocked(&self) -> impl Iterator<Item = (&str, Owner, Owner, &[String])> {
        self.gpus.iter().filter_map(|(uuid, g)| match &g.state {
            State::Blocked { at, wants, by } => Some((uuid.as_str(), *at, *wants, by.as_slice())),
            _ => None,
        })
    }

    fn select(&self, f: impl Fn(&State) -> bool) -> BTreeSet<String> {
        self.gpus
            .iter()
            .filter(|(_, g)| f(&g.state))
            .map(|(uuid, _)| uuid.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Owner::{DevicePlugin as Dp, Dra};

    const BOTH: Paths = Paths {
        device_plugin: true,
        dra: true,
    };

    fn held(on: Owner, by: &[&str]) -> Event {
        Event::Held {
            on,
            by: by.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn claims(by: &[&str]) -> Vec<String> {
        by.iter().map(|s| s.to_string()).collect()
    }

    /// The GPU after `events`, and the actions of the last one.
    fn run(paths: Paths, events: &[Event]) -> (Gpu, Vec<Action>) {
        let mut gpu = Gpu::default();
        let mut last = Vec::new();
        for e in events {
            (gpu, last) = transition(&gpu, paths, e.clone());
        }
        (gpu, last)
    }

    fn blocked(at: Owner, wants: Owner, by: &[&str]) -> State {
        State::Blocked {
            at,
            wants,
            by: claims(by),
        }
    }

    fn report(at: Owner, wants: Owner, by: &[&str]) -> Action {
        Action::ReportBlocked {
            at,
            wants,
            by: claims(by),
        }
    }

    #[test]
    fn every_transition() {
        use Action::*;
        use Event::*;
        let withdrawing = |slices_clear| State::Withdrawing { slices_clear };
        let on_dra = || vec![Restored(Dra), Wanted(Dra)];
        let leaving = || vec![Restored(Dra), Wanted(Dp)];
        let clear = || vec![Restored(Dra), Wanted(Dp), SlicesCleared];
        // (what came before, the event, the state after it, its actions)
        type Case = (Vec<Event>, Event, State, Vec<Action>);
        let cases: Vec<Case> = vec![
            // First placement: no handover.
            (
                vec![],
                Wanted(Dp),
                State::Owned(Dp),
                vec![AdvertiseOnDevicePlugin],
            ),
            (vec![], Wanted(Dra), State::Owned(Dra), vec![PublishToDra]),
            (vec![], Restored(Dra), State::Owned(Dra), vec![PublishToDra]),
            (vec![], held(Dra, &["c"]), State::Unowned, vec![]),
            // At start a claim in the checkpoint keeps the GPU with the driver.
            (
                vec![held(Dra, &["c"])],
                Wanted(Dp),
                blocked(Dra, Dp, &["c"]),
                vec![PublishToDra, report(Dra, Dp, &["c"])],
            ),
            // To the DRA driver: withdrawn from the device plugin and published at once.
            (
                vec![Wanted(Dp)],
                Wanted(Dra),
                State::Owned(Dra),
                vec![WithdrawFromDevicePlugin, PublishToDra],
            ),
            // ...unless a pod holds it.
            (
                vec![Wanted(Dp), held(Dp, &["pod p"])],
                Wanted(Dra),
                blocked(Dp, Dra, &["pod p"]),
                vec![report(Dp, Dra, &["pod p"])],
            ),
            (
                vec![Wanted(Dp), held(Dp, &["pod p"]), Wanted(Dra)],
                held(Dp, &[]),
                State::Owned(Dra),
                vec![
                    WithdrawFromDevicePlugin,
                    PublishToDra,
                    Unblocked {
                        was_at: Dp,
                        wanted: Dra,
                    },
                ],
            ),
            // Another holder of a blocked GPU: no second report.
            (
                vec![Wanted(Dp), held(Dp, &["pod p"]), Wanted(Dra)],
                held(Dp, &["pod q"]),
                blocked(Dp, Dra, &["pod q"]),
                vec![],
            ),
            // The split changes back: no longer blocked, nothing moves.
            (
                vec![Wanted(Dp), held(Dp, &["pod p"]), Wanted(Dra)],
                Wanted(Dp),
                State::Owned(Dp),
                vec![Unblocked {
                    was_at: Dp,
                    wanted: Dra,
                }],
            ),
            // Off the DRA driver: phase 1.
            (
                on_dra(),
                Wanted(Dp),
                withdrawing(false),
                vec![UnpublishFromDra],
            ),
            // ...unless a claim holds it.
            (
                vec![Restored(Dra), Wanted(Dra), held(Dra, &["c"])],
                Wanted(Dp),
                blocked(Dra, Dp, &["c"]),
                vec![report(Dra, Dp, &["c"])],
            ),
            (
                vec![Restored(Dra), held(Dra, &["c"]), Wanted(Dp)],
                held(Dra, &[]),
                withdrawing(false),
                vec![
                    UnpublishFromDra,
                    Unblocked {
                        was_at: Dra,
                        wanted: Dp,
                    },
                ],
            ),
            // Phase 2.
            (
                leaving(),
                SlicesCleared,
                withdrawing(true),
                vec![ListClaims],
            ),
            (clear(), SlicesCleared, withdrawing(true), vec![]),
            (clear(), SlicesNamed, withdrawing(false), vec![]),
            (
                clear(),
                ClaimsListed(vec![]),
                State::Owned(Dp),
                vec![AdvertiseOnDevicePlugin],
            ),
            (
                clear(),
                ClaimsListed(claims(&["c"])),
                blocked(Dra, Dp, &["c"]),
                vec![PublishToDra, report(Dra, Dp, &["c"])],
            ),
            // A claim prepared while it withdraws takes it back.
            (
                leaving(),
                held(Dra, &["c"]),
                blocked(Dra, Dp, &["c"]),
                vec![PublishToDra, report(Dra, Dp, &["c"])],
            ),
            // The split changes back while it withdraws.
            (
                leaving(),
                Wanted(Dra),
                State::Owned(Dra),
                vec![PublishToDra],
            ),
            // One reading with the LIST.
            (
                clear(),
                Observed {
                    wants: Dp,
                    device_plugin: vec![],
                    dra: vec![],
                    listed: Some(vec![]),
                },
                State::Owned(Dp),
                vec![AdvertiseOnDevicePlugin],
            ),
            (
                clear(),
                Observed {
                    wants: Dp,
                    device_plugin: vec![],
                    dra: claims(&["c"]),
                    listed: Some(claims(&["d"])),
                },
                blocked(Dra, Dp, &["c", "d"]),
                vec![PublishToDra, report(Dra, Dp, &["c", "d"])],
            ),
        ];
        for (before, event, want_state, want_actions) in cases {
            let (gpu, _) = run(BOTH, &before);
            let (next, actions) = transition(&gpu, BOTH, event.clone());
            assert_eq!(
                (&next.state, &actions),
                (&want_state, &want_actions),
                "{before:?} then {event:?}"
            );
        }
    }

    #[test]
    fn events_that_do_not_fit_warn_and_change_nothing() {
        use Event::*;
        let dp_only = Paths {
            device_plugin: true,
            dra: false,
        };
        // (paths, what came before, the event)
        let cases: Vec<(Paths, Vec<Event>, Event)> = vec![
            (BOTH, vec![Wanted(Dp)], Restored(Dra)),
            (dp_only, vec![], Restored(Dra)),
            (dp_only, vec![Wanted(Dp)], Wanted(Dra)),
            (BOTH, vec![Wanted(Dp)], SlicesCleared),
            (BOTH, vec![Wanted(Dra)], SlicesNamed),
            (BOTH, vec![Restored(Dra), Wanted(Dp)], ClaimsListed(vec![])),
            (BOTH, vec![], ClaimsListed(claims(&["c"]))),
            (
                dp_only,
                vec![],
                Observed {
                    wants: Dra,
                    device_plugin: vec![],
                    dra: vec![],
                    listed: None,
                },
            ),
        ];
        for (paths, before, event) in cases {
            let (gpu, _) = run(paths, &before);
            let (next, actions) = transition(&gpu, paths, event.clone());
            assert_eq!(next, gpu, "{before:?} then {event:?}");
            assert!(
                matches!(actions.as_slice(), [Action::Warn(_)]),
                "{before:?} then {event:?}: {actions:?}"
            );
        }
    }

    #[test]
    fn a_path_that_does_not_run_holds_nothing() {
        let dp_only = Paths {
            device_plugin: true,
            dra: false,
        };
        let (gpu, _) = run(dp_only, &[held(Dra, &["c"]), Event::Wanted(Dp)]);
        assert_eq!(gpu.state, State::Owned(Dp));
        let dra_only = Paths {
            device_plugin: false,
            dra: true,
        };
        let (gpu, _) = run(dra_only, &[held(Dp, &["pod p"]), Event::Wanted(Dra)]);
        assert_eq!(gpu.state, State::Owned(Dra));
    }

    #[test]
    fn repeated_events_change_nothing_the_second_time() {
        use Event::*;
        let histories: Vec<Vec<Event>> = vec![
            vec![Wanted(Dp)],
            vec![Wanted(Dp), held(Dp, &["pod p"]), Wanted(Dra)],
            vec![Restored(Dra), Wanted(Dp)],
            vec![Restored(Dra), Wanted(Dp), SlicesCleared],
            vec![Restored(Dra), held(Dra, &["c"]), Wanted(Dp)],
        ];
        let events = [
            Wanted(Dp),
            Wanted(Dra),
            held(Dp, &["pod p"]),
            held(Dra, &["c"]),
            held(Dra, &[]),
            SlicesCleared,
            SlicesNamed,
        ];
        for history in &histories {
            let (gpu, _) = run(BOTH, history);
            for e in &events {
                let (once, _) = transition(&gpu, BOTH, e.clone());
                let (twice, actions) = transition(&once, BOTH, e.clone());
                assert_eq!(twice, once, "{history:?} then {e:?} twice");
                assert!(
                    actions.iter().all(|a| matches!(a, Action::Warn(_))),
                    "{history:?} then {e:?} twice: {actions:?}"
                );
            }
        }
    }

    /// What survives a restart: the DRA driver's GPUs (the split record names them with
    /// the withdrawing ones) and the holders in the checkpoints.
    fn restarted(
        before: &Machine,
        holders: &BTreeMap<String, (Vec<String>, Vec<String>)>,
    ) -> Machine {
        let mut m = Machine::new(before.paths());
        for (uuid, g) in &before.gpus {
            if g.state.at() == Some(Dra) {
                m.step(uuid, Event::Restored(Dra));
            }
            let (dp, dra) = holders.get(uuid).cloned().unwrap_or_default();
            if let Some(wants) = g.wants {
                m.step(
                    uuid,
                    Event::Observed {
                        wants,
                        device_plugin: dp,
                        dra,
                        listed: None,
                    },
                );
            }
        }
        m
    }

    #[test]
    fn a_restart_converges_to_the_same_state() {
        use Event::*;
        let mut m = Machine::new(BOTH);
        let holders: BTreeMap<String, (Vec<String>, Vec<String>)> = [
            ("b".to_string(), (vec![], claims(&["c"]))),
            ("d".to_string(), (claims(&["pod p"]), vec![])),
        ]
        .into_iter()
        .collect();
        // a: the device plugin's; b: blocked on the driver by a claim; c: withdrawing;
        // d: blocked on the device plugin by a pod; e: the driver's.
        m.step("a", Wanted(Dp));
        m.step("b", Restored(Dra));
        m.step("b", held(Dra, &["c"]));
        m.step("b", Wanted(Dp));
        m.step("c", Restored(Dra));
        m.step("c", Wanted(Dp));
        m.step("d", Wanted(Dp));
        m.step("d", held(Dp, &["pod p"]));
        m.step("d", Wanted(Dra));
        m.step("e", Wanted(Dra));
        let again = restarted(&m, &holders);
        assert_eq!(again, m);
        assert_eq!(again.withdrawing(), ["c".to_string()].into());
        assert_eq!(again.blocked().count(), 2);
        // Phase 2 that had begun starts over: the slices are looked at again.
        m.step("c", SlicesCleared);
        assert_eq!(m.awaiting_claims().len(), 1);
        let again = restarted(&m, &holders);
        assert_eq!(
            again.state("c"),
            State::Withdrawing {
                slices_clear: false
            }
        );
        assert!(again.decided());
    }

    #[test]
    fn the_machine_reports_the_split() {
        use Event::*;
        let mut m = Machine::new(BOTH);
        assert!(!m.decided());
        m.step("a", Wanted(Dp));
        m.step("b", Restored(Dra));
        m.step("b", Wanted(Dp));
        m.step("c", Wanted(Dra));
        let owners = m.owners();
        assert_eq!(
            owners.values().copied().collect::<Vec<_>>(),
            vec![Dp, Dp, Dra]
        );
        m.retain(&["a".to_string()].into());
        assert_eq!(m.owners().len(), 1);
        assert_eq!(m.state("z"), State::Unowned);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn path() -> impl Strategy<Value = Owner> {
            prop_oneof![Just(Dp), Just(Dra)]
        }

        fn holders() -> impl Strategy<Value = Vec<String>> {
            prop::collection::vec(
                prop_oneof![Just("x".to_string()), Just("y".to_string())],
                0..2,
            )
        }

        fn event() -> impl Strategy<Value = Event> {
            prop_oneof![
                path().prop_map(Event::Restored),
                path().prop_map(Event::Wanted),
                (path(), holders()).prop_map(|(on, by)| Event::Held { on, by }),
                Just(Event::SlicesCleared),
                Just(Event::SlicesNamed),
                holders().prop_map(Event::ClaimsListed),
                (path(), holders(), holders(), prop::option::of(holders())).prop_map(
                    |(wants, device_plugin, dra, listed)| Event::Observed {
                        wants,
                        device_plugin,
                        dra,
                        listed,
                    }
                ),
            ]
        }

        fn paths() -> impl Strategy<Value = Paths> {
            prop_oneof![
                Just(BOTH),
                Just(Paths {
                    device_plugin: true,
                    dra: false
                }),
                Just(Paths {
                    device_plugin: false,
                    dra: true
                }),
            ]
        }

        proptest! {
            #[test]
            fn one_path_at_a_time_and_no_handover_while_held(
                paths in paths(),
                events in prop::collection::vec(event(), 0..40),
            ) {
                let mut gpu = Gpu::default();
                // What each path advertises, as the actions leave it.
                let (mut dp, mut dra) = (false, false);
                for e in events {
                    let (next, actions) = transition(&gpu, paths, e.clone());
                    let was = gpu.state.advertised_by();
                    for a in &actions {
                        match a {
                            Action::WithdrawFromDevicePlugin => { prop_assert!(dp); dp = false }
                            Action::AdvertiseOnDevicePlugin => { prop_assert!(!dra); dp = true }
                            Action::UnpublishFromDra => { prop_assert!(dra); dra = false }
                            Action::PublishToDra => { prop_assert!(!dp); dra = true }
                            _ => {}
                        }
                        prop_assert!(!(dp && dra), "both paths advertise it after {e:?}");
                    }
                    let is = next.state.advertised_by();
                    prop_assert_eq!((dp, dra), (is == Some(Dp), is == Some(Dra)), "{:?}", e);
                    // A handover never leaves a path that holds the GPU.
                    if let (Some(from), Some(to)) = (was, is) {
                        if from != to {
                            prop_assert!(next.held(from).is_empty() || !paths.runs(from),
                                "{:?} handed from {} while held: {:?}", e, from, next);
                        }
                    }
                    // The device plugin gets a GPU of the driver only after phase 2.
                    if matches!(gpu.state, State::Owned(Dra) | State::Blocked { at: Dra, .. }) {
                        prop_assert_ne!(is, Some(Dp), "{:?} skipped phase 2", e);
                    }
                    if is == Some(Dp) && gpu.state.at() == Some(Dra) {
                        prop_assert_eq!(&gpu.state, &State::Withdrawing { slices_clear: true });
                    }
                    // A blocked GPU names what holds it, on the path it stays on.
                    if let State::Blocked { at, wants, by } = &next.state {
                        prop_assert_ne!(at, wants);
                        prop_assert!(!by.is_empty());
                    }
                    gpu = next;
                }
            }
        }
    }
}
