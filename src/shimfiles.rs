//! What the node agent provides to the CUDA shim (`libtessera_cuda.so`, `shim/`), so that
//! a vGPU container cannot lift its own limits (docs/shim.md "Where limits come from"):
//!
//! - [`ShimLibrary`]: the library copied from the agent's image into `<state-dir>/lib/`
//!   (SHA-256 of source and copy compared, atomic rename) and the preload list
//!   `<state-dir>/lib/ld.so.preload` naming it; [`ShimLibrary::verify`] is what Allocate
//!   and NodePrepareResources call before handing out a vGPU (fail closed);
//! - [`AllocDirs`]: one directory per allocation (device-plugin container or DRA claim),
//!   `<state-dir>/vgpu/<id>/`, holding the agent-written `limits` file (root, 0444,
//!   replaced atomically) and the `acct/` directory of that allocation's accounting file.
//!   The runtime mounts `<id>/` read-only at [`CONTAINER_LIMITS_DIR`] (the path compiled
//!   into the shim) and `<id>/acct/` read-write at [`CONTAINER_ACCOUNTING_DIR`].
//!
//! Permissions: `<state-dir>/vgpu` is root 0700 (no host user but root reaches anything
//! below it; the runtime's bind mounts do not need the host path to be traversable),
//! `<id>/` root 0755, `limits` root 0444, `acct/` root 01733 (any uid of the container can
//! create its accounting file there, nobody can list it or remove another uid's file).
//!
//! Device-plugin directories (`dp-<id>`) are removed by [`reconcile_device_plugin`] once
//! the kubelet's device checkpoint no longer holds the allocation; a DRA claim's
//! (`claim-<uid>`) by NodeUnprepareResources.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Where the allocation's directory is mounted (read-only) in the container. Must equal
/// `tessera_cuda::source::LIMITS_DIR`, which the shim has compiled in.
pub const CONTAINER_LIMITS_DIR: &str = "/etc/tessera";
/// The limits file's name in the allocation's directory.
pub const LIMITS_FILE: &str = "limits";
/// A split-mode allocation's request, until the agent knows its container
/// ([`crate::vgpu::slots::PendingSlots`], JSON).
pub const PENDING_FILE: &str = "slots";
/// The agent's record of the allocation's units with their GPUs (JSON list of
/// [`UnitLimits`]), written with the limits file: what [`crate::vgpu::guard`] checks the
/// driver's per-process accounting against.
pub const UNITS_FILE: &str = "units.json";
/// The accounting directory's name in the allocation's directory.
pub const ACCOUNTING_DIR: &str = "acct";
/// Where the accounting directory is mounted (read-write) in the container.
pub const CONTAINER_ACCOUNTING_DIR: &str = "/var/run/tessera";
/// The accounting file the shim creates there.
pub const ACCOUNTING_FILE: &str = "cuda.cache";
/// Where the preload list is mounted in the container.
pub const CONTAINER_PRELOAD_LIST: &str = "/etc/ld.so.preload";
/// Prefix of device-plugin allocation directories.
pub const DP_PREFIX: &str = "dp-";
/// Prefix of DRA claim directories.
pub const CLAIM_PREFIX: &str = "claim-";
/// Mode of the accounting directory: sticky, writable and searchable by all, listable
/// only by root.
pub const ACCOUNTING_DIR_MODE: u32 = 0o1733;

/// Errors of the shim files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the CUDA shim library is not installed at {path}: {reason}")]
    NotInstalled { path: String, reason: String },
    #[error(
        "the CUDA shim library at {path} does not match what the agent installed \
         (sha256 {got}, expected {want})"
    )]
    Checksum {
        path: String,
        want: String,
        got: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid allocation directory name {0:?}")]
    BadId(String),
    #[error("kubelet checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
    #[error("allocation record {path}: {reason}")]
    Record { path: String, reason: String },
    #[error("accounting file {path}: {reason}")]
    Accounting { path: String, reason: String },
    #[error("limits file {path}: {reason}")]
    Limits { path: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the file at `path`, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(io(path))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex(ctx.finish().as_ref()))
}

/// Write `bytes` to `dir/name` atomically with [`crate::fsio::Replace`] (the one helper
/// for files the agent writes as root): a new temporary file (`O_EXCL | O_NOFOLLOW`,
/// unique name) in `dir`, mode set exactly (umask does not apply), fsynced, renamed over
/// the target, directory fsynced.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let target = dir.join(name);
    crate::fsio::Replace::durable(mode)
        .write(&target, bytes)
        .map(drop)
        .map_err(io(&target))
}

