//! The split of GPUs between the device plugin and the DRA driver that the agent put in
//! force, recorded on disk so that the next start knows it instead of inferring it.
//!
//! One file beside the DRA checkpoint, `<state-dir>/dra/split.json`, rewritten whenever
//! the split the agent builds for changes (a GPU moved, a move off the driver started,
//! confirmed or rolled back), before anything is advertised for the new split: written
//! atomically with [`crate::fsio::Replace`] (a new uniquely named temporary file that a
//! planted symlink cannot redirect, write, fsync, rename, directory fsync), so a reader
//! sees the old record or the new one, never a mix.
//!
//! Format (JSON), with the checkpoint's rules: `{"version": 1, "checksum": "<crc32 of
//! data>", "data": {"dra": [uuid…], "withdrawing": [uuid…], "devicePlugin": [uuid…],
//! "config": "…"}}`. `version` is `100 × major + minor`; readers accept any version of
//! the major they know and ignore fields they do not know (a minor bump only adds fields),
//! so older and newer releases read each other's record. `dra` holds every GPU the
//! driver may advertise (its own and the ones leaving it, `withdrawing`), `devicePlugin`
//! the others. A record that cannot be read (bad JSON, checksum mismatch, another major)
//! is [`ReadError::Corrupt`]: the agent then infers the split as it did before the record
//! existed ([`super::withdraw::inherited`]) and says so in its log.
//!
//! The pure part ([`encode`], [`decode`], [`Recorded::previous_dra`]) is unit-tested here;
//! the agent does the I/O through [`read`] and [`write`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dra::envelope;

/// The record's file name in the DRA checkpoint directory.
pub const FILE: &str = "split.json";

/// The format written by this release (major 0, minor 1).
pub const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("no split record at {path}")]
    Missing { path: String },
    #[error("the split record {path} is unreadable ({reason})")]
    Corrupt { path: String, reason: String },
}

#[derive(Debug, thiserror::Error)]
#[error("cannot write the split record {path}: {source}")]
pub struct WriteError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// The split in force, by GPU UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    /// GPUs the DRA driver may advertise: its own and the ones leaving it.
    pub dra: BTreeSet<String>,
    /// Of `dra`, the GPUs whose move to the device plugin is not confirmed yet.
    #[serde(default)]
    pub withdrawing: BTreeSet<String>,
    /// Every other GPU of the node (the device plugin's).
    #[serde(default)]
    pub device_plugin: BTreeSet<String>,
    /// The config in force when it was written (for people reading the file).
    #[serde(default)]
    pub config: String,
}

impl Recorded {
    /// The GPUs the DRA driver may have advertised before this start, or `None` when the
    /// record does not cover every GPU of `gpus` (a GPU added or replaced since: the
    /// record cannot say where it was).
    pub fn previous_dra<'a>(
        &self,
        gpus: impl IntoIterator<Item = &'a String>,
    ) -> Option<BTreeSet<String>> {
        for uuid in gpus {
            if !self.dra.contains(uuid) && !self.device_plugin.contains(uuid) {
                return None;
            }
        }
        Some(self.dra.clone())
    }
}

/// The record's file content. Pure.
pub fn encode(record: &Recorded) -> Result<Vec<u8>, serde_json::Error> {
    envelope::seal(VERSION, &serde_json::to_value(record)?)
}

/// Decode a record; `path` only names it in errors. Pure.
pub fn decode(path: &str, bytes: &[u8]) -> Result<Recorded, ReadError> {
    let corrupt = |reason: String| ReadError::Corrupt {
        path: path.to_string(),
        reason,
    };
    let data = envelope::open(VERSION, "split record", bytes).map_err(corrupt)?;
    serde_json::from_value(data).map_err(|e| corrupt(format!("bad content: {e}")))
}

/// The record's path in the DRA checkpoint directory `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Read the record at `path`.
pub fn read(path: &Path) -> Result<Recorded, ReadError> {
    let name = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => decode(&name, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ReadError::Missing { path: name })
        }
        Err(e) => Err(ReadError::Corrupt {
            path: name,
            reason: e.to_string(),
        }),
    }
}

