//! What `tessera diagnose` reads: the cluster's Nodes and Pods as a LIST returns them,
//! with the time they were taken. `tessera diagnose dump` writes one; `--snapshot DIR`
//! reads it back, so a diagnosis can be made (and shared) away from the cluster.

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The format this build writes and reads.
pub const SNAPSHOT_FORMAT: &str = "tessera.io/diagnose-snapshot/v1";
/// The file in a snapshot directory.
pub const SNAPSHOT_FILE: &str = "snapshot.json";

/// Nodes and Pods at one time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub format: String,
    /// When the objects were listed (RFC 3339): the "now" of an offline diagnosis.
    pub taken_at: String,
    pub nodes: Vec<Value>,
    pub pods: Vec<Value>,
    /// The quota controller's `Workload` records (`tessera.io/v1alpha1`): where a
    /// waiting pod's place in its queue is written. Empty where the kind is not
    /// installed, and in snapshots written before it was read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<Value>,
}

/// A snapshot that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a diagnose snapshot: {0}")]
    Parse(String),
    #[error(
        "snapshot format {found:?} is not the one this tessera reads ({SNAPSHOT_FORMAT}); \
         write it again with this version's `tessera diagnose dump`"
    )]
    Format { found: String },
    #[error("snapshot takenAt {0:?} is not an RFC 3339 time")]
    TakenAt(String),
}

impl Snapshot {
    /// A snapshot of `nodes` and `pods` taken at `at`.
    pub fn new(nodes: Vec<Value>, pods: Vec<Value>, at: Timestamp) -> Snapshot {
        Snapshot {
            format: SNAPSHOT_FORMAT.into(),
            taken_at: at.to_string(),
            nodes,
            pods,
            workloads: Vec::new(),
        }
    }

    /// Read a snapshot, refusing another format version.
    pub fn from_json(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        // The format first, so another version gets that error rather than a field's.
        let probe: Value =
            serde_json::from_slice(bytes).map_err(|e| SnapshotError::Parse(e.to_string()))?;
        let format = probe["format"].as_str().unwrap_or("").to_string();
        if format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format { found: format });
        }
        let snapshot: Snapshot =
            serde_json::from_value(probe).map_err(|e| SnapshotError::Parse(e.to_string()))?;
        snapshot.taken_at()?;
        Ok(snapshot)
    }

    /// When it was taken.
    pub fn taken_at(&self) -> Result<Timestamp, SnapshotError> {
        self.taken_at
            .parse()
            .map_err(|_| SnapshotError::TakenAt(self.taken_at.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_version_or_garbage_is_refused_with_the_reason() {
        let s = Snapshot::new(vec![], vec![], "2026-12-03T12:00:00Z".parse().unwrap());
        let bytes = serde_json::to_vec(&s).unwrap();
        assert_eq!(Snapshot::from_json(&bytes).unwrap(), s);
        let mut other: Value = serde_json::from_slice(&bytes).unwrap();
        other["format"] = "tessera.io/diagnose-snapshot/v9".into();
        let e = Snapshot::from_json(other.to_string().as_bytes()).unwrap_err();
        assert!(e
            .to_string()
            .contains("\"tessera.io/diagnose-snapshot/v9\" is not the one"));
        assert!(matches!(
            Snapshot::from_json(b"{"),
            Err(SnapshotError::Parse(_))
        ));
        other["format"] = SNAPSHOT_FORMAT.into();
        other["takenAt"] = "yesterday".into();
        assert_eq!(
            Snapshot::from_json(other.to_string().as_bytes()),
            Err(SnapshotError::TakenAt("yesterday".into()))
        );
    }
}
