//! The requeue state book: one `data` entry per workload in a `tessera-requeue-state`
//! ConfigMap per namespace, read and merged without a request (pure). The writes that
//! keep it are [`super::requeue_state`]'s.

use super::readiness::{latest, Requeue};
use super::time::{millis, rfc3339, Millis};
use crate::quota::WaitForPodsReady;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Name of the ConfigMap in each namespace.
pub const CONFIGMAP_NAME: &str = "tessera-requeue-state";

/// Label on it (its value is the entry format) that the controller LISTs and watches by.
pub const LABEL: &str = "tessera.io/requeue-state";

/// Entry format written.
pub const FORMAT: &str = "v1";

/// Most entries kept in one ConfigMap (about 100 bytes each: far below the 1 MiB limit).
pub const MAX_ENTRIES: usize = 4096;

/// Shortest time an entry is kept after its eviction once no pod of its workload exists.
pub const MIN_TTL: Millis = 3_600_000;

/// Longest ConfigMap data key the API server accepts.
const MAX_KEY: usize = 253;

/// How long an entry outlives the last pod of its workload: twice the longest backoff,
/// at least [`MIN_TTL`], so pods recreated within it still wait out their backoff.
pub fn ttl(cfg: &WaitForPodsReady) -> Millis {
    cfg.backoff_max.saturating_mul(2).max(MIN_TTL)
}

/// One workload's requeue state, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Workload key (`team/group-g`, `team/pod-p`).
    pub workload: String,
    pub requeue: Requeue,
}

/// An entry's value: JSON in a `data` string.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    workload: String,
    count: u32,
    evicted_at: String,
}

fn encode(e: &Entry) -> String {
    let w = Wire {
        workload: e.workload.clone(),
        count: e.requeue.count,
        evicted_at: rfc3339(e.requeue.evicted_at),
    };
    serde_json::to_string(&w).unwrap_or_default()
}

/// FNV-1a, 64 bits: a stable suffix for keys that must be shortened.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The namespace and data key of workload `key`'s entry (`team/group-g` → `team`,
/// `group-g`); a name too long or with characters a ConfigMap key cannot hold is cut and
/// suffixed with its hash. `None` for a key without a namespace.
pub fn entry_name(key: &str) -> Option<(String, String)> {
    let (ns, rest) = key.split_once('/')?;
    if ns.is_empty() || rest.is_empty() {
        return None;
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if rest.len() <= MAX_KEY && rest.chars().all(valid) && !rest.starts_with('.') {
        return Some((ns.to_string(), rest.to_string()));
    }
    let clean: String = rest
        .chars()
        .map(|c| if valid(c) { c } else { '_' })
        .take(200)
        .collect();
    let clean = clean.trim_start_matches('.');
    Some((ns.to_string(), format!("{clean}-{:016x}", fnv1a(rest))))
}

/// One entry as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub namespace: String,
    /// Data key.
    pub name: String,
    /// The value as read (what a forget compares against).
    pub raw: String,
    /// `None`: the entry is corrupt (reported, ignored).
    pub requeue: Option<Requeue>,
}

/// The entries of every state ConfigMap, by workload key.
#[derive(Clone, Debug, Default)]
pub struct Book {
    pub entries: BTreeMap<String, Stored>,
    /// Corrupt entries, one clear line each (the pass logs them).
    pub problems: Vec<String>,
}

impl Book {
    /// The requeue state recorded for workload `key` (a corrupt entry counts as none).
    pub fn requeue(&self, key: &str) -> Option<Requeue> {
        self.entries.get(key).and_then(|s| s.requeue)
    }
}

fn parse(ns: &str, name: &str, raw: &str) -> std::result::Result<Entry, String> {
    let w: Wire = serde_json::from_str(raw).map_err(|e| format!("not a state entry: {e}"))?;
    let evicted_at = millis(&w.evicted_at).ok_or_else(|| {
        format!(
            "field evictedAt: {:?} is not an RFC 3339 time",
            w.evicted_at
        )
    })?;
    if entry_name(&w.workload) != Some((ns.to_string(), name.to_string())) {
        return Err(format!(
            "field workload: {:?} does not belong under this key in namespace {ns}",
            w.workload
        ));
    }
    Ok(Entry {
        workload: w.workload,
        requeue: Requeue {
            count: w.count,
            evicted_at,
        },
    })
}