/// Write `record` at `path` atomically and durably ([`crate::fsio::Replace::durable`]:
/// unique temporary file, write, fsync, rename, directory fsync), readable by root only.
pub fn write(path: &Path, record: &Recorded) -> Result<(), WriteError> {
    let err = |source: std::io::Error| WriteError {
        path: path.display().to_string(),
        source,
    };
    let body = encode(record).map_err(|e| err(std::io::Error::other(e)))?;
    crate::fsio::Replace::durable(0o600)
        .write(path, &body)
        .map(drop)
        .map_err(err)
}

/// Remove the record (a split that could not be recorded must not be read as the old
/// one). Missing is fine.
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn record() -> Recorded {
        Recorded {
            dra: set(&["GPU-b", "GPU-c"]),
            withdrawing: set(&["GPU-c"]),
            device_plugin: set(&["GPU-a"]),
            config: "split".into(),
        }
    }

    #[test]
    fn round_trip_and_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert!(matches!(read(&path), Err(ReadError::Missing { .. })));
        write(&path, &record()).unwrap();
        assert_eq!(read(&path).unwrap(), record());
        assert!(!path.with_extension("json.tmp").exists());
        let mut other = record();
        other.withdrawing.clear();
        write(&path, &other).unwrap();
        assert_eq!(read(&path).unwrap(), other);
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert!(matches!(read(&path), Err(ReadError::Missing { .. })));
    }

    #[test]
    fn a_symlink_at_the_old_temp_name_or_the_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = path_in(&dir.path().join("dra"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&victim, path.with_extension("json.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write(&path, &record()).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(read(&path).unwrap(), record());
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
    }

    #[test]
    fn older_and_newer_minors_are_read_other_majors_and_damage_are_corrupt() {
        let good = String::from_utf8(encode(&record()).unwrap()).unwrap();
        // A newer minor with a field this release does not know, checksummed as that
        // release would.
        let data = serde_json::json!({"dra": ["GPU-b"], "devicePlugin": ["GPU-a"],
                                      "futureField": {"x": 1}});
        let sum = envelope::checksum(&data).unwrap();
        let newer = format!(r#"{{"version":7,"checksum":"{sum}","data":{data}}}"#);
        // An older reader's view: only `dra` (the fields it knows), no `config`.
        let data = serde_json::json!({"dra": ["GPU-b"]});
        let sum = envelope::checksum(&data).unwrap();
        let minimal = format!(r#"{{"version":1,"checksum":"{sum}","data":{data}}}"#);
        let cases: Vec<(&str, String, Option<BTreeSet<String>>)> = vec![
            ("this release", good.clone(), Some(set(&["GPU-b", "GPU-c"]))),
            ("newer minor", newer, Some(set(&["GPU-b"]))),
            ("only dra", minimal, Some(set(&["GPU-b"]))),
            (
                "another major",
                good.replace("\"version\":1,", "\"version\":100,"),
                None,
            ),
            (
                "version 0",
                good.replace("\"version\":1,", "\"version\":0,"),
                None,
            ),
            ("flipped content", good.replace("GPU-b", "GPU-x"), None),
            ("cut short", good[..good.len() / 2].to_string(), None),
            ("empty", String::new(), None),
            ("not json", "garbage\n".into(), None),
        ];
        for (what, text, want) in cases {
            let got = decode("split.json", text.as_bytes());
            match (want, got) {
                (Some(dra), Ok(r)) => assert_eq!(r.dra, dra, "{what}"),
                (None, Err(ReadError::Corrupt { reason, .. })) => {
                    assert!(!reason.is_empty(), "{what}")
                }
                (want, got) => panic!("{what}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn previous_dra_only_when_every_gpu_is_covered() {
        let r = record();
        let gpus = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
        assert_eq!(
            r.previous_dra(&gpus(&["GPU-a", "GPU-b", "GPU-c"])),
            Some(set(&["GPU-b", "GPU-c"]))
        );
        assert_eq!(r.previous_dra(&gpus(&["GPU-a"])), Some(r.dra.clone()));
        // A GPU the record does not know (added or replaced while the agent was down).
        assert_eq!(r.previous_dra(&gpus(&["GPU-a", "GPU-new"])), None);
    }
}
