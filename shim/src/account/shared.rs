//! The cross-process accounting file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`).
//!
//! The file is a fixed table of 64-bit words mapped into every process of the container:
//!
//! ```text
//! word 0..8      header: magic, version, devices, slots, checksum
//! word 8..136    per-device totals, one cache line each
//! word 136..     128 process slots of 24 words: pid, state, used[16]
//! ```
//!
//! Charging is lock-free: a compare-and-swap on the device total (which never passes the
//! limit) followed by an add to the process's own slot. Credits go the other way round, so
//! a process killed between the two steps can only leave the total too high (fail closed).
//!
//! Liveness needs no pid: each process holds an open-file-description lock on one byte of
//! its slot for its lifetime. The kernel drops it when the process dies (SIGKILL included),
//! so "can I take this slot's lock?" means "its owner is dead" — no pid reuse, no pid
//! namespace confusion. Registration and reaping run under `flock` on the whole file, which
//! the kernel also releases on death, so a process killed while holding it never wedges the
//! others. A file whose header or contents fail validation is replaced atomically
//! (write a new file, `rename` over the path) rather than trusted.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::usage::{cas_charge, saturating_sub, Usage};
use crate::config::MAX_DEVICES;
use crate::ffi::os::{AccountFile, Mapping};

pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRACCT\0");
pub const VERSION: u64 = 1;
pub const SLOTS: usize = 128;
const TOTALS_AT: usize = 8;
const TOTAL_STRIDE: usize = 8;
const SLOTS_AT: usize = TOTALS_AT + MAX_DEVICES * TOTAL_STRIDE;
const SLOT_WORDS: usize = 24;
const SLOT_PID: usize = 0;
const SLOT_STATE: usize = 1;
const SLOT_USED: usize = 2;
/// Total words in the table.
pub const WORDS: usize = SLOTS_AT + SLOTS * SLOT_WORDS;
/// File length in bytes.
pub const FILE_LEN: u64 = (WORDS * 8) as u64;
/// No device has a petabyte: larger counters mean corruption.
const SANE_MAX: u64 = 1 << 50;
/// Registration waits this long for the table lock (bounded by the caller's timeout).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(3600);
/// Reaping dead processes waits at most this long.
const REAP_TIMEOUT: Duration = Duration::from_millis(100);
const STATE_FREE: u64 = 0;
const STATE_LIVE: u64 = 1;

/// Errors opening or maintaining the accounting file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("accounting file {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("accounting file {0}: lock not acquired within {1:?}")]
    LockTimeout(PathBuf, Duration),
    #[error("accounting file {0}: all {SLOTS} process slots are held by live processes")]
    Full(PathBuf),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What the table logic needs from its storage: the words, the table-wide lock and the
/// per-slot liveness locks. The file implementation is [`FileBacking`]; tests use memory.
pub trait Backing: Send + Sync {
    fn words(&self) -> &[AtomicU64];
    /// Take the table-wide lock (registration and reaping), waiting at most `timeout`.
    fn lock_table(&self, timeout: Duration) -> io::Result<()>;
    fn unlock_table(&self);
    /// Try to take slot `i`'s liveness lock: `Ok(true)` when acquired, i.e. no live owner.
    fn try_lock_slot(&self, i: usize) -> io::Result<bool>;
    fn unlock_slot(&self, i: usize);
}

fn checksum(w: &[u64; 4]) -> u64 {
    w.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x).wrapping_mul(0x0100_0000_01b3)
    })
}

fn header(words: &[AtomicU64]) -> [u64; 5] {
    let mut h = [0u64; 5];
    for (i, v) in h.iter_mut().enumerate() {
        *v = words.get(i).map_or(0, |w| w.load(Ordering::Acquire));
    }
    h
}

/// Header matches this version and layout.
pub fn header_valid(words: &[AtomicU64]) -> bool {
    if words.len() < WORDS {
        return false;
    }
    let h = header(words);
    let want = [MAGIC, VERSION, MAX_DEVICES as u64, SLOTS as u64];
    h[..4] == want && h[4] == checksum(&want)
}

/// Contents are plausible (states known, counters below a petabyte).
pub fn body_sane(words: &[AtomicU64]) -> bool {
    let total_ok = (0..MAX_DEVICES)
        .all(|d| words[TOTALS_AT + d * TOTAL_STRIDE].load(Ordering::Relaxed) < SANE_MAX);
    let slots_ok = (0..SLOTS).all(|s| {
        let base = SLOTS_AT + s * SLOT_WORDS;
        let state = words[base + SLOT_STATE].load(Ordering::Relaxed);
        (state == STATE_FREE || state == STATE_LIVE)
            && (0..MAX_DEVICES)
                .all(|d| words[base + SLOT_USED + d].load(Ordering::Relaxed) < SANE_MAX)
    });
    total_ok && slots_ok
}