/// What identifies the installed file without reading it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

#[derive(Debug)]
enum LibState {
    /// Not installed (yet), and why.
    Absent(String),
    Installed {
        sha256: String,
        stamp: Stamp,
    },
}

/// The shim library on the host and the preload list naming it.
#[derive(Debug, Clone)]
pub struct ShimLibrary {
    /// `<state-dir>/lib/libtessera_cuda.so`.
    pub host_path: PathBuf,
    /// `<state-dir>/lib/ld.so.preload`.
    pub preload_list: PathBuf,
    state: Arc<Mutex<LibState>>,
}

impl PartialEq for ShimLibrary {
    fn eq(&self, other: &Self) -> bool {
        self.host_path == other.host_path && self.preload_list == other.preload_list
    }
}

impl Eq for ShimLibrary {}

impl ShimLibrary {
    /// Nothing installed yet: vGPU allocations are refused until [`Self::install`].
    pub fn new(host_path: PathBuf, preload_list: PathBuf) -> ShimLibrary {
        ShimLibrary {
            host_path,
            preload_list,
            state: Arc::new(Mutex::new(LibState::Absent(
                "the agent has not installed it (--shim-source)".into(),
            ))),
        }
    }

    fn set(&self, s: LibState) {
        match self.state.lock() {
            Ok(mut g) => *g = s,
            Err(p) => *p.into_inner() = s,
        }
    }

    /// Record why the library is not installed (shown in every refusal).
    pub fn mark_absent(&self, reason: impl Into<String>) {
        self.set(LibState::Absent(reason.into()));
    }

    /// Copy `source` to [`Self::host_path`] (compared by SHA-256 after the copy, then
    /// renamed into place, mode 0444) and write the preload list naming
    /// `container_path`. Returns the library's SHA-256.
    pub fn install(&self, source: &Path, container_path: &str) -> Result<String> {
        let result = self.install_inner(source, container_path);
        match &result {
            Ok(_) => {}
            Err(e) => self.mark_absent(e.to_string()),
        }
        result
    }

    fn install_inner(&self, source: &Path, container_path: &str) -> Result<String> {
        let dir = self
            .host_path
            .parent()
            .ok_or_else(|| Error::BadId(self.host_path.display().to_string()))?;
        let name = self
            .host_path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::BadId(self.host_path.display().to_string()))?;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(io(dir))?;
        let want = sha256_file(source)?;
        let mut bytes = Vec::new();
        File::open(source)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(io(source))?;
        let copied = hex(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref());
        if copied != want {
            return Err(Error::Checksum {
                path: source.display().to_string(),
                want,
                got: copied,
            });
        }
        write_atomic(dir, name, &bytes, 0o444)?;
        let got = sha256_file(&self.host_path)?;
        if got != want {
            return Err(Error::Checksum {
                path: self.host_path.display().to_string(),
                want,
                got,
            });
        }
        let meta = std::fs::symlink_metadata(&self.host_path).map_err(io(&self.host_path))?;
        let list_dir = self
            .preload_list
            .parent()
            .ok_or_else(|| Error::BadId(self.preload_list.display().to_string()))?;
        let list_name = self
            .preload_list
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::BadId(self.preload_list.display().to_string()))?;
        std::fs::create_dir_all(list_dir).map_err(io(list_dir))?;
        write_atomic(
            list_dir,
            list_name,
            format!("{container_path}\n").as_bytes(),
            0o444,
        )?;
        self.set(LibState::Installed {
            sha256: want.clone(),
            stamp: Stamp::of(&meta),
        });
        Ok(want)
    }

    /// Check that the installed library is still there and unchanged (re-hashed only
    /// when its inode, size or times changed) and that the preload list exists.
    pub fn verify(&self) -> Result<()> {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let (want, stamp) = match &*guard {
            LibState::Absent(reason) => {
                return Err(Error::NotInstalled {
                    path: self.host_path.display().to_string(),
                    reason: reason.clone(),
                })
            }
            LibState::Installed { sha256, stamp } => (sha256.clone(), *stamp),
        };
        let missing = |e: std::io::Error, path: &Path| Error::NotInstalled {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let meta =
            std::fs::symlink_metadata(&self.host_path).map_err(|e| missing(e, &self.host_path))?;
        if !meta.is_file() {
            return Err(Error::NotInstalled {
                path: self.host_path.display().to_string(),
                reason: "not a regular file".into(),
            });
        }
        std::fs::symlink_metadata(&self.preload_list)
            .map_err(|e| missing(e, &self.preload_list))?;
        let now = Stamp::of(&meta);
        if now == stamp {
            return Ok(());
        }
        let got = sha256_file(&self.host_path)?;
        if got != want {
            return Err(Error::Checksum {
                path: self.host_path.display().to_string(),
                want,
                got,
            });
        }
        *guard = LibState::Installed {
            sha256: want,
            stamp: now,
        };
        Ok(())
    }
}

