//! The DRA driver's checkpoint of prepared claims: what survives an agent restart.
//!
//! Two files in the state directory: the snapshot `checkpoint.json` and the intent log
//! `checkpoint.log` ([`log`]); the content is the snapshot with the log's records applied.
//!
//! Snapshot format (JSON), readable by older and newer releases alike:
//! `{"version": 3, "checksum": "<crc32 of data>", "data": {"bootId": …, "claims": {…},
//! "logEpoch": …}}`. `version` is `100 × major + minor`. Readers accept any version with
//! the major they know and ignore unknown fields (minor bumps only add fields), so an
//! upgrade or a rollback never turns a good checkpoint into garbage. A checksum mismatch,
//! a newer major version, or undecodable JSON is reported as [`Error::Corrupt`]: the caller
//! rebuilds from the API server's claims instead of crash-looping on it. Minor 3 added
//! `logEpoch`: the log whose header carries that epoch continues this snapshot; a snapshot
//! without it (written by an earlier release, which does not know the log) has no log.
//!
//! Each claim records two phases: `Started` is written *before* any side effect (MIG
//! instance creation, CDI spec), `Completed` after. On start, `Started` claims are rolled
//! back. A changed boot ID (the node rebooted: MIG instances and `/var/run/cdi` are gone)
//! keeps the claims but marks them for re-preparation, so the kubelet's next
//! NodePrepareResources re-creates them instead of failing.
//!
//! Writes: a commit appends one checksummed record of its changes to the log, in place in
//! the preallocated file (unprepare records: [`Durability::Durable`], `fdatasync`ed;
//! `Started` and `Completed`: [`Durability::Written`], in the kernel, not synced, since
//! only a power loss or kernel crash loses them and both reboot the node, after which
//! every claim is prepared again; see [`Session::commit`] and docs/dra.md). A record torn by a crash is ignored on reading. A compaction
//! ([`Session::settle`]: at start-up and on shutdown, and when the log is full or
//! damaged) writes the whole content atomically as a new snapshot (temporary file, fsync,
//! rename, directory fsync) with a new epoch, then empties the log for that epoch.
//!
//! The files are read once per process: a [`Session`] works on an in-memory copy, checks
//! with a `stat` and a `pread` that nobody else wrote them since, and [`Session::commit`]
//! writes the changes; concurrent requests share one record and one `fdatasync` (group
//! commit). A file lock, held while any session of the process is open, serialises
//! prepare/unprepare across processes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::envelope;
#[cfg(test)]
use super::envelope::{checksum, Envelope};

pub mod log;

/// The snapshot format written by this release (major 0, minor 3). Minor 2 added
/// `devices[].timeSlice`, minor 3 `logEpoch`; readers of earlier minors ignore them.
pub const VERSION: u32 = 3;

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

/// Encode `data` as a snapshot body without a log: one line of JSON whose `data` is the
/// canonical encoding the checksum covers (serialised once, not again for the file; `jq .`
/// shows it indented).
pub fn encode(data: &Data) -> Result<Vec<u8>, serde_json::Error> {
    encode_snapshot(data, 0)
}

/// Encode `data` as a snapshot body continued by the log of `log_epoch` (0: none).
pub fn encode_snapshot(data: &Data, log_epoch: u64) -> Result<Vec<u8>, serde_json::Error> {
    let mut value = serde_json::to_value(data)?;
    if let (serde_json::Value::Object(o), true) = (&mut value, log_epoch != 0) {
        o.insert("logEpoch".into(), log_epoch.into());
    }
    envelope::seal(VERSION, &value)
}

/// Decode a snapshot body; `path` only names it in errors.
pub fn decode(path: &str, bytes: &[u8]) -> Result<Data> {
    decode_snapshot(path, bytes).map(|(data, _)| data)
}

/// Decode a snapshot body and the epoch of the log that continues it (0: none).
pub fn decode_snapshot(path: &str, bytes: &[u8]) -> Result<(Data, u64)> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_string(),
        reason,
    };
    let data = envelope::open(VERSION, "checkpoint", bytes).map_err(corrupt)?;
    let epoch = data
        .get("logEpoch")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let data = serde_json::from_value(data).map_err(|e| corrupt(format!("bad content: {e}")))?;
    Ok((data, epoch))
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

