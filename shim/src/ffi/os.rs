//! Safe wrappers over the OS calls the accounting file needs: `flock`, open-file-description
//! byte locks, `mmap`. The only place outside the hooks that calls libc directly.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// The accounting file, opened read-write and close-on-exec.
pub struct AccountFile {
    file: File,
}

impl AccountFile {
    /// Open or create `path`, mode 0600: only processes of the uid that created it (the
    /// container's processes) may open it; see docs/security.md.
    pub fn open(path: &Path) -> io::Result<AccountFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        Ok(AccountFile { file })
    }

    /// Create `path`, truncating any leftover.
    pub fn create_truncate(path: &Path) -> io::Result<AccountFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        Ok(AccountFile { file })
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    pub fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    /// Does `path` still name the file we have open?
    pub fn same_inode_as(&self, path: &Path) -> io::Result<bool> {
        let ours = self.file.metadata()?;
        match std::fs::metadata(path) {
            Ok(theirs) => Ok(ours.ino() == theirs.ino() && ours.dev() == theirs.dev()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Exclusive `flock`, polling until `timeout` (`TimedOut` then). The kernel drops the
    /// lock when the holder dies, so this never waits on a dead process.
    pub fn lock_exclusive(&self, timeout: Duration) -> io::Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            // SAFETY: flock on a descriptor we own.
            let rc = unsafe { libc::flock(self.raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => {}
                _ => return Err(err),
            }
            if start.elapsed() >= timeout {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "flock timed out"));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    pub fn unlock(&self) {
        // SAFETY: flock on a descriptor we own.
        unsafe { libc::flock(self.raw_fd(), libc::LOCK_UN) };
    }

    fn byte_lock(&self, offset: u64, kind: libc::c_short) -> io::Result<bool> {
        let fl = libc::flock {
            l_type: kind,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: offset as libc::off_t,
            l_len: 1,
            l_pid: 0,
        };
        // SAFETY: F_OFD_SETLK with a valid, initialised struct flock.
        let rc = unsafe { libc::fcntl(self.raw_fd(), libc::F_OFD_SETLK, &fl) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
            _ => Err(err),
        }
    }

    /// Try to take the open-file-description write lock on one byte. `Ok(false)`: another
    /// open file description (a live process) holds it.
    pub fn try_lock_byte(&self, offset: u64) -> io::Result<bool> {
        self.byte_lock(offset, libc::F_WRLCK as libc::c_short)
    }

    pub fn unlock_byte(&self, offset: u64) {
        let _ = self.byte_lock(offset, libc::F_UNLCK as libc::c_short);
    }

    /// Map the first `len` bytes shared.
    pub fn map(&self, len: u64) -> io::Result<Mapping> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        // SAFETY: a fresh shared mapping of a file we hold open; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

/// A shared mapping viewed as 64-bit atomics.
pub struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only accessed through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: mmap returns page-aligned memory valid for `len` bytes until munmap in
        // Drop; AtomicU64 has the layout of u64 and all access is atomic.
        unsafe { std::slice::from_raw_parts(self.ptr as *const AtomicU64, self.len / 8) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what map() mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Close a descriptor (used in a forked child; async-signal-safe).
pub fn close_fd(fd: i32) {
    // SAFETY: closing a descriptor number; at worst EBADF.
    unsafe { libc::close(fd) };
}

/// Register `child` to run in the child after `fork`.
pub fn at_fork_child(child: extern "C" fn()) {
    // SAFETY: registering a plain function pointer.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// Whether `path` lies on a read-only mount (`statvfs` `ST_RDONLY`).
pub fn is_read_only(path: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: statvfs on a NUL-terminated path into a zeroed, owned struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_flag & libc::ST_RDONLY != 0)
}