/// Zero the table and write a fresh header (magic last).
pub fn init(words: &[AtomicU64]) {
    for w in words.iter().skip(1) {
        w.store(0, Ordering::Relaxed);
    }
    let want = [MAGIC, VERSION, MAX_DEVICES as u64, SLOTS as u64];
    words[1].store(VERSION, Ordering::Relaxed);
    words[2].store(MAX_DEVICES as u64, Ordering::Relaxed);
    words[3].store(SLOTS as u64, Ordering::Relaxed);
    words[4].store(checksum(&want), Ordering::Relaxed);
    words[0].store(MAGIC, Ordering::Release);
}

fn total(words: &[AtomicU64], dev: usize) -> &AtomicU64 {
    &words[TOTALS_AT + dev * TOTAL_STRIDE]
}

fn slot_word(words: &[AtomicU64], slot: usize, field: usize) -> &AtomicU64 {
    &words[SLOTS_AT + slot * SLOT_WORDS + field]
}

/// Credit every dead process's usage back and free its slot. Caller holds the table lock.
/// Returns (bytes reclaimed, live slots other than `own`).
pub fn reap(b: &dyn Backing, own: Option<usize>) -> (u64, usize) {
    let words = b.words();
    let mut reclaimed = 0;
    let mut live = 0;
    for s in (0..SLOTS).filter(|s| Some(*s) != own) {
        if slot_word(words, s, SLOT_STATE).load(Ordering::Acquire) != STATE_LIVE {
            continue;
        }
        match b.try_lock_slot(s) {
            Ok(true) => {
                for d in 0..MAX_DEVICES {
                    let used = slot_word(words, s, SLOT_USED + d).swap(0, Ordering::AcqRel);
                    saturating_sub(total(words, d), used);
                    reclaimed += used;
                }
                slot_word(words, s, SLOT_PID).store(0, Ordering::Relaxed);
                slot_word(words, s, SLOT_STATE).store(STATE_FREE, Ordering::Release);
                b.unlock_slot(s);
            }
            // Locked by a live process, or the lock call failed: treat as live (never
            // credit memory we are not sure is gone).
            Ok(false) | Err(_) => live += 1,
        }
    }
    (reclaimed, live)
}

/// Claim a free slot for `pid`. Caller holds the table lock and has reaped.
pub fn claim(b: &dyn Backing, pid: u64, live_others: usize) -> Option<usize> {
    let words = b.words();
    if live_others == 0 {
        // Nobody else is alive: rebuild the totals from scratch, dropping any leak.
        for d in 0..MAX_DEVICES {
            total(words, d).store(0, Ordering::Release);
        }
    }
    for s in 0..SLOTS {
        if slot_word(words, s, SLOT_STATE).load(Ordering::Acquire) != STATE_FREE {
            continue;
        }
        if let Ok(true) = b.try_lock_slot(s) {
            for d in 0..MAX_DEVICES {
                slot_word(words, s, SLOT_USED + d).store(0, Ordering::Relaxed);
            }
            slot_word(words, s, SLOT_PID).store(pid, Ordering::Relaxed);
            slot_word(words, s, SLOT_STATE).store(STATE_LIVE, Ordering::Release);
            return Some(s);
        }
    }
    None
}

/// The cross-process counters of one process (it owns `slot`).
pub struct SharedUsage<B: Backing> {
    backing: B,
    slot: usize,
}

impl<B: Backing> SharedUsage<B> {
    /// Register `pid` in an already validated table.
    pub fn register(backing: B, pid: u64, path: &Path) -> Result<Self> {
        backing
            .lock_table(REGISTER_TIMEOUT)
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                op: "lock",
                source,
            })?;
        let (_, live) = reap(&backing, None);
        let slot = claim(&backing, pid, live);
        backing.unlock_table();
        match slot {
            Some(slot) => Ok(SharedUsage { backing, slot }),
            None => Err(Error::Full(path.to_path_buf())),
        }
    }

    pub fn slot(&self) -> usize {
        self.slot
    }

    pub fn backing(&self) -> &B {
        &self.backing
    }
}