/// One vGPU unit's limits as the container sees it (CUDA ordinal `index`), and the GPU
/// (UUID) it lies on, which the shim does not need but the agent's guard does
/// ([`UNITS_FILE`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnitLimits {
    pub index: usize,
    pub gpu: String,
    pub memory_mib: u64,
    pub cores: u32,
}

/// The limits file's text (the format `shim/src/source.rs` parses): `version=1`, the
/// HAMi-core variables per unit, the accounting file and the core policy.
pub fn limits_text(units: &[UnitLimits]) -> String {
    let mut s = String::from("# written by tessera node; read by libtessera_cuda.so\nversion=1\n");
    for u in units {
        s.push_str(&format!(
            "CUDA_DEVICE_MEMORY_LIMIT_{}={}m\n",
            u.index, u.memory_mib
        ));
        s.push_str(&format!("CUDA_DEVICE_SM_LIMIT_{}={}\n", u.index, u.cores));
    }
    s.push_str(&format!(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE={CONTAINER_ACCOUNTING_DIR}/{ACCOUNTING_FILE}\n"
    ));
    s.push_str("TESSERA_CORE_POLICY=default\n");
    s
}

/// The per-allocation directories under `<state-dir>/vgpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocDirs {
    pub root: PathBuf,
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::BadId(id.to_string()))
    }
}

fn ensure_dir(path: &Path, mode: u32) -> Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(path)(e)),
    }
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    if !meta.is_dir() {
        return Err(io(path)(std::io::Error::other(
            "exists and is not a directory",
        )));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io(path))
}

impl AllocDirs {
    pub fn new(root: impl Into<PathBuf>) -> AllocDirs {
        AllocDirs { root: root.into() }
    }

    /// `<root>/<id>`.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// `<root>/<id>/acct`.
    pub fn accounting_dir(&self, id: &str) -> PathBuf {
        self.root.join(id).join(ACCOUNTING_DIR)
    }

    /// Create `<root>` (0700), `<root>/<id>` (0755) and its `acct/` (01733). The limits
    /// file may be written now or later ([`Self::write_limits`]); the shim waits a
    /// bounded time for it.
    pub fn create(&self, id: &str) -> Result<PathBuf> {
        check_id(id)?;
        if let Some(parent) = self.root.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        ensure_dir(&self.root, 0o700)?;
        let dir = self.dir(id);
        ensure_dir(&dir, 0o755)?;
        ensure_dir(&dir.join(ACCOUNTING_DIR), ACCOUNTING_DIR_MODE)?;
        Ok(dir)
    }

    /// Write (or replace) the allocation's limits file and its [`UNITS_FILE`] record:
    /// root, 0444, atomic (the record first, so a limits file always has one).
    pub fn write_limits(&self, id: &str, units: &[UnitLimits]) -> Result<()> {
        check_id(id)?;
        let record = serde_json::to_vec(units).map_err(|e| Error::Record {
            path: self.dir(id).join(UNITS_FILE).display().to_string(),
            reason: e.to_string(),
        })?;
        write_atomic(&self.dir(id), UNITS_FILE, &record, 0o444)?;
        write_atomic(
            &self.dir(id),
            LIMITS_FILE,
            limits_text(units).as_bytes(),
            0o444,
        )
    }

