//! Leader election with a `coordination.k8s.io/v1` Lease: a pure decision over the
//! Lease's holder and renew time, and a small adapter that reads and writes the Lease
//! with optimistic concurrency (a stale resourceVersion loses the race).
//!
//! ```text
//! no Lease ─create─► leader ─renew every tick─► leader
//!                      │ renew refused (409 / another holder) ─► follower (steps down now)
//!                      │ renew failing until our term ends   ─► follower
//! follower: holder's renewTime + leaseDurationSeconds passed ─take over─► leader
//! follower: holderIdentity cleared (leader shut down cleanly) ─take over─► leader
//! ```

use super::error::{Error, Result};
pub use super::time::Millis;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// The parts of a Lease the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseState {
    pub holder: Option<String>,
    pub renewed: Option<Millis>,
    pub duration: Millis,
}

/// What an instance should do with the Lease at `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No Lease yet: create it holding it.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it, or the holder's term ran out: take it over.
    TakeOver,
    /// Another instance holds it until `until`.
    Follow { holder: String, until: Millis },
}

/// The leader-election decision (pure: the clock is an argument).
pub fn decide(lease: Option<&LeaseState>, me: &str, now: Millis) -> Step {
    let Some(lease) = lease else {
        return Step::Create;
    };
    match lease.holder.as_deref() {
        Some(h) if h == me => Step::Renew,
        None | Some("") => Step::TakeOver,
        Some(h) => {
            let until = lease.renewed.unwrap_or(0).saturating_add(lease.duration);
            if now >= until {
                Step::TakeOver
            } else {
                Step::Follow {
                    holder: h.to_string(),
                    until,
                }
            }
        }
    }
}

/// One instance's side of the election.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Millis,
    /// End of our current term (last successful write + duration), if we lead.
    leading_until: Option<Millis>,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Millis,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration: duration.max(1000),
            leading_until: None,
        }
    }

    /// Whether this instance may act at `now` (without talking to the API server).
    pub fn is_leader(&self, now: Millis) -> bool {
        self.leading_until.is_some_and(|t| now < t)
    }

    /// Reads the Lease, acquires, renews or takes it over as [`decide`] says, and returns
    /// whether this instance leads at `now`. A lost race or another holder steps down
    /// at once; an API error keeps the current term (it may still run out).
    pub async fn tick(&mut self, now: Millis) -> bool {
        match self.try_tick(now).await {
            Ok(true) => {
                if !self.is_leader(now) {
                    tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                }
                self.leading_until = Some(now.saturating_add(self.duration));
            }
            Ok(false) => {
                if self.leading_until.take().is_some() {
                    tracing::warn!(identity = %self.identity, "lost the lease: stepping down");
                }
            }
            Err(e) => tracing::warn!(error = %e, "lease"),
        }
        self.is_leader(now)
    }

    /// Gives the Lease up on a clean shutdown, as client-go's `ReleaseOnCancel`: clears
    /// `holderIdentity` (and sets a 1 s duration) if we still hold it, so a standby takes
    /// over at its next tick instead of waiting out our term. Someone else's Lease, or a
    /// lost race, is left alone.
    pub async fn release(&mut self, now: Millis) -> Result<()> {
        if self.leading_until.take().is_none() {
            return Ok(());
        }
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::api(format!("get lease {}", self.name)))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro(now));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(Error::api(format!("release lease {}", self.name)))
        {
            Ok(_) => {
                tracing::info!(identity = %self.identity, lease = %self.name, "released the lease");
                Ok(())
            }
            Err(e) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn try_tick(&mut self, now: Millis) -> Result<bool> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::api(format!("get lease {}", self.name)))?;
        let state = current.as_ref().map(|l| state_of(l, self.duration));
        let step = decide(state.as_ref(), &self.identity, now);
        let secs = (self.duration / 1000).max(1) as i32;
        let stamp = micro(now);
        let result = match (step, current) {
            (Step::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(stamp.clone()),
                        renew_time: Some(stamp),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (Step::Follow { .. }, _) => return Ok(false),
            (step, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                if step == Step::TakeOver {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(stamp.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.renew_time = Some(stamp);
                spec.lease_duration_seconds = Some(secs);
                // Carries the resourceVersion we read: a concurrent writer wins, we lose.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            (_, None) => return Ok(false),
        };
        match result.map_err(Error::api(format!("write lease {}", self.name))) {
            Ok(()) => Ok(true),
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn state_of(lease: &Lease, default_duration: Millis) -> LeaseState {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseState {
        holder: spec.holder_identity,
        renewed: spec
            .renew_time
            .map(|t| t.0.as_millisecond().max(0) as Millis),
        duration: spec
            .lease_duration_seconds
            .map(|s| (s.max(0) as Millis) * 1000)
            .unwrap_or(default_duration),
    }
}

fn micro(ms: Millis) -> MicroTime {
    MicroTime(Timestamp::from_millisecond(ms as i64).unwrap_or(Timestamp::UNIX_EPOCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, renewed: Millis) -> LeaseState {
        LeaseState {
            holder: Some(holder.into()),
            renewed: Some(renewed),
            duration: 15_000,
        }
    }

    #[test]
    fn decisions_over_a_fake_clock() {
        let cases = [
            ("no lease", None, 0, Step::Create),
            ("ours", Some(held("a", 1_000)), 2_000, Step::Renew),
            (
                "ours even if expired",
                Some(held("a", 0)),
                99_000,
                Step::Renew,
            ),
            (
                "other, fresh",
                Some(held("b", 10_000)),
                20_000,
                Step::Follow {
                    holder: "b".into(),
                    until: 25_000,
                },
            ),
            (
                "other, expired",
                Some(held("b", 10_000)),
                25_000,
                Step::TakeOver,
            ),
            (
                "released",
                Some(LeaseState {
                    holder: None,
                    renewed: None,
                    duration: 15_000,
                }),
                0,
                Step::TakeOver,
            ),
        ];
        for (name, lease, now, want) in cases {
            assert_eq!(decide(lease.as_ref(), "a", now), want, "{name}");
        }
    }

    #[test]
    fn a_follower_takes_over_exactly_when_the_term_ends() {
        let lease = held("b", 100_000);
        let mut now = 100_000;
        while matches!(decide(Some(&lease), "a", now), Step::Follow { .. }) {
            now += 1_000;
        }
        assert_eq!(now, 115_000);
    }
}