impl<B: Backing> Usage for SharedUsage<B> {
    fn try_charge(&self, dev: usize, bytes: u64, limit: u64) -> bool {
        if dev >= MAX_DEVICES {
            return false;
        }
        let w = self.backing.words();
        if !cas_charge(total(w, dev), bytes, limit) {
            return false;
        }
        slot_word(w, self.slot, SLOT_USED + dev).fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn force_charge(&self, dev: usize, bytes: u64) {
        if dev < MAX_DEVICES {
            let w = self.backing.words();
            total(w, dev).fetch_add(bytes, Ordering::AcqRel);
            slot_word(w, self.slot, SLOT_USED + dev).fetch_add(bytes, Ordering::AcqRel);
        }
    }

    fn credit(&self, dev: usize, bytes: u64) {
        if dev < MAX_DEVICES {
            let w = self.backing.words();
            saturating_sub(slot_word(w, self.slot, SLOT_USED + dev), bytes);
            saturating_sub(total(w, dev), bytes);
        }
    }

    fn used(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        total(self.backing.words(), dev).load(Ordering::Acquire)
    }

    fn own(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        slot_word(self.backing.words(), self.slot, SLOT_USED + dev).load(Ordering::Acquire)
    }

    fn reclaim_dead(&self) -> u64 {
        // Reaping is an optimisation on query and refusal paths: never wait long for it.
        if self.backing.lock_table(REAP_TIMEOUT).is_err() {
            return 0;
        }
        let (reclaimed, _) = reap(&self.backing, Some(self.slot));
        self.backing.unlock_table();
        reclaimed
    }
}

/// The accounting file, mapped.
pub struct FileBacking {
    file: AccountFile,
    map: Mapping,
    lock_timeout: Duration,
}

impl Backing for FileBacking {
    fn words(&self) -> &[AtomicU64] {
        self.map.words()
    }
    fn lock_table(&self, timeout: Duration) -> io::Result<()> {
        self.file.lock_exclusive(timeout.min(self.lock_timeout))
    }
    fn unlock_table(&self) {
        self.file.unlock();
    }
    fn try_lock_slot(&self, i: usize) -> io::Result<bool> {
        self.file.try_lock_byte(slot_lock_offset(i))
    }
    fn unlock_slot(&self, i: usize) {
        self.file.unlock_byte(slot_lock_offset(i));
    }
}

impl FileBacking {
    /// Raw descriptor (closed in a forked child so it does not keep the parent's slot alive).
    pub fn raw_fd(&self) -> i32 {
        self.file.raw_fd()
    }
}

fn slot_lock_offset(slot: usize) -> u64 {
    ((SLOTS_AT + slot * SLOT_WORDS) * 8) as u64
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Open (creating, validating or rebuilding) the accounting file at `path` and register
/// this process in it.
pub fn open(path: &Path, pid: u64, lock_timeout: Duration) -> Result<SharedUsage<FileBacking>> {
    for _attempt in 0..8 {
        let file = AccountFile::open(path).map_err(io_err(path, "open"))?;
        file.lock_exclusive(lock_timeout).map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                Error::LockTimeout(path.to_path_buf(), lock_timeout)
            } else {
                io_err(path, "flock")(e)
            }
        })?;
        // Someone may have replaced the file between our open and our lock.
        if !file.same_inode_as(path).map_err(io_err(path, "stat"))? {
            file.unlock();
            continue;
        }
        let len = file.len().map_err(io_err(path, "stat"))?;
        if len == 0 {
            file.set_len(FILE_LEN).map_err(io_err(path, "truncate"))?;
            let map = file.map(FILE_LEN).map_err(io_err(path, "mmap"))?;
            init(map.words());
            file.unlock();
            return finish(file, map, pid, path, lock_timeout);
        }
        let valid_len = len == FILE_LEN;
        let map = if valid_len {
            Some(file.map(FILE_LEN).map_err(io_err(path, "mmap"))?)
        } else {
            None
        };
        if let Some(map) = map.filter(|m| header_valid(m.words()) && body_sane(m.words())) {
            file.unlock();
            return finish(file, map, pid, path, lock_timeout);
        }
        crate::log::warn(&format!(
            "accounting file {} is corrupt or from another version; rebuilding it",
            path.display()
        ));
        rebuild(path, pid)?;
        file.unlock();
    }
    Err(Error::Io {
        path: path.to_path_buf(),
        op: "open",
        source: io::Error::other("file kept changing under us"),
    })
}