    /// The units an allocation's limits were written for (`None`: no limits written yet,
    /// as for a split-mode allocation waiting for its container).
    pub fn read_units(&self, id: &str) -> Result<Option<Vec<UnitLimits>>> {
        let Some(bytes) = self.read_record(id, UNITS_FILE)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Record {
                path: self.dir(id).join(UNITS_FILE).display().to_string(),
                reason: e.to_string(),
            })
    }

    /// Write `<root>/<id>/<name>` (root, 0444, atomically): the agent's own records of the
    /// allocation, e.g. a split-mode allocation's [`PENDING_FILE`].
    pub fn write_record(&self, id: &str, name: &str, bytes: &[u8]) -> Result<()> {
        check_id(id)?;
        write_atomic(&self.dir(id), name, bytes, 0o444)
    }

    /// Read `<root>/<id>/<name>`; `None` when it does not exist.
    pub fn read_record(&self, id: &str, name: &str) -> Result<Option<Vec<u8>>> {
        check_id(id)?;
        let path = self.dir(id).join(name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Remove `<root>/<id>` and everything in it; a missing directory is fine.
    pub fn remove(&self, id: &str) -> Result<()> {
        check_id(id)?;
        let dir = self.dir(id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&dir)(e)),
        }
    }

    /// The directory names under `<root>` starting with `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.root)(e)),
        };
        let mut out: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| n.starts_with(prefix))
            .collect();
        out.sort();
        Ok(out)
    }
}

/// The accounting file's layout (`shim/src/account/shared.rs`): 64-bit words in the
/// host's byte order; a header `magic, version, devices, slots, checksum`, then one
/// device total per cache line from word 8, then 128 process slots.
pub mod accounting {
    /// `TSRACCT\0`, little-endian.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRACCT\0");
    pub const VERSION: u64 = 1;
    /// CUDA ordinals a container may see (`tessera_cuda::config::MAX_DEVICES`).
    pub const DEVICES: usize = 16;
    pub const SLOTS: usize = 128;
    pub const TOTALS_AT: usize = 8;
    pub const TOTAL_STRIDE: usize = 8;
    const SLOT_WORDS: usize = 24;
    pub const WORDS: usize = TOTALS_AT + DEVICES * TOTAL_STRIDE + SLOTS * SLOT_WORDS;
    /// The file's exact length in bytes (25 664).
    pub const FILE_LEN: u64 = (WORDS * 8) as u64;
    /// Larger counters mean corruption (the shim's own bound).
    pub const SANE_MAX: u64 = 1 << 50;

