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
//! Writes are atomic: a temporary file, written, fsynced (`Completed` and unprepare
//! records: [`Durability::Durable`]) and renamed over the checkpoint. A `Started` record
//! is renamed into place without its fsync ([`Durability::Written`]), and no write fsyncs
//! the directory: what that leaves to a power loss does not matter after one (see
//! [`Session::commit`]).
//!
//! The file is read once per process: a [`Session`] works on an in-memory copy, checks
//! with a `stat` that nobody else wrote the file since, and [`Session::commit`] writes the
//! copy back; concurrent requests share one write and one fsync (group commit). A file
//! lock, held while any session of the process is open, serialises prepare/unprepare
//! across processes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tracing::warn;

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

/// Encode `data` as a checkpoint file body: one line of JSON whose `data` is the canonical
/// encoding the checksum covers (serialised once, not again for the file; `jq .` shows
/// it indented).
pub fn encode(data: &Data) -> Result<Vec<u8>, serde_json::Error> {
    let canonical = serde_json::to_vec(&serde_json::to_value(data)?)?;
    let checksum = format!("{:08x}", crc32fast::hash(&canonical));
    let mut body = format!(r#"{{"version":{VERSION},"checksum":"{checksum}","data":"#).into_bytes();
    body.reserve(canonical.len() + 2);
    body.extend_from_slice(&canonical);
    body.extend_from_slice(b"}\n");
    Ok(body)
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

/// The checkpoint file and its lock, in the driver's state directory, and this process's
/// copy of its content (shared by clones; see [`Session`]).
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    lock_path: PathBuf,
    live: Arc<Live>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Held while preparing or unpreparing; released on drop.
pub struct Lock(#[allow(dead_code)] nix::fcntl::Flock<File>);

impl Store {
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("checkpoint.json"),
            lock_path: dir.join("checkpoint.lock"),
            live: Arc::default(),
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

    /// Write `data` atomically and durably (write, fsync, rename), bypassing this
    /// process's in-memory copy (the next [`Session`] notices the new file and reads it).
    pub fn write(&self, data: &Data) -> Result<()> {
        let body = encode(data).map_err(|e| self.io(std::io::Error::other(e)))?;
        self.write_body(&body, true).map(|_| ())
    }

    /// Write `body` to a temporary file, fsync it when `sync`, rename it over the
    /// checkpoint; returns the new file's [`Stamp`].
    fn write_body(&self, body: &[u8], sync: bool) -> Result<Stamp> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp).map_err(|e| self.io(e))?;
        f.write_all(body).map_err(|e| self.io(e))?;
        if sync {
            f.sync_all().map_err(|e| self.io(e))?;
        }
        let stamp = Stamp::of(&f.metadata().map_err(|e| self.io(e))?);
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io(e))?;
        Ok(stamp)
    }

    /// Open a [`Session`]: the first open session of the process takes the file lock and
    /// brings the in-memory copy up to date with the file (re-read only when another
    /// writer changed it; a corrupt file is reported and replaced by an empty record).
    pub fn session(&self) -> Result<Session<'_>> {
        let mut lease = lock(&self.live.lease);
        if lease.holders == 0 {
            let file_lock = self.lock()?;
            self.refresh()?;
            lease.lock = Some(file_lock);
        }
        lease.holders += 1;
        Ok(Session { store: self })
    }

    fn stamp(&self) -> Result<Option<Stamp>> {
        match std::fs::metadata(&self.path) {
            Ok(m) => Ok(Some(Stamp::of(&m))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Under the file lock: re-read the file if it is not the one this process last saw.
    fn refresh(&self) -> Result<()> {
        let stamp = self.stamp()?;
        let mut w = lock(&self.live.writer);
        let mut mem = lock(&self.live.mem);
        if mem.data.is_some() && mem.stamp == stamp {
            return Ok(());
        }
        let data = match self.read() {
            Ok(d) => d,
            Err(e @ Error::Corrupt { .. }) => {
                // Never a crash loop: start from an empty record (the kubelet re-sends
                // every claim it still needs); the next write replaces the file.
                warn!(error = %e, "starting from an empty checkpoint");
                Data::default()
            }
            Err(e) => return Err(e),
        };
        mem.data = Some(data);
        mem.stamp = stamp;
        mem.seq += 1;
        w.written = mem.seq;
        w.durable = mem.seq;
        Ok(())
    }

    /// A claim's `Completed` record from the in-memory copy, without the lock: only when
    /// that copy is known to match the file (same [`Stamp`]: nobody else wrote it since) and
    /// no request of this process is working on the claim. `None`: look under a session.
    pub fn completed_hint(&self, uid: &str) -> Option<PreparedClaim> {
        let stamp = self.stamp().ok()??;
        let mem = lock(&self.live.mem);
        if mem.stamp != Some(stamp) || mem.in_flight.contains(uid) {
            return None;
        }
        mem.data
            .as_ref()?
            .claims
            .get(uid)
            .filter(|c| c.phase == Phase::Completed)
            .cloned()
    }
}

// ---------------------------------------------------------------------------------------
// This process's copy of the checkpoint: read once, changed in memory, written back.

/// How far a [`Session::commit`] must go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written and renamed into place, not fsynced: survives a crash of this process (the
    /// kernel has it), not necessarily a power loss. For `Started` records: see
    /// [`Session::commit`].
    Written,
    /// Written, fsynced, renamed: the checkpoint as the issue defines it.
    Durable,
}

/// One change to the in-memory copy; [`Session::commit`] makes it (and every earlier one)
/// reach the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// The checkpoint file's identity as this process last wrote or read it: when the file on
/// disk still has it, nobody else wrote it since and the in-memory copy is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        }
    }
}

