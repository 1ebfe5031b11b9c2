//! The places the controller has asked `Workload` records to show in writes not yet
//! answered ([`super::deferred_records`]). A pass compares a waiting workload's place with
//! what its record will show once those writes land, not with the older place the cache
//! still holds: else a place that moves and moves back before the first write lands
//! would be left at the middle value.
//!
//! Every ask gets a ticket; an answer clears the ask only when no later ask replaced it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// Names one ask: the write that answers it clears it ([`AskedPlaces::answered`]).
pub type Ticket = u64;

/// Places asked of records, by workload key.
#[derive(Debug, Default)]
pub struct AskedPlaces {
    inner: Mutex<Asks>,
}

#[derive(Debug, Default)]
struct Asks {
    next: Ticket,
    by_key: HashMap<String, (Ticket, Option<String>)>,
}

impl AskedPlaces {
    fn lock(&self) -> MutexGuard<'_, Asks> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Workload `key`'s record is asked to show `place` (`None`: no place); replaces an
    /// earlier ask for it.
    pub fn ask(&self, key: &str, place: Option<String>) -> Ticket {
        let mut asks = self.lock();
        asks.next += 1;
        let ticket = asks.next;
        asks.by_key.insert(key.to_string(), (ticket, place));
        ticket
    }

    /// The place asked for `key` while its write is outstanding (`Some(None)`: asked to
    /// show none); `None` when nothing is asked.
    pub fn asked(&self, key: &str) -> Option<Option<String>> {
        self.lock().by_key.get(key).map(|(_, p)| p.clone())
    }

    /// The write of ask `ticket` landed (its answer is in the cache): forgets the ask,
    /// unless a later one replaced it.
    pub fn answered(&self, key: &str, ticket: Ticket) {
        let mut asks = self.lock();
        if asks.by_key.get(key).is_some_and(|(t, _)| *t == ticket) {
            asks.by_key.remove(key);
        }
    }

    /// Forgets any ask for `key`: a write made at once supersedes it.
    pub fn forget(&self, key: &str) {
        self.lock().by_key.remove(key);
    }

    /// `places` (the places the cached records show, by key) as they will be once the
    /// asked writes land.
    pub fn overlay(&self, places: &mut BTreeMap<String, String>) {
        for (key, (_, place)) in &self.lock().by_key {
            match place {
                Some(p) => places.insert(key.clone(), p.clone()),
                None => places.remove(key),
            };
        }
    }

    /// How many asks are outstanding.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_clears_its_own_ask_only() {
        let asked = AskedPlaces::default();
        let first = asked.ask("ns/a", Some("2".into()));
        let second = asked.ask("ns/a", Some("3".into()));
        asked.answered("ns/a", first);
        assert_eq!(
            asked.asked("ns/a"),
            Some(Some("3".into())),
            "a later ask stays"
        );
        asked.answered("ns/a", second);
        assert_eq!(asked.asked("ns/a"), None);
    }

    #[test]
    fn the_overlay_shows_the_asked_places_over_the_cached_ones() {
        let asked = AskedPlaces::default();
        asked.ask("ns/a", Some("1".into()));
        asked.ask("ns/b", None);
        let mut places: BTreeMap<String, String> = [("ns/b", "4"), ("ns/c", "5")]
            .into_iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect();
        asked.overlay(&mut places);
        let got: Vec<(&str, &str)> = places
            .iter()
            .map(|(k, p)| (k.as_str(), p.as_str()))
            .collect();
        assert_eq!(got, [("ns/a", "1"), ("ns/c", "5")]);
        asked.forget("ns/a");
        assert_eq!(asked.asked("ns/a"), None);
        assert_eq!(asked.len(), 1);
    }
}