/// Reads the state ConfigMaps (objects of another name are skipped). A corrupt entry is
/// kept as such under the key its name implies, with a problem naming it.
pub fn read(configmaps: &[Value]) -> Book {
    let mut book = Book::default();
    for cm in configmaps {
        let meta = &cm["metadata"];
        let (Some(ns), Some(CONFIGMAP_NAME)) = (meta["namespace"].as_str(), meta["name"].as_str())
        else {
            continue;
        };
        let Some(data) = cm["data"].as_object() else {
            continue;
        };
        for (name, value) in data {
            let raw = value.as_str().unwrap_or("").to_string();
            let (key, requeue) = match parse(ns, name, &raw) {
                Ok(e) => (e.workload, Some(e.requeue)),
                Err(why) => {
                    book.problems.push(format!(
                        "requeue state ConfigMap {ns}/{CONFIGMAP_NAME}, entry {name:?}: {why}; ignored"
                    ));
                    (format!("{ns}/{name}"), None)
                }
            };
            book.entries.insert(
                key,
                Stored {
                    namespace: ns.to_string(),
                    name: name.clone(),
                    raw,
                    requeue,
                },
            );
        }
    }
    book
}

/// What one write does to a ConfigMap's `data`: entries moved forward (never back), and
/// entries removed if they still hold the value read. Returns the entries dropped to
/// stay within [`MAX_ENTRIES`] (corrupt ones first, then the oldest evictions; never
/// one being set).
pub fn merge(
    data: &mut BTreeMap<String, String>,
    set: &[Entry],
    forget: &BTreeMap<String, String>,
) -> Vec<String> {
    for (name, raw) in forget {
        if data.get(name) == Some(raw) {
            data.remove(name);
        }
    }
    let mut setting = Vec::new();
    for e in set {
        let Some((ns, name)) = entry_name(&e.workload) else {
            continue;
        };
        let current = data
            .get(&name)
            .and_then(|raw| parse(&ns, &name, raw).ok())
            .map(|c| c.requeue);
        if latest(current, Some(e.requeue)) != current {
            data.insert(name.clone(), encode(e));
        }
        setting.push(name);
    }
    let mut dropped = Vec::new();
    while data.len() > MAX_ENTRIES {
        // (has a valid time, eviction time, name): corrupt entries sort first.
        let victim = data
            .iter()
            .filter(|(n, _)| !setting.contains(n))
            .map(|(n, raw)| {
                let at = serde_json::from_str::<Wire>(raw)
                    .ok()
                    .and_then(|w| millis(&w.evicted_at));
                (at.is_some(), at.unwrap_or(0), n.clone())
            })
            .min();
        let Some((_, _, name)) = victim else { break };
        data.remove(&name);
        dropped.push(name);
    }
    dropped
}