#[derive(Default)]
struct Mem {
    /// `None` until the first session loads the file.
    data: Option<Data>,
    /// Bumped by every change.
    seq: u64,
    stamp: Option<Stamp>,
    /// Claims a request of this process is preparing or unpreparing.
    in_flight: BTreeSet<String>,
}

/// What reached the file: the last change written, and the last one fsynced.
#[derive(Default)]
struct Written {
    written: u64,
    durable: u64,
}

/// The file lock, held while at least one session of this process is open.
#[derive(Default)]
struct Lease {
    holders: usize,
    lock: Option<Lock>,
}

/// Shared by the clones of one [`Store`]. Lock order: `lease`, `work`, `writer`, `mem`.
#[derive(Default)]
struct Live {
    mem: Mutex<Mem>,
    /// Signalled when a claim leaves `in_flight`.
    idle: Condvar,
    /// Held by the one thread writing the file (the group commit's leader).
    writer: Mutex<Written>,
    lease: Mutex<Lease>,
    /// Serialises the side effects of prepares and unprepares in this process.
    work: Mutex<()>,
}

/// A poisoned lock means a panic elsewhere; the data it guards is still consistent (every
/// change is one assignment), so carry on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static EMPTY: Data = Data {
    boot_id: String::new(),
    claims: BTreeMap::new(),
};

/// Open while a prepare, an unprepare or the start-up recovery works on the checkpoint.
/// The first open session of the process takes the file lock (other processes wait); the
/// last one to close releases it. Opening one checks the file against the in-memory copy
/// (a `stat`) and re-reads it only when another writer changed it.
pub struct Session<'a> {
    store: &'a Store,
}

/// Marks a claim as being worked on by this request (see [`Session::begin`]).
pub struct InFlight<'a> {
    live: &'a Live,
    uid: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.live.mem).in_flight.remove(&self.uid);
        self.live.idle.notify_all();
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let mut lease = lock(&self.store.live.lease);
        lease.holders = lease.holders.saturating_sub(1);
        if lease.holders == 0 {
            lease.lock = None;
        }
    }
}