/// The checkpoint's files (snapshot, log) and their lock, in the driver's state
/// directory, and this process's copy of their content (shared by clones; see
/// [`Session`]).
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    log_path: PathBuf,
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
            log_path: dir.join(log::FILE_NAME),
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

    fn log_io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.log_path.display().to_string(),
            source,
        }
    }

    /// Take the exclusive lock (blocks until free).
    pub fn lock(&self) -> Result<Lock> {
        if let Some(dir) = self.lock_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        }
        let f = crate::fsio::no_follow(
            File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600),
        )
        .open(&self.lock_path)
        .map_err(|e| self.io(e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map(Lock)
            .map_err(|(_, errno)| self.io(std::io::Error::from(errno)))
    }

    /// Read the checkpoint (the snapshot with the log's records applied); missing files
    /// are an empty checkpoint. Needs no lock: a read that a compaction overlapped (the
    /// snapshot replaced between the two reads) is done again.
    pub fn read(&self) -> Result<Data> {
        let mut tries = 0;
        loop {
            let before = self.stamp()?;
            let read = self.read_files(false);
            tries += 1;
            if tries >= 5 || self.stamp()? == before {
                return read.map(|d| d.data);
            }
        }
    }

    /// Read the snapshot and its log; with `for_writing`, keep the log open to append to.
    fn read_files(&self, for_writing: bool) -> Result<OnDisk> {
        let (mut data, epoch) = match std::fs::read(&self.path) {
            Ok(bytes) => decode_snapshot(&self.path.display().to_string(), &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Data::default(), 0),
            Err(e) => return Err(self.io(e)),
        };
        let file = match crate::fsio::no_follow(File::options().read(true).write(for_writing))
            .open(&self.log_path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(OnDisk {
                    data,
                    epoch_seen: epoch,
                    log: None,
                    compact: true,
                })
            }
            Err(e) => return Err(self.log_io(e)),
        };
        let mut bytes = Vec::new();
        (&file)
            .read_to_end(&mut bytes)
            .map_err(|e| self.log_io(e))?;
        let mut parsed = log::parse(&bytes).map_err(|reason| Error::Corrupt {
            path: self.log_path.display().to_string(),
            reason,
        })?;
        let log = match for_writing {
            true => Some(log::LogFile::found(file, &parsed).map_err(|e| self.log_io(e))?),
            false => None,
        };
        let epoch_seen = epoch.max(parsed.epoch);
        if epoch == 0 || parsed.epoch != epoch {
            // Not this snapshot's log: left by a compaction interrupted after the new
            // snapshot (which holds all of it), or the snapshot was written by a release
            // without a log (which read its own snapshot only). Reused after a compaction.
            return Ok(OnDisk {
                data,
                epoch_seen,
                log,
                compact: true,
            });
        }
        if parsed.torn {
            warn!(path = %self.log_path.display(), at = parsed.end,
                  "ignoring a record torn by a crash at the end of the checkpoint log");
        }
        log::apply(&mut data, std::mem::take(&mut parsed.ops));
        Ok(OnDisk {
            data,
            epoch_seen,
            log,
            compact: parsed.torn,
        })
    }

    /// Write `data` as the snapshot, atomically and durably (write, fsync, rename),
    /// without a log (its records no longer apply), bypassing this process's in-memory
    /// copy (the next [`Session`] notices the new file and reads it).
    pub fn write(&self, data: &Data) -> Result<()> {
        let body = encode(data).map_err(|e| self.io(std::io::Error::other(e)))?;
        self.write_body(&body, true, false).map(|_| ())
    }

    /// Write `body` to a new temporary file ([`crate::fsio::Replace`]: a unique name a
    /// planted symlink cannot redirect), fsync it when `sync`, rename it over the
    /// snapshot, fsync the directory when `sync_dir`; returns the new file's [`Stamp`].
    fn write_body(&self, body: &[u8], sync: bool, sync_dir: bool) -> Result<Stamp> {
        let replace = crate::fsio::Replace {
            mode: 0o600,
            sync_file: sync,
            sync_dir,
        };
        let f = replace.write(&self.path, body).map_err(|e| self.io(e))?;
        Ok(Stamp::of(&f.metadata().map_err(|e| self.io(e))?))
    }

    /// A compaction, under the writer lock: the in-memory copy becomes a new snapshot with
    /// a new log epoch (temporary file, fsync, rename, directory fsync), and only then is
    /// the log emptied for that epoch (its header rewritten in place and `fdatasync`ed, or
    /// a new log created). In that order, a crash or power loss at any point leaves either
    /// the old snapshot with its whole log, or the new snapshot with a log that does not
    /// apply to it (older header, torn header) or is empty: never a log whose records are
    /// missing from the snapshot it applies to.
    fn compact(&self, w: &mut Written) -> Result<()> {
        let (data, seq) = {
            let mem = lock(&self.live.mem);
            (mem.data.clone().unwrap_or_default(), mem.seq)
        };
        let epoch = next_epoch(w.epoch);
        let body = encode_snapshot(&data, epoch).map_err(|e| self.io(std::io::Error::other(e)))?;
        // Under the writer lock no other write is in progress: what a crash left goes.
        for path in [&self.path, &self.log_path] {
            if let Err(e) = crate::fsio::remove_stale_temps(path) {
                warn!(path = %path.display(), error = %e, "cannot remove stale temporary files");
            }
        }
        let stamp = self.write_body(&body, true, true)?;
        w.epoch = epoch;
        w.on_file = data;
        w.written = seq;
        w.durable = seq;
        lock(&self.live.mem).stamp = Some(stamp);
        let reused = match w.log.as_mut() {
            Some(log) => log.reset(epoch),
            None => Ok(false),
        };
        let fresh = match reused {
            Ok(true) => Ok(None),
            Ok(false) => {
                let dir = self.log_path.parent().unwrap_or(Path::new("."));
                log::LogFile::create(dir, epoch).map(Some)
            }
            Err(e) => Err(e),
        };
        match fresh {
            Ok(fresh) => {
                if let Some(fresh) = fresh {
                    w.log = Some(fresh);
                }
                w.compact = false;
                lock(&self.live.mem).tail = w.log.as_ref().map(log::LogFile::tail);
            }
            Err(e) => {
                // The snapshot holds everything and the log does not apply to it: the
                // change is durable; the next commit compacts again.
                warn!(path = %self.log_path.display(), error = %e,
                      "cannot empty the checkpoint log; the next change rewrites the snapshot");
                w.log = None;
                w.compact = true;
                lock(&self.live.mem).tail = None;
            }
        }
        Ok(())
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

    /// Under the file lock: re-read the files if they are not the ones this process last
    /// saw (another snapshot, or a record after the log's end).
    fn refresh(&self) -> Result<()> {
        let stamp = self.stamp()?;
        let mut w = lock(&self.live.writer);
        let mut mem = lock(&self.live.mem);
        if mem.data.is_some() && mem.stamp == stamp && tail_unchanged(&mem) {
            return Ok(());
        }
        let disk = match self.read_files(true) {
            Ok(d) => d,
            Err(e @ Error::Corrupt { .. }) => {
                // Never a crash loop: start from an empty record (the kubelet re-sends
                // every claim it still needs); the next write replaces both files.
                warn!(error = %e, "starting from an empty checkpoint");
                OnDisk {
                    data: Data::default(),
                    epoch_seen: 0,
                    log: None,
                    compact: true,
                }
            }
            Err(e) => return Err(e),
        };
        mem.data = Some(disk.data.clone());
        mem.stamp = stamp;
        mem.tail = disk.log.as_ref().map(log::LogFile::tail);
        mem.seq += 1;
        w.written = mem.seq;
        w.durable = mem.seq;
        w.on_file = disk.data;
        w.log = disk.log;
        w.compact = disk.compact;
        w.epoch = w.epoch.max(disk.epoch_seen);
        Ok(())
    }

    /// A claim's `Completed` record from the in-memory copy, without the lock: only when
    /// that copy is known to match the file (same [`Stamp`]: nobody else wrote it since) and
    /// no request of this process is working on the claim. `None`: look under a session.
    pub fn completed_hint(&self, uid: &str) -> Option<PreparedClaim> {
        let stamp = self.stamp().ok()??;
        let mem = lock(&self.live.mem);
        if mem.stamp != Some(stamp) || mem.in_flight.contains(uid) || !tail_unchanged(&mem) {
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
    /// Written, not synced: survives a crash of this process (the kernel has it), not
    /// necessarily a power loss. For `Started` records: see [`Session::commit`].
    Written,
    /// Written and synced (`fdatasync` of the log record; a compaction: snapshot written,
    /// fsynced, renamed, directory fsynced).
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
    /// Where the log ended when this process last wrote or read it.
    tail: Option<log::Tail>,
    /// Claims a request of this process is preparing or unpreparing.
    in_flight: BTreeSet<String>,
}

/// What reached the files: the last change written, and the last one made durable; what
/// they hold, and the log this process appends to.
#[derive(Default)]
struct Written {
    written: u64,
    durable: u64,
    /// The content of the files (the snapshot with the log applied).
    on_file: Data,
    log: Option<log::LogFile>,
    /// The next commit must be a compaction: no log for this snapshot, or a torn tail
    /// (appending after it could leave parts of the torn record behind).
    compact: bool,
    /// The highest log epoch seen or written: a new one exceeds it.
    epoch: u64,
}

/// What [`Store::read_files`] found.
struct OnDisk {
    data: Data,
    epoch_seen: u64,
    log: Option<log::LogFile>,
    compact: bool,
}

/// No other writer appended to the log since this process last saw its end.
fn tail_unchanged(mem: &Mem) -> bool {
    mem.tail.as_ref().is_none_or(log::Tail::unchanged)
}

/// A log epoch above `seen`, and above the clock's nanoseconds (epochs of files this
/// process has not seen, e.g. behind a corrupt snapshot, came from an earlier clock).
fn next_epoch(seen: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    seen.max(now) + 1
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

    /// Make the change `ticket` (and every earlier one) reach the files, as far as
    /// `durability` says. Group commit: one thread writes at a time, every change of the
    /// in-memory copy since the last write as one log record (a compaction when the log is
    /// full, missing or damaged); a caller whose change another's write covered returns
    /// without writing, so concurrent requests share one record and one `fdatasync`.
    ///
    /// A `Durable` commit whose change is already written (not synced) only `fdatasync`s
    /// the log. A `Written` record (the `Started` phase) is not synced: a crash of the
    /// process keeps it (the kernel has it); what only a power loss can undo (the record,
    /// lost or torn, ignored on reading) does not matter after one: the node reboots,
    /// [`recover`] sees the new boot ID and every claim is prepared again (MIG instances,
    /// compute time-slices and `/var/run/cdi` did not survive), and what persists on disk
    /// is swept at start (unowned MIG instances, CDI specs of claims the checkpoint does
    /// not hold as `Completed`).
    pub fn commit(&self, ticket: Ticket, durability: Durability) -> Result<()> {
        let store = self.store;
        let live = &*store.live;
        let mut guard = lock(&live.writer);
        let w = &mut *guard;
        let durable = durability == Durability::Durable;
        if w.durable >= ticket.0 || (!durable && w.written >= ticket.0) {
            return Ok(());
        }
        if durable && w.written >= ticket.0 {
            if let Some(log) = &w.log {
                log.sync().map_err(|e| store.log_io(e))?;
            }
            w.durable = w.written;
            return Ok(());
        }
        let (ops, seq) = {
            let mem = lock(&live.mem);
            (
                log::diff(&w.on_file, mem.data.as_ref().unwrap_or(&EMPTY)),
                mem.seq,
            )
        };
        let record = match (&w.log, w.compact) {
            (Some(log), false) => {
                let r = log::record(log.epoch(), &ops)
                    .map_err(|e| store.log_io(std::io::Error::other(e)))?;
                log.fits(r.len()).then_some(r)
            }
            _ => None,
        };
        let (Some(record), Some(log)) = (record, w.log.as_mut()) else {
            return store.compact(w);
        };
        if ops.is_empty() {
            // Nothing new: the files already hold the copy as of `seq`.
            if durable && w.durable < w.written {
                log.sync().map_err(|e| store.log_io(e))?;
                w.durable = w.written;
            }
            if w.durable == w.written {
                w.durable = seq;
            }
            w.written = seq;
            return Ok(());
        }
        if let Err(e) = log.append(&record, durable) {
            // What reached the file is unknown: rewrite the snapshot next time.
            w.compact = true;
            return Err(store.log_io(e));
        }
        let tail = log.tail();
        log::apply(&mut w.on_file, ops);
        w.written = seq;
        if durable {
            w.durable = seq;
        }
        lock(&live.mem).tail = Some(tail);
        Ok(())
    }

    /// Fold the log into a new snapshot ([`Store::compact`]) when it holds records, is
    /// missing or damaged, or changes are not written yet; nothing when the log is empty
    /// and current (no write on a clean start). Called at start-up, after recovery, and at
    /// shutdown, so that a release that reads only the snapshot (0.2 and earlier) finds
    /// every claim there after a restart or a rollback.
    pub fn settle(&self) -> Result<()> {
        let store = self.store;
        let mut w = lock(&store.live.writer);
        let seq = lock(&store.live.mem).seq;
        if !w.compact && w.written >= seq && w.log.as_ref().is_some_and(log::LogFile::is_empty) {
            return Ok(());
        }
        store.compact(&mut w)
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
            text.replace(&format!("\"version\":{VERSION},"), "\"version\":200,")
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

    /// Release 0.2's reader, as it was: major 0, checksum over `data`, unknown fields
    /// ignored, the log unknown.
    fn read_as_release_0_2(dir: &Path) -> Data {
        let bytes = std::fs::read(dir.join("checkpoint.json")).unwrap();
        let env: Envelope = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(env.version / 100, 0, "a major 0.2 reads");
        assert_eq!(checksum(&env.data).unwrap(), env.checksum);
        serde_json::from_value(env.data).unwrap()
    }

    fn put(s: &Session<'_>, uid: &str, phase: Phase, durability: Durability) {
        let ((), t) = s.update(|d| {
            d.boot_id = "boot-1".into();
            d.claims.insert(uid.into(), claim(phase));
        });
        s.commit(t, durability).unwrap();
    }

    fn log_bytes(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join(log::FILE_NAME)).unwrap()
    }

    #[test]
    fn commits_append_to_the_log_and_settle_folds_it_into_the_snapshot() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let s = store.session().unwrap();
        s.settle().unwrap();
        let snapshot = dir.path().join("checkpoint.json");
        let ino = std::fs::metadata(&snapshot).unwrap().ino();
        put(&s, "uid-a", Phase::Started, Durability::Written);
        put(&s, "uid-a", Phase::Completed, Durability::Durable);
        put(&s, "uid-b", Phase::Started, Durability::Written);
        assert_eq!(
            std::fs::metadata(&snapshot).unwrap().ino(),
            ino,
            "no snapshot rewrite"
        );
        let parsed = log::parse(&log_bytes(dir.path())).unwrap();
        assert_eq!(parsed.ops.len(), 4, "{:?}", parsed.ops);
        // Another process (a restart after a crash) reads the snapshot and the log,
        // the unsynced `Started` record included.
        let read = Store::new(dir.path()).read().unwrap();
        assert_eq!(read.claims["uid-a"].phase, Phase::Completed);
        assert_eq!(read.claims["uid-b"].phase, Phase::Started);
        // Release 0.2 reads the snapshot written by this release, without the log...
        assert!(read_as_release_0_2(dir.path()).claims.is_empty());
        // ...and everything once the log is folded in (start-up, shutdown).
        s.settle().unwrap();
        assert_ne!(std::fs::metadata(&snapshot).unwrap().ino(), ino);
        assert_eq!(read_as_release_0_2(dir.path()), read);
        assert_eq!(Store::new(dir.path()).read().unwrap(), read);
        let parsed = log::parse(&log_bytes(dir.path())).unwrap();
        assert!(parsed.ops.is_empty(), "log emptied");
        // A clean settle writes nothing.
        let ino = std::fs::metadata(&snapshot).unwrap().ino();
        s.settle().unwrap();
        assert_eq!(std::fs::metadata(&snapshot).unwrap().ino(), ino);
    }

    #[test]
    fn a_full_log_is_compacted_and_nothing_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let s = store.session().unwrap();
        // ~500 bytes a record: a few compactions in a 1 MiB log.
        for i in 0..5000 {
            let phase = [Phase::Started, Phase::Completed][i % 2];
            // Mostly unsynced: the test is about compactions, not the disk.
            let durability = match i % 100 {
                99 => Durability::Durable,
                _ => Durability::Written,
            };
            put(&s, &format!("uid-{}", i % 40), phase, durability);
        }
        let want = s.view(|d| d.clone());
        assert_eq!(want.claims.len(), 40);
        assert_eq!(Store::new(dir.path()).read().unwrap(), want);
        assert_eq!(
            std::fs::metadata(dir.path().join(log::FILE_NAME))
                .unwrap()
                .len(),
            log::SIZE
        );
    }

    #[test]
    fn crash_tests_torn_append_corrupt_record_interrupted_compaction() {
        let prepared = |dir: &Path| {
            let store = Store::new(dir);
            let s = store.session().unwrap();
            s.settle().unwrap(); // as at start-up: the log exists, empty
            put(&s, "uid-a", Phase::Completed, Durability::Durable);
            put(&s, "uid-b", Phase::Completed, Durability::Durable);
            put(&s, "uid-c", Phase::Started, Durability::Written);
        };
        let ends = |dir: &Path| -> Vec<usize> {
            let bytes = log_bytes(dir);
            let mut out = vec![];
            let mut pos = log::HEADER_LEN as usize;
            while bytes[pos] != 0 {
                pos += bytes[pos..].iter().position(|&b| b == b'\n').unwrap() + 1;
                out.push(pos);
            }
            out
        };

        // Torn append: the crash cut the last record (uid-c's Started) short; it is
        // ignored, the rest is read, and the next commit rewrites the snapshot instead of
        // appending after the torn bytes.
        let dir = tempfile::tempdir().unwrap();
        prepared(dir.path());
        let e = ends(dir.path());
        let mut bytes = log_bytes(dir.path());
        bytes[e[1] + 30..e[2] + 1].fill(0);
        std::fs::write(dir.path().join(log::FILE_NAME), &bytes).unwrap();
        let store = Store::new(dir.path());
        let read = store.read().unwrap();
        assert_eq!(read.claims.keys().collect::<Vec<_>>(), ["uid-a", "uid-b"]);
        let s = store.session().unwrap();
        put(&s, "uid-d", Phase::Completed, Durability::Durable);
        let snapshot = read_as_release_0_2(dir.path());
        assert_eq!(snapshot.claims.len(), 3, "rewritten as a snapshot");
        drop(s);
        assert_eq!(Store::new(dir.path()).read().unwrap().claims.len(), 3);

        // Corrupt record: a flipped byte in the first record with good records after it
        // is not a crash: reported, the checkpoint starts empty, the next write replaces
        // both files (never a crash loop).
        let dir = tempfile::tempdir().unwrap();
        prepared(dir.path());
        let e = ends(dir.path());
        let mut bytes = log_bytes(dir.path());
        bytes[e[0] - 10] ^= 0x01;
        std::fs::write(dir.path().join(log::FILE_NAME), &bytes).unwrap();
        let err = Store::new(dir.path()).read().unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("checkpoint.log"), "{err}");
        let store = Store::new(dir.path());
        let s = store.session().unwrap();
        assert!(s.view(|d| d.claims.is_empty()));
        put(&s, "uid-e", Phase::Completed, Durability::Durable);
        drop(s);
        let read = Store::new(dir.path()).read().unwrap();
        assert_eq!(read.claims.keys().collect::<Vec<_>>(), ["uid-e"]);

        // Interrupted compaction, at each point: (1) the new snapshot's temporary file
        // written, not renamed; (2) renamed, the log's header not yet rewritten (the old
        // log no longer applies: the new snapshot holds it all); (3) the header rewrite
        // torn. Every point reads the same content.
        let dir = tempfile::tempdir().unwrap();
        prepared(dir.path());
        let want = Store::new(dir.path()).read().unwrap();
        assert_eq!(want.claims.len(), 3);
        let old_snapshot = std::fs::read(dir.path().join("checkpoint.json")).unwrap();
        let old_log = log_bytes(dir.path());
        let old_epoch = log::parse(&old_log).unwrap().epoch;
        let new_snapshot = encode_snapshot(&want, old_epoch + 1).unwrap();
        let mut torn_header = old_log.clone();
        torn_header[..20].copy_from_slice(&log::header(old_epoch + 1)[..20]);
        // (point, snapshot, temporary snapshot, log)
        type Point<'a> = (&'a str, &'a [u8], Option<&'a [u8]>, &'a [u8]);
        let points: [Point<'_>; 3] = [
            (
                "temporary snapshot only",
                &old_snapshot,
                Some(&new_snapshot),
                &old_log,
            ),
            (
                "snapshot renamed, old header",
                &new_snapshot,
                None,
                &old_log,
            ),
            ("header rewrite torn", &new_snapshot, None, &torn_header),
        ];
        for (point, snapshot, tmp, log_file) in points {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("checkpoint.json"), snapshot).unwrap();
            if let Some(tmp) = tmp {
                std::fs::write(dir.path().join("checkpoint.json.tmp"), tmp).unwrap();
            }
            std::fs::write(dir.path().join(log::FILE_NAME), log_file).unwrap();
            let store = Store::new(dir.path());
            assert_eq!(store.read().unwrap(), want, "{point}");
            // And the process that starts next carries on from there.
            let s = store.session().unwrap();
            s.settle().unwrap();
            put(&s, "uid-f", Phase::Completed, Durability::Durable);
            drop(s);
            let read = Store::new(dir.path()).read().unwrap();
            assert_eq!(read.claims.len(), 4, "{point}");
        }
    }

    #[test]
    fn a_record_appended_by_another_writer_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        {
            let s = store.session().unwrap();
            put(&s, "uid-done", Phase::Completed, Durability::Durable);
        }
        assert!(store.completed_hint("uid-done").is_some());
        // Another process takes the lock and appends (the snapshot is not rewritten).
        let other = Store::new(dir.path());
        {
            let s = other.session().unwrap();
            let ((), t) = s.update(|d| {
                d.claims.remove("uid-done");
            });
            s.commit(t, Durability::Durable).unwrap();
        }
        assert_eq!(store.completed_hint("uid-done"), None, "stale: not trusted");
        let s = store.session().unwrap();
        assert!(s.view(|d| d.claims.is_empty()));
    }

    #[test]
    fn a_snapshot_without_log_epoch_ignores_the_log() {
        // A rollback to 0.2 rewrote the snapshot (without `logEpoch`), then an upgrade:
        // the log's records are older than that snapshot and must not be replayed.
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::new(dir.path());
            let s = store.session().unwrap();
            put(&s, "uid-a", Phase::Completed, Durability::Durable);
        }
        let mut by_old = Data::default();
        by_old
            .claims
            .insert("uid-z".into(), claim(Phase::Completed));
        std::fs::write(
            dir.path().join("checkpoint.json"),
            serde_json::to_vec(&serde_json::json!({
                "version": 2,
                "checksum": checksum(&serde_json::to_value(&by_old).unwrap()).unwrap(),
                "data": by_old,
            }))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(Store::new(dir.path()).read().unwrap(), by_old);
    }
}