/// Whether workload `key`'s state is kept here (a pod group or a single pod; a Job or a
/// serving replica keeps it on its own object).
pub fn kept_here(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(_, rest)| rest.starts_with("group-") || rest.starts_with("pod-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: Millis = 1_795_003_260_000;

    fn entry(workload: &str, count: u32, evicted_at: Millis) -> Entry {
        Entry {
            workload: workload.into(),
            requeue: Requeue { count, evicted_at },
        }
    }

    #[test]
    fn entry_names_are_valid_configmap_keys() {
        let long = format!("team/pod-{}", "a".repeat(260));
        // (workload key, data key)
        let cases = [
            ("team/group-g", Some("group-g".to_string())),
            ("team/pod-p.1", Some("pod-p.1".to_string())),
            ("nope", None),
            ("/group-g", None),
        ];
        for (key, want) in cases {
            assert_eq!(entry_name(key).map(|(_, n)| n), want, "{key}");
        }
        let (ns, name) = entry_name(&long).unwrap();
        assert_eq!(ns, "team");
        assert!(
            name.len() <= MAX_KEY && name.starts_with("pod-aaa"),
            "{name}"
        );
        assert_ne!(
            entry_name(&format!("{long}b")).unwrap().1,
            name,
            "hash differs"
        );
        let odd = entry_name("team/group-a b/c").unwrap().1;
        assert!(odd.starts_with("group-a_b_c-"), "{odd}");
    }

    #[test]
    fn reads_entries_and_reports_corrupt_ones() {
        let good = encode(&entry("team/group-g", 2, T0));
        let cm = json!({"metadata": {"namespace": "team", "name": CONFIGMAP_NAME},
        "data": {
            "group-g": good,
            "group-bad": "not json",
            "pod-p": r#"{"workload":"team/pod-p","count":"two","evictedAt":"2026-11-18T12:00:00Z"}"#,
            "pod-q": r#"{"workload":"team/pod-q","count":1,"evictedAt":"yesterday"}"#,
            "pod-r": r#"{"workload":"other/pod-r","count":1,"evictedAt":"2026-11-18T12:00:00Z"}"#,
        }});
        let other = json!({"metadata": {"namespace": "team", "name": "unrelated"},
                           "data": {"group-x": good}});
        let book = read(&[cm, other]);
        assert_eq!(
            book.requeue("team/group-g"),
            Some(Requeue {
                count: 2,
                evicted_at: T0
            })
        );
        // (entry, words its problem must name)
        let bad = [
            ("group-bad", "not a state entry"),
            ("pod-p", "not a state entry"),
            ("pod-q", "field evictedAt"),
            ("pod-r", "field workload"),
        ];
        assert_eq!(book.problems.len(), bad.len(), "{:?}", book.problems);
        for (name, words) in bad {
            assert!(
                book.problems
                    .iter()
                    .any(|p| p.contains(&format!("entry {name:?}")) && p.contains(words)),
                "{name}: {:?}",
                book.problems
            );
            let stored = &book.entries[&format!("team/{name}")];
            assert_eq!(stored.requeue, None, "{name} is ignored");
        }
        assert_eq!(book.entries.len(), 5, "other ConfigMaps are not read");
    }

    #[test]
    fn merge_only_moves_forward_and_forgets_unchanged_entries() {
        let a = |count, at| entry("team/group-a", count, at);
        let mut data = BTreeMap::new();
        // (set, expected count after): never back, equal counts take the later time.
        let steps = [
            (a(1, T0), (1, T0)),
            (a(2, T0 + 5), (2, T0 + 5)),
            (a(1, T0 + 9), (2, T0 + 5)),
            (a(2, T0 + 7), (2, T0 + 7)),
        ];
        for (set, (count, at)) in steps {
            merge(&mut data, &[set], &BTreeMap::new());
            let r = parse("team", "group-a", &data["group-a"]).unwrap().requeue;
            assert_eq!((r.count, r.evicted_at), (count, at));
        }
        let seen = data["group-a"].clone();
        merge(&mut data, &[a(3, T0 + 8)], &BTreeMap::new());
        let stale: BTreeMap<String, String> = [("group-a".to_string(), seen)].into();
        merge(&mut data, &[], &stale);
        assert!(
            data.contains_key("group-a"),
            "changed since it was read: kept"
        );
        let current: BTreeMap<String, String> =
            [("group-a".to_string(), data["group-a"].clone())].into();
        merge(&mut data, &[], &current);
        assert!(data.is_empty());
    }

    #[test]
    fn merge_stays_bounded_dropping_corrupt_then_oldest() {
        let mut data: BTreeMap<String, String> = (0..MAX_ENTRIES as u64)
            .map(|i| {
                let e = entry(&format!("team/group-{i}"), 1, T0 + i);
                (format!("group-{i}"), encode(&e))
            })
            .collect();
        data.insert("group-junk".into(), "{".into());
        let dropped = merge(
            &mut data,
            &[entry("team/group-new", 1, T0)],
            &BTreeMap::new(),
        );
        assert_eq!(dropped, ["group-junk", "group-0"]);
        assert_eq!(data.len(), MAX_ENTRIES);
        assert!(data.contains_key("group-new"));
    }

    #[test]
    fn ttl_outlasts_the_longest_backoff() {
        let cfg = |max| WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: max,
            backoff_limit_count: None,
            requeue_by_eviction_time: true,
            block_admission: false,
        };
        assert_eq!(ttl(&cfg(100_000)), MIN_TTL);
        assert_eq!(ttl(&cfg(3_600_000)), 7_200_000);
    }
}
