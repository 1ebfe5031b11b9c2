//! The DRA driver's checkpoint of prepared claims: what survives an agent restart.
//!
//! File format (JSON), readable by older and newer releases alike:
//! `{"version": 2, "checksum": "<crc32 of data>", "data": {"bootId": …, "claims": {…}}}`.
//! `version` is `100 × major + minor`. Readers accept any version with the major they know
//! and ignore unknown fields (minor bumps only add fields), so an upgrade or a rollback
//! never turns a good checkpoint into garbage. A checksum mismatch,
//! a newer major version, or undecodable JSON is reported as [`Error::Corrupt`]: the caller
//! rebuilds from the API server's claims instead of crash-looping on it.
//!
//! Each claim records two phases: `Started` is written *before* any side effect (MIG
//! instance creation, CDI spec), `Completed` after. On start, `Started` claims are rolled
//! back. A changed boot ID (the node rebooted: MIG instances and `/var/run/cdi` are gone)
//! keeps the claims but marks them for re-preparation, so the kubelet's next
//! NodePrepareResources re-creates them instead of failing.
//!
//! Writes are atomic (temporary file, fsync, rename, fsync of the directory); a file lock
//! serialises prepare/unprepare across processes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format written by this release (major 0, minor 2). Minor 2 added
/// `devices[].timeSlice`; minor-1 readers ignore it.
pub const VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("checkpoint {path} is corrupt ({reason}); it will be rebuilt from the API server")]
    Corrupt { path: String, reason: String },
    #[error("checkpoint {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Preparation phase of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Side effects may be half done.
    Started,
    Completed,
    /// Prepared before a reboot; must be prepared again.
    NeedsReprepare,
}

/// A MIG instance created for a claim (destroyed on unprepare or rollback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedMig {
    pub gpu_uuid: String,
    pub profile: String,
    pub start: u8,
}

/// A compute time-slice a claim set on a GPU (restored to the default when the last claim
/// using it is unprepared or rolled back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSliceRecord {
    pub gpu_uuid: String,
    pub interval: crate::gpu::TimeSlice,
}

/// One prepared device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub pool: String,
    pub device: String,
    #[serde(default)]
    pub request_names: Vec<String>,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    #[serde(default)]
    pub mig: Option<CreatedMig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slice: Option<TimeSliceRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub phase: Phase,
    #[serde(default)]
    pub devices: Vec<PreparedDevice>,
}

/// The checkpoint's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Data {
    pub boot_id: String,
    /// By claim UID.
    #[serde(default)]
    pub claims: BTreeMap<String, PreparedClaim>,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    version: u32,
    checksum: String,
    data: serde_json::Value,
}

fn checksum(data: &serde_json::Value) -> Result<String, serde_json::Error> {
    // serde_json's Value keeps object keys sorted: the encoding is canonical.
    Ok(format!(
        "{:08x}",
        crc32fast::hash(&serde_json::to_vec(data)?)
    ))
}

/// Encode `data` as a checkpoint file body.
pub fn encode(data: &Data) -> Result<Vec<u8>, serde_json::Error> {
    let value = serde_json::to_value(data)?;
    let env = Envelope {
        version: VERSION,
        checksum: checksum(&value)?,
        data: value,
    };
    serde_json::to_vec_pretty(&env)
}

/// Decode a checkpoint file body; `path` only names it in errors.
pub fn decode(path: &str, bytes: &[u8]) -> Result<Data> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_string(),
        reason,
    };
    let env: Envelope =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a checkpoint: {e}")))?;
    if env.version / 100 != VERSION / 100 || env.version == 0 {
        return Err(corrupt(format!(
            "format version {} is not readable by this release (reads {})",
            env.version, VERSION
        )));
    }
    let sum = checksum(&env.data).map_err(|e| corrupt(e.to_string()))?;
    if sum != env.checksum {
        return Err(corrupt(format!(
            "checksum {} does not match the content ({sum})",
            env.checksum
        )));
    }
    serde_json::from_value(env.data).map_err(|e| corrupt(format!("bad content: {e}")))
}