fn finish(
    file: AccountFile,
    map: Mapping,
    pid: u64,
    path: &Path,
    lock_timeout: Duration,
) -> Result<SharedUsage<FileBacking>> {
    SharedUsage::register(
        FileBacking {
            file,
            map,
            lock_timeout,
        },
        pid,
        path,
    )
}

fn rebuild(path: &Path, pid: u64) -> Result<()> {
    let tmp = path.with_extension(format!("rebuild.{pid}"));
    let file = AccountFile::create_truncate(&tmp).map_err(io_err(&tmp, "create"))?;
    file.set_len(FILE_LEN).map_err(io_err(&tmp, "truncate"))?;
    let map = file.map(FILE_LEN).map_err(io_err(&tmp, "mmap"))?;
    init(map.words());
    drop(map);
    std::fs::rename(&tmp, path).map_err(io_err(path, "rename"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    /// In-memory backing: `alive` holds the slots whose owner is a live "process".
    struct MemBacking {
        words: Vec<AtomicU64>,
        alive: Mutex<HashSet<usize>>,
    }

    impl MemBacking {
        fn new() -> Self {
            let words: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
            init(&words);
            MemBacking {
                words,
                alive: Mutex::new(HashSet::new()),
            }
        }
    }

    impl Backing for &MemBacking {
        fn words(&self) -> &[AtomicU64] {
            &self.words
        }
        fn lock_table(&self, _: Duration) -> io::Result<()> {
            Ok(())
        }
        fn unlock_table(&self) {}
        fn try_lock_slot(&self, i: usize) -> io::Result<bool> {
            Ok(self.alive.lock().unwrap().insert(i))
        }
        fn unlock_slot(&self, i: usize) {
            self.alive.lock().unwrap().remove(&i);
        }
    }

    fn kill(m: &MemBacking, slot: usize) {
        m.alive.lock().unwrap().remove(&slot);
    }

    #[test]
    fn header_roundtrip_and_corruption_table() {
        let m = MemBacking::new();
        assert!(header_valid(&m.words) && body_sane(&m.words));
        // (word, value, header ok, body ok)
        let cases = [
            (0, 0xdead, false, true),
            (1, VERSION + 1, false, true),
            (4, 7, false, true),
            (TOTALS_AT, SANE_MAX, true, false),
            (SLOTS_AT + SLOT_STATE, 9, true, false),
        ];
        for (word, value, hdr, body) in cases {
            let m = MemBacking::new();
            m.words[word].store(value, Ordering::Relaxed);
            assert_eq!(header_valid(&m.words), hdr, "word {word}");
            assert_eq!(body_sane(&m.words), body, "word {word}");
        }
        assert!(!header_valid(&m.words[..10]));
    }

    #[test]
    fn processes_share_the_limit_and_dead_ones_are_credited() {
        let m = MemBacking::new();
        let p = Path::new("mem");
        let a = SharedUsage::register(&m, 1, p).unwrap();
        let b = SharedUsage::register(&m, 2, p).unwrap();
        assert_ne!(a.slot(), b.slot());
        assert!(a.try_charge(0, 60, 100));
        assert!(!b.try_charge(0, 60, 100), "sum would pass the limit");
        assert!(b.try_charge(0, 40, 100));
        assert_eq!((a.used(0), a.own(0), b.own(0)), (100, 60, 40));
        kill(&m, a.slot());
        assert_eq!(b.reclaim_dead(), 60);
        assert_eq!(b.used(0), 40);
        assert!(b.try_charge(0, 60, 100));
        b.credit(0, 100);
        assert_eq!(b.used(0), 0);
    }

    #[test]
    fn register_alone_resets_leaked_totals() {
        let m = MemBacking::new();
        total(&m.words, 3).store(12345, Ordering::Relaxed);
        let a = SharedUsage::register(&m, 1, Path::new("mem")).unwrap();
        assert_eq!(a.used(3), 0);
    }

    #[test]
    fn full_table_is_an_error_until_a_process_dies() {
        let m = MemBacking::new();
        let p = Path::new("mem");
        let all: Vec<_> = (0..SLOTS)
            .map(|i| SharedUsage::register(&m, i as u64, p).unwrap())
            .collect();
        assert!(matches!(
            SharedUsage::register(&m, 999, p),
            Err(Error::Full(_))
        ));
        kill(&m, all[5].slot());
        assert_eq!(
            SharedUsage::register(&m, 999, p).unwrap().slot(),
            all[5].slot()
        );
    }
}