    /// The header's checksum over `magic, version, devices, slots` (FNV-1a over words).
    pub fn checksum(words: &[u64; 4]) -> u64 {
        words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ x).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

/// Device memory the container's processes hold, per CUDA ordinal, from its accounting
/// file (the shim's per-device totals: a process killed since its last reaping is still
/// counted, as the shim itself counts it). `Ok(None)`: no file yet (no CUDA process has
/// started). A file of the wrong size, a foreign header or implausible counters is an
/// [`Error::Accounting`] naming the file; at most [`accounting::FILE_LEN`] bytes are read.
pub fn read_accounting(path: &Path) -> Result<Option<[u64; accounting::DEVICES]>> {
    use accounting::*;
    let bad = |reason: String| Error::Accounting {
        path: path.display().to_string(),
        reason,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    let mut bytes = Vec::with_capacity(FILE_LEN as usize);
    file.take(FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    if bytes.len() as u64 != FILE_LEN {
        return Err(bad(format!(
            "{} bytes, expected {FILE_LEN}",
            bytes.len().min(FILE_LEN as usize + 1)
        )));
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    };
    let want = [MAGIC, VERSION, DEVICES as u64, SLOTS as u64];
    let header = [word(0), word(1), word(2), word(3)];
    if header != want || word(4) != checksum(&want) {
        return Err(bad(format!(
            "not a version {VERSION} accounting file (header {header:x?})"
        )));
    }
    let mut totals = [0u64; DEVICES];
    for (d, t) in totals.iter_mut().enumerate() {
        *t = word(TOTALS_AT + d * TOTAL_STRIDE);
        if *t >= SANE_MAX {
            return Err(bad(format!("device {d}: implausible total {t}")));
        }
    }
    Ok(Some(totals))
}

/// The units of a limits file ([`limits_text`]'s format), by CUDA ordinal. Unknown keys
/// are ignored; a malformed limit is an error.
pub fn parse_limits(text: &str) -> std::result::Result<Vec<UnitLimits>, String> {
    let mut units: std::collections::BTreeMap<usize, UnitLimits> = Default::default();
    for line in text.lines().map(str::trim) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (index, is_memory) = if let Some(i) = key.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_") {
            (i, true)
        } else if let Some(i) = key.strip_prefix("CUDA_DEVICE_SM_LIMIT_") {
            (i, false)
        } else {
            continue;
        };
        let index: usize = index
            .parse()
            .ok()
            .filter(|i| *i < accounting::DEVICES)
            .ok_or_else(|| format!("{key}: bad device index"))?;
        let unit = units.entry(index).or_insert(UnitLimits {
            index,
            // The limits file does not name GPUs ([`UNITS_FILE`] does).
            gpu: String::new(),
            memory_mib: 0,
            cores: 0,
        });
        if is_memory {
            let mib = value
                .strip_suffix('m')
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{key}={value}: expected <MiB>m"))?;
            unit.memory_mib = mib;
        } else {
            unit.cores = value
                .parse::<u32>()
                .ok()
                .filter(|c| *c <= 100)
                .ok_or_else(|| format!("{key}={value}: expected a percentage"))?;
        }
    }
    Ok(units.into_values().collect())
}

/// The limits file of an allocation, read back (at most 64 KiB); `Ok(None)` when absent.
pub fn read_limits(dirs: &AllocDirs, id: &str) -> Result<Option<Vec<UnitLimits>>> {
    check_id(id)?;
    let path = dirs.dir(id).join(LIMITS_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let mut text = String::new();
    file.take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(io(&path))?;
    parse_limits(&text)
        .map(Some)
        .map_err(|reason| Error::Limits {
            path: path.display().to_string(),
            reason,
        })
}

/// One device-plugin allocation as the kubelet's checkpoint records it (defined with
/// the pure usage computation that joins it with PodResources).
pub use crate::metrics::usage::CheckpointAllocation;

/// A checkpoint entry's `DeviceIDs`, by NUMA node (`{"0": [...]}`) or as a plain list.
fn device_ids(v: &serde_json::Value) -> Vec<String> {
    let lists: Vec<&serde_json::Value> = match v {
        serde_json::Value::Object(m) => m.values().collect(),
        list @ serde_json::Value::Array(_) => vec![list],
        _ => Vec::new(),
    };
    lists
        .into_iter()
        .filter_map(|l| l.as_array())
        .flatten()
        .filter_map(|id| id.as_str().map(str::to_string))
        .collect()
}

/// One `PodDeviceEntries` item of the kubelet's device checkpoint.
#[derive(serde::Deserialize)]
struct CheckpointEntry {
    #[serde(rename = "AllocResp", default)]
    alloc_resp: Option<String>,
    #[serde(rename = "PodUID", default)]
    pod_uid: String,
    #[serde(rename = "ContainerName", default)]
    container: String,
    #[serde(rename = "ResourceName", default)]
    resource: String,
    /// NUMA node → IDs since Kubernetes 1.20, a plain list before.
    #[serde(rename = "DeviceIDs", default)]
    device_ids: serde_json::Value,
}

impl CheckpointEntry {
    fn allocation(self) -> CheckpointAllocation {
        CheckpointAllocation {
            pod_uid: self.pod_uid,
            container: self.container,
            resource: self.resource,
            device_ids: device_ids(&self.device_ids),
        }
    }
}

/// The kubelet's device checkpoint's `PodDeviceEntries`.
fn checkpoint_entries(checkpoint: &[u8]) -> std::result::Result<Vec<CheckpointEntry>, String> {
    #[derive(serde::Deserialize)]
    struct Checkpoint {
        #[serde(rename = "Data")]
        data: Data,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        #[serde(rename = "PodDeviceEntries", default)]
        entries: Option<Vec<CheckpointEntry>>,
    }
    let cp: Checkpoint = serde_json::from_slice(checkpoint).map_err(|e| e.to_string())?;
    Ok(cp.data.entries.unwrap_or_default())
}

/// Every device-plugin allocation the kubelet's device checkpoint records (pod UID,
/// container, resource, device IDs), whatever the plugin answered: whole GPUs, MIG
/// devices and replicas as well as vGPU slices.
pub fn checkpoint_devices(
    checkpoint: &[u8],
) -> std::result::Result<Vec<CheckpointAllocation>, String> {
    Ok(checkpoint_entries(checkpoint)?
        .into_iter()
        .map(CheckpointEntry::allocation)
        .collect())
}

/// The allocation directory named by each checkpoint entry's `AllocResp`, with the
/// container and devices the kubelet recorded for it (vGPU allocations: the other
/// entries name no directory and are left out).
pub fn checkpoint_allocations(
    checkpoint: &[u8],
) -> std::result::Result<std::collections::BTreeMap<String, CheckpointAllocation>, String> {
    use base64::Engine as _;
    use prost::Message as _;
    let mut out = std::collections::BTreeMap::new();
    for e in checkpoint_entries(checkpoint)? {
        let Some(b64) = &e.alloc_resp else { continue };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| format!("AllocResp is not base64: {e}"))?;
        let resp = crate::proto::deviceplugin::ContainerAllocateResponse::decode(bytes.as_slice())
            .map_err(|e| format!("AllocResp is not a ContainerAllocateResponse: {e}"))?;
        if let Some(id) = resp.annotations.get(ALLOCATION_ANNOTATION) {
            out.insert(id.clone(), e.allocation());
        }
    }
    Ok(out)
}

/// The annotation naming a device-plugin container's allocation directory.
pub const ALLOCATION_ANNOTATION: &str = "tessera.io/vgpu-allocation";

/// The allocation directories the kubelet's device checkpoint still refers to: each pod
/// entry's `AllocResp` (base64 of the `ContainerAllocateResponse` the agent answered)
/// carries [`ALLOCATION_ANNOTATION`].
pub fn referenced_allocations(checkpoint: &[u8]) -> Result<BTreeSet<String>, String> {
    Ok(allocation_owners(checkpoint)?.into_keys().collect())
}

/// The pod UID each allocation directory named in the kubelet's device checkpoint
/// belongs to (from the same entries as [`referenced_allocations`]).
pub fn allocation_owners(
    checkpoint: &[u8],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    Ok(checkpoint_allocations(checkpoint)?
        .into_iter()
        .map(|(id, a)| (id, a.pod_uid))
        .collect())
}

/// Remove the device-plugin allocation directories (`dp-*`) that the kubelet's device
/// checkpoint at `checkpoint` no longer refers to and that are older than `grace` (the
/// kubelet writes its checkpoint after Allocate returns). A checkpoint that is missing or
/// cannot be read removes nothing. Returns the removed names.
pub fn reconcile_device_plugin(
    dirs: &AllocDirs,
    checkpoint: &Path,
    grace: Duration,
) -> Result<Vec<String>> {
    let bytes = match std::fs::read(checkpoint) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(checkpoint)(e)),
    };
    let live = referenced_allocations(&bytes).map_err(|reason| Error::Checkpoint {
        path: checkpoint.display().to_string(),
        reason,
    })?;
    let now = SystemTime::now();
    let mut removed = Vec::new();
    for name in dirs.list(DP_PREFIX)? {
        if live.contains(&name) {
            continue;
        }
        let young = std::fs::symlink_metadata(dirs.dir(&name))
            .and_then(|m| m.modified())
            .map(|t| now.duration_since(t).unwrap_or_default() < grace)
            .unwrap_or(false);
        if young {
            continue;
        }
        dirs.remove(&name)?;
        removed.push(name);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn install_copies_verifies_and_refuses_a_changed_library() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src.so");
        std::fs::write(&src, b"\x7fELF shim").unwrap();
        let lib = ShimLibrary::new(
            tmp.path().join("state/lib/libtessera_cuda.so"),
            tmp.path().join("state/lib/ld.so.preload"),
        );
        let e = lib.verify().unwrap_err();
        assert!(e.to_string().contains("not installed"), "{e}");
        let sum = lib
            .install(&src, "/usr/local/tessera/lib/libtessera_cuda.so")
            .unwrap();
        assert_eq!(sum.len(), 64);
        lib.verify().unwrap();
        assert_eq!(mode(&lib.host_path), 0o444);
        assert_eq!(
            std::fs::read_to_string(&lib.preload_list).unwrap(),
            "/usr/local/tessera/lib/libtessera_cuda.so\n"
        );
        assert_eq!(mode(&lib.preload_list), 0o444);
        // Replaced by something else: refused, naming both checksums.
        std::fs::remove_file(&lib.host_path).unwrap();
        std::fs::write(&lib.host_path, b"\x7fELF other").unwrap();
        let e = lib.verify().unwrap_err();
        assert!(e.to_string().contains(&sum), "{e}");
        std::fs::remove_file(&lib.host_path).unwrap();
        let e = lib.verify().unwrap_err();
        assert!(e.to_string().contains("not installed"), "{e}");
        // A missing source: refused with the reason.
        let e = lib.install(&tmp.path().join("nope.so"), "/x").unwrap_err();
        assert!(e.to_string().contains("nope.so"), "{e}");
        let e = lib.verify().unwrap_err();
        assert!(e.to_string().contains("nope.so"), "{e}");
    }

    #[test]
    fn allocation_dirs_have_their_modes_and_limits_are_atomic() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = AllocDirs::new(tmp.path().join("vgpu"));
        let dir = dirs.create("dp-1").unwrap();
        assert_eq!(mode(&dirs.root), 0o700);
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dirs.accounting_dir("dp-1")), 0o1733);
        let units = [UnitLimits {
            index: 0,
            gpu: "GPU-a".into(),
            memory_mib: 16384,
            cores: 25,
        }];
        dirs.write_limits("dp-1", &units).unwrap();
        let text = std::fs::read_to_string(dir.join(LIMITS_FILE)).unwrap();
        assert!(text.contains("version=1\n"));
        assert!(text.contains("CUDA_DEVICE_MEMORY_LIMIT_0=16384m\n"));
        assert!(text.contains("CUDA_DEVICE_SM_LIMIT_0=25\n"));
        assert!(text.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/run/tessera/cuda.cache\n"));
        assert_eq!(mode(&dir.join(LIMITS_FILE)), 0o444);
        // Rewritten in place of the old file; no temporary left.
        dirs.write_limits("dp-1", &units).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(names.len(), 3, "limits + units + acct only");
        assert_eq!(dirs.read_units("dp-1").unwrap(), Some(units.to_vec()));
        assert_eq!(dirs.read_units("dp-2").unwrap(), None);
        for bad in ["", "..", "a/b", ".hidden"] {
            assert!(dirs.create(bad).is_err(), "{bad:?}");
        }
        dirs.remove("dp-1").unwrap();
        assert!(!dir.exists());
        dirs.remove("dp-1").unwrap();
    }

    /// The usage sampler joins every allocation with PodResources to learn each pod's
    /// UID: a whole GPU's or replica's entry names no directory (its answer has no
    /// allocation annotation) and must still be listed.
    #[test]
    fn checkpoint_devices_lists_every_entry_not_only_the_vgpu_ones() {
        use base64::Engine as _;
        use prost::Message as _;
        let b64 = |annotations: &[(&str, &str)]| {
            let resp = crate::proto::deviceplugin::ContainerAllocateResponse {
                annotations: annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            };
            base64::engine::general_purpose::STANDARD.encode(resp.encode_to_vec())
        };
        let text = format!(
            r#"{{"Data":{{"PodDeviceEntries":[
                {{"PodUID":"uid-whole","ContainerName":"main","ResourceName":"nvidia.com/gpu","DeviceIDs":{{"0":["GPU-0"]}},"AllocResp":"{}"}},
                {{"PodUID":"uid-v","ContainerName":"main","ResourceName":"nvidia.com/vgpu","DeviceIDs":{{"0":["GPU-1::v0"]}},"AllocResp":"{}"}},
                {{"PodUID":"uid-old","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["GPU-2"]}}
            ]}}}}"#,
            b64(&[]),
            b64(&[(ALLOCATION_ANNOTATION, "dp-v")]),
        );
        let all = checkpoint_devices(text.as_bytes()).unwrap();
        let got: Vec<(&str, &str, &[String])> = all
            .iter()
            .map(|a| {
                (
                    a.pod_uid.as_str(),
                    a.resource.as_str(),
                    a.device_ids.as_slice(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("uid-whole", "nvidia.com/gpu", &["GPU-0".to_string()][..]),
                ("uid-v", "nvidia.com/vgpu", &["GPU-1::v0".to_string()][..]),
                ("uid-old", "nvidia.com/gpu", &["GPU-2".to_string()][..]),
            ]
        );
        let dirs = checkpoint_allocations(text.as_bytes()).unwrap();
        assert_eq!(dirs.keys().collect::<Vec<_>>(), vec!["dp-v"]);
        assert!(checkpoint_devices(b"not json").is_err());
    }

    #[test]
    fn device_plugin_dirs_go_when_the_checkpoint_drops_them() {
        use base64::Engine as _;
        use prost::Message as _;
        let tmp = tempfile::tempdir().unwrap();
        let dirs = AllocDirs::new(tmp.path().join("vgpu"));
        for id in ["dp-live", "dp-gone", "claim-u1"] {
            dirs.create(id).unwrap();
        }
        let resp = crate::proto::deviceplugin::ContainerAllocateResponse {
            annotations: [(ALLOCATION_ANNOTATION.to_string(), "dp-live".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let b64 = base64::engine::general_purpose::STANDARD.encode(resp.encode_to_vec());
        let cp = tmp.path().join("kubelet_internal_checkpoint");
        std::fs::write(
            &cp,
            format!(
                r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"p","ContainerName":"c","ResourceName":"nvidia.com/vgpu","DeviceIDs":{{"-1":["x"]}},"AllocResp":"{b64}"}}],"RegisteredDevices":{{}}}},"Checksum":1}}"#
            ),
        )
        .unwrap();
        // Within the grace period nothing goes.
        let removed = reconcile_device_plugin(&dirs, &cp, Duration::from_secs(600)).unwrap();
        assert!(removed.is_empty());
        let removed = reconcile_device_plugin(&dirs, &cp, Duration::ZERO).unwrap();
        assert_eq!(removed, vec!["dp-gone".to_string()]);
        assert!(dirs.dir("dp-live").exists() && dirs.dir("claim-u1").exists());
        // Device IDs by NUMA node or as the plain list older kubelets write.
        for ids in [r#"{"-1":["x"],"0":["y"]}"#, r#"["x","y"]"#] {
            let text = format!(
                r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":{ids},"AllocResp":"{b64}"}}]}}}}"#
            );
            let got = checkpoint_allocations(text.as_bytes()).unwrap();
            assert_eq!(got["dp-live"].device_ids, ["x", "y"], "{ids}");
            assert_eq!(
                checkpoint_devices(text.as_bytes()).unwrap()[0].device_ids,
                ["x", "y"],
                "{ids}"
            );
            assert_eq!(allocation_owners(text.as_bytes()).unwrap()["dp-live"], "p");
        }
        // An unreadable checkpoint removes nothing and says why.
        std::fs::write(&cp, "not json").unwrap();
        assert!(reconcile_device_plugin(&dirs, &cp, Duration::ZERO).is_err());
        assert!(dirs.dir("dp-live").exists());
    }

    /// An accounting file in the shim's layout with `totals` per device.
    pub(crate) fn accounting_bytes(totals: &[u64]) -> Vec<u8> {
        use accounting::*;
        let mut words = vec![0u64; WORDS];
        let want = [MAGIC, VERSION, DEVICES as u64, SLOTS as u64];
        words[..4].copy_from_slice(&want);
        words[4] = checksum(&want);
        for (d, t) in totals.iter().enumerate() {
            words[TOTALS_AT + d * TOTAL_STRIDE] = *t;
        }
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn accounting_files_are_read_and_foreign_ones_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("cuda.cache");
        assert_eq!(accounting::FILE_LEN, 25_664, "docs/shim.md's size");
        assert!(read_accounting(&path).unwrap().is_none());
        std::fs::write(&path, accounting_bytes(&[3 << 30, 0, 7])).unwrap();
        let totals = read_accounting(&path).unwrap().unwrap();
        assert_eq!((totals[0], totals[1], totals[2]), (3 << 30, 0, 7));
        let mut bad = accounting_bytes(&[1]);
        bad[0] ^= 1;
        let short = accounting_bytes(&[1])[..100].to_vec();
        let mut long = accounting_bytes(&[1]);
        long.extend_from_slice(&[0; 8]);
        let insane = accounting_bytes(&[1 << 51]);
        for bytes in [bad, short, long, insane, b"garbage".to_vec()] {
            std::fs::write(&path, bytes).unwrap();
            let e = read_accounting(&path).unwrap_err();
            assert!(matches!(e, Error::Accounting { .. }), "{e}");
            assert!(e.to_string().contains("cuda.cache"), "{e}");
        }
    }

    #[test]
    fn limits_files_read_back_as_written() {
        let units = [
            UnitLimits {
                index: 0,
                gpu: String::new(),
                memory_mib: 16_384,
                cores: 25,
            },
            UnitLimits {
                index: 1,
                gpu: String::new(),
                memory_mib: 1_024,
                cores: 0,
            },
        ];
        assert_eq!(parse_limits(&limits_text(&units)).unwrap(), units);
        assert!(parse_limits("CUDA_DEVICE_MEMORY_LIMIT_0=lots").is_err());
        assert!(parse_limits("CUDA_DEVICE_SM_LIMIT_99=1").is_err());
        assert!(parse_limits("CUDA_DEVICE_SM_LIMIT_0=101").is_err());
        let tmp = tempfile::tempdir().unwrap();
        let dirs = AllocDirs::new(tmp.path().join("vgpu"));
        dirs.create("dp-1").unwrap();
        assert_eq!(read_limits(&dirs, "dp-1").unwrap(), None);
        dirs.write_limits("dp-1", &units).unwrap();
        assert_eq!(read_limits(&dirs, "dp-1").unwrap().unwrap(), units);
        assert!(read_limits(&dirs, "../x").is_err());
    }
}