/// What loading found.
#[derive(Debug, PartialEq, Eq)]
pub struct Loaded {
    pub data: Data,
    /// Claims left half-prepared by a crash: roll their side effects back.
    pub rollback: Vec<(String, PreparedClaim)>,
    /// The node rebooted since the checkpoint was written.
    pub rebooted: bool,
}

/// Apply start-up rules to a decoded checkpoint: pull out `Started` claims for rollback,
/// and after a reboot mark every completed claim for re-preparation. Pure.
pub fn recover(mut data: Data, boot_id: &str) -> Loaded {
    let rebooted = !data.boot_id.is_empty() && data.boot_id != boot_id;
    let started: Vec<String> = data
        .claims
        .iter()
        .filter(|(_, c)| c.phase == Phase::Started)
        .map(|(uid, _)| uid.clone())
        .collect();
    let rollback = started
        .into_iter()
        .filter_map(|uid| data.claims.remove(&uid).map(|c| (uid, c)))
        .collect();
    if rebooted {
        for c in data.claims.values_mut() {
            c.phase = Phase::NeedsReprepare;
            // Instances and CDI specs did not survive the reboot.
            for d in &mut c.devices {
                d.mig = None;
                // The driver's compute policy is back to its default after a reboot.
                d.time_slice = None;
            }
        }
    }
    data.boot_id = boot_id.to_string();
    Loaded {
        data,
        rollback,
        rebooted,
    }
}

/// The checkpoint file and its lock, in the driver's state directory.
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
    lock_path: PathBuf,
}

/// Held while preparing or unpreparing; released on drop.
pub struct Lock(#[allow(dead_code)] nix::fcntl::Flock<File>);

impl Store {
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("checkpoint.json"),
            lock_path: dir.join("checkpoint.lock"),
        }
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Take the exclusive lock (blocks until free).
    pub fn lock(&self) -> Result<Lock> {
        if let Some(dir) = self.lock_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        }
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(|e| self.io(e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map(Lock)
            .map_err(|(_, errno)| self.io(std::io::Error::from(errno)))
    }

    /// Read the checkpoint; a missing file is an empty checkpoint.
    pub fn read(&self) -> Result<Data> {
        match std::fs::read(&self.path) {
            Ok(bytes) => decode(&self.path.display().to_string(), &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Data::default()),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Write atomically and durably.
    pub fn write(&self, data: &Data) -> Result<()> {
        self.write_opts(data, true)
    }

    /// Write atomically, without the directory fsync after the rename: a process crash
    /// keeps the rename (it is in the kernel); only a power loss can undo it, leaving the
    /// previous, whole checkpoint. For records whose loss on power failure is harmless
    /// (the `Started` record: after a power loss the MIG instances and time-slices are gone
    /// with the reboot, and instances left otherwise are destroyed at start as unowned).
    pub fn write_without_dir_sync(&self, data: &Data) -> Result<()> {
        self.write_opts(data, false)
    }

    fn write_opts(&self, data: &Data, sync_dir: bool) -> Result<()> {
        let body = encode(data).map_err(|e| self.io(std::io::Error::other(e)))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp).map_err(|e| self.io(e))?;
        f.write_all(&body).map_err(|e| self.io(e))?;
        f.sync_all().map_err(|e| self.io(e))?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io(e))?;
        if !sync_dir {
            return Ok(());
        }
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.io(e))
    }
}