impl Session<'_> {
    /// Read the in-memory copy.
    pub fn view<R>(&self, f: impl FnOnce(&Data) -> R) -> R {
        let mem = lock(&self.store.live.mem);
        f(mem.data.as_ref().unwrap_or(&EMPTY))
    }

    /// Change the in-memory copy; commit the ticket to write it.
    pub fn update<R>(&self, f: impl FnOnce(&mut Data) -> R) -> (R, Ticket) {
        let mut mem = lock(&self.store.live.mem);
        let Mem { data, seq, .. } = &mut *mem;
        let r = f(data.get_or_insert_with(Data::default));
        *seq += 1;
        (r, Ticket(*seq))
    }

    /// Wait until no other request of this process works on claim `uid`, then hold it
    /// until the returned guard drops: two requests for one claim never interleave.
    pub fn begin(&self, uid: &str) -> InFlight<'_> {
        let live = &*self.store.live;
        let mut mem = lock(&live.mem);
        while mem.in_flight.contains(uid) {
            mem = live.idle.wait(mem).unwrap_or_else(PoisonError::into_inner);
        }
        mem.in_flight.insert(uid.to_string());
        InFlight {
            live,
            uid: uid.to_string(),
        }
    }

    /// Serialise side effects (MIG layout changes read the GPU's current layout and
    /// write a new one) with the other requests of this process.
    pub fn work(&self) -> MutexGuard<'_, ()> {
        lock(&self.store.live.work)
    }

    /// Make the change `ticket` (and every earlier one) reach the file, as far as
    /// `durability` says. Group commit: one thread writes at a time, the whole in-memory
    /// copy as it is when it starts; a caller whose change was covered by another's write
    /// returns without writing, so concurrent requests share one write and one fsync.
    ///
    /// A `Durable` commit whose change is already written (not fsynced) only fsyncs the
    /// file in place. The directory is not fsynced after the rename: a crash of the
    /// process keeps the rename (it is in the kernel), and what only a power loss can undo
    /// (the rename, leaving the previous whole file) does not matter after one: the node
    /// reboots, [`recover`] sees the new boot ID and every claim is prepared again (MIG
    /// instances, compute time-slices and `/var/run/cdi` did not survive), and what
    /// persists on disk is swept at start (unowned MIG instances, CDI specs of claims the
    /// checkpoint does not hold as `Completed`).
    pub fn commit(&self, ticket: Ticket, durability: Durability) -> Result<()> {
        let store = self.store;
        let live = &*store.live;
        let mut w = lock(&live.writer);
        let durable = durability == Durability::Durable;
        if w.durable >= ticket.0 || (!durable && w.written >= ticket.0) {
            return Ok(());
        }
        if durable && w.written >= ticket.0 {
            File::open(&store.path)
                .and_then(|f| f.sync_data())
                .map_err(|e| store.io(e))?;
            w.durable = w.written;
            return Ok(());
        }
        let (body, seq) = {
            let mem = lock(&live.mem);
            (encode(mem.data.as_ref().unwrap_or(&EMPTY)), mem.seq)
        };
        let body = body.map_err(|e| store.io(std::io::Error::other(e)))?;
        let stamp = store.write_body(&body, durable)?;
        w.written = seq;
        if durable {
            w.durable = seq;
        }
        lock(&live.mem).stamp = Some(stamp);
        Ok(())
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
        // The same envelope a generic JSON writer produces (what earlier releases wrote).
        let value = serde_json::to_value(data()).unwrap();
        let generic = serde_json::json!({
            "version": VERSION, "checksum": checksum(&value).unwrap(), "data": value,
        });
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            generic
        );

        let text = String::from_utf8(bytes.clone()).unwrap();
        let tampered = text.replace("train-gpu", "train-gpx");
        let e = decode("c", tampered.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        let e = decode("c", &bytes[..bytes.len() / 2]).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        let e = decode(
            "c",
            text.replace("\"version\":2,", "\"version\":200,")
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

    fn lock_is_free(dir: &Path) -> bool {
        let f = File::options()
            .write(true)
            .open(dir.join("checkpoint.lock"))
            .unwrap();
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
    }

    #[test]
    fn sessions_keep_the_file_locked_and_commit_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let s1 = store.session().unwrap();
        let s2 = store.session().unwrap();
        assert!(!lock_is_free(dir.path()), "held while a session is open");
        let ((), t1) = s1.update(|d| {
            d.claims.insert("uid-done".into(), claim(Phase::Started));
        });
        let ((), t2) = s2.update(|d| {
            d.claims.get_mut("uid-done").unwrap().phase = Phase::Completed;
        });
        assert!(t2 > t1);
        // Nothing reaches the file before a commit.
        assert_eq!(store.read().unwrap(), Data::default());
        // One write covers both changes: the earlier ticket is already in the file.
        s2.commit(t2, Durability::Durable).unwrap();
        let mtime = std::fs::metadata(dir.path().join("checkpoint.json"))
            .unwrap()
            .modified()
            .unwrap();
        s1.commit(t1, Durability::Durable).unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("checkpoint.json"))
                .unwrap()
                .modified()
                .unwrap(),
            mtime,
            "covered by the later write: no second write"
        );
        assert_eq!(
            store.read().unwrap().claims["uid-done"].phase,
            Phase::Completed
        );
        drop((s1, s2));
        assert!(lock_is_free(dir.path()), "released by the last session");
    }

    #[test]
    fn a_file_written_by_someone_else_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        {
            let s = store.session().unwrap();
            let ((), t) = s.update(|d| {
                d.claims.insert("uid-done".into(), claim(Phase::Completed));
            });
            s.commit(t, Durability::Written).unwrap();
        }
        assert!(store.completed_hint("uid-done").is_some());
        // Another process (or release) rewrites the file: the copy in memory is stale.
        let other = Store::new(dir.path());
        let mut changed = data();
        changed.claims.remove("uid-done");
        other.write(&changed).unwrap();
        assert_eq!(store.completed_hint("uid-done"), None, "stale: not trusted");
        let s = store.session().unwrap();
        assert_eq!(s.view(|d| d.clone()), changed);
        drop(s);

        // A corrupt file is reported and replaced by an empty record, not an error.
        std::fs::write(dir.path().join("checkpoint.json"), b"{ not json").unwrap();
        let s = store.session().unwrap();
        assert_eq!(s.view(|d| d.claims.len()), 0);
        let ((), t) = s.update(|d| d.boot_id = "boot-3".into());
        s.commit(t, Durability::Durable).unwrap();
        assert_eq!(store.read().unwrap().boot_id, "boot-3");
    }

    #[test]
    fn one_request_per_claim_at_a_time_and_concurrent_commits_all_land() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let busy = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for i in 0..16 {
                let (store, busy) = (&store, &busy);
                scope.spawn(move || {
                    let s = store.session().unwrap();
                    // Half the threads work on the same claim: never two at once.
                    let uid = if i % 2 == 0 {
                        "shared".to_string()
                    } else {
                        format!("uid-{i}")
                    };
                    let _mine = s.begin(&uid);
                    if i % 2 == 0 {
                        assert!(
                            !busy.swap(true, Ordering::SeqCst),
                            "two requests on one claim"
                        );
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        busy.store(false, Ordering::SeqCst);
                    }
                    let ((), t) = s.update(|d| {
                        d.claims.insert(uid.clone(), claim(Phase::Completed));
                    });
                    s.commit(t, Durability::Durable).unwrap();
                });
            }
        });
        let on_disk = store.read().unwrap();
        assert_eq!(
            on_disk.claims.len(),
            9,
            "8 claims of their own + the shared one"
        );
        assert!(lock_is_free(dir.path()));
    }
}