/// This boot's ID (`/proc/sys/kernel/random/boot_id` on Linux; the path is configurable
/// for tests).
pub fn boot_id(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(phase: Phase) -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: "train-gpu".into(),
            phase,
            devices: vec![PreparedDevice {
                pool: "node-a".into(),
                device: "gpu-0-mig-3g-40gb-4".into(),
                request_names: vec!["gpu".into()],
                cdi_device_ids: vec!["tessera.io/gpu=claim-1-gpu-0".into()],
                mig: Some(CreatedMig {
                    gpu_uuid: "GPU-1".into(),
                    profile: "3g.40gb".into(),
                    start: 4,
                }),
                time_slice: None,
            }],
        }
    }

    fn data() -> Data {
        let mut d = Data {
            boot_id: "boot-1".into(),
            ..Default::default()
        };
        d.claims.insert("uid-done".into(), claim(Phase::Completed));
        d.claims.insert("uid-half".into(), claim(Phase::Started));
        d
    }

    #[test]
    fn round_trip_and_corruption_is_detected() {
        let bytes = encode(&data()).unwrap();
        assert_eq!(decode("c", &bytes).unwrap(), data());

        let text = String::from_utf8(bytes.clone()).unwrap();
        let tampered = text.replace("train-gpu", "train-gpx");
        let e = decode("c", tampered.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        let e = decode("c", &bytes[..bytes.len() / 2]).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        let e = decode(
            "c",
            text.replace("\"version\": 2", "\"version\": 200")
                .as_bytes(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not readable"), "{e}");
    }

    #[test]
    fn newer_minor_versions_and_unknown_fields_are_read() {
        // A later release (format 1.x) added fields; this release still reads the file.
        let mut value = serde_json::to_value(data()).unwrap();
        value["claims"]["uid-done"]["futureField"] = serde_json::json!(42);
        let env = serde_json::json!({
            "version": 7,
            "checksum": checksum(&value).unwrap(),
            "data": value,
        });
        let read = decode("c", &serde_json::to_vec(&env).unwrap()).unwrap();
        assert_eq!(read.claims["uid-done"].phase, Phase::Completed);
    }

    #[test]
    fn previous_minor_without_time_slices_is_read() {
        // What release 0.1 wrote: no `timeSlice` on devices.
        let mut value = serde_json::to_value(data()).unwrap();
        for c in value["claims"].as_object_mut().unwrap().values_mut() {
            for d in c["devices"].as_array_mut().unwrap() {
                d.as_object_mut().unwrap().remove("timeSlice");
            }
        }
        let env =
            serde_json::json!({"version": 1, "checksum": checksum(&value).unwrap(), "data": value});
        let read = decode("c", &serde_json::to_vec(&env).unwrap()).unwrap();
        assert_eq!(read, data());
        // And a time-slice round-trips.
        let mut d = data();
        d.claims.get_mut("uid-done").unwrap().devices[0].time_slice = Some(TimeSliceRecord {
            gpu_uuid: "GPU-1".into(),
            interval: crate::gpu::TimeSlice::Long,
        });
        assert_eq!(decode("c", &encode(&d).unwrap()).unwrap(), d);
    }

    #[test]
    fn recovery_rolls_back_half_prepared_and_handles_reboot() {
        let same = recover(data(), "boot-1");
        assert!(!same.rebooted);
        assert_eq!(same.rollback.len(), 1);
        assert_eq!(same.rollback[0].0, "uid-half");
        assert_eq!(same.data.claims["uid-done"].phase, Phase::Completed);

        let rebooted = recover(data(), "boot-2");
        assert!(rebooted.rebooted);
        let c = &rebooted.data.claims["uid-done"];
        assert_eq!(c.phase, Phase::NeedsReprepare);
        assert!(
            c.devices[0].mig.is_none(),
            "MIG instances do not survive a reboot"
        );
        assert_eq!(rebooted.data.boot_id, "boot-2");
    }

    #[test]
    fn store_writes_atomically_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        assert_eq!(store.read().unwrap(), Data::default());
        let _lock = store.lock().unwrap();
        store.write(&data()).unwrap();
        assert_eq!(store.read().unwrap(), data());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
        // A second lock from another open file description waits: try_lock must fail.
        let f = File::options()
            .write(true)
            .open(dir.path().join("checkpoint.lock"))
            .unwrap();
        assert!(nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err());
    }
}
