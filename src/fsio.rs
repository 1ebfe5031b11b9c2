//! Files the agent writes as root, replaced safely.
//!
//! Every file the node agent writes (the node's and each claim's CDI spec, the DRA
//! checkpoint snapshot and log, the split record) goes through [`Replace`]: the bytes go
//! to a new temporary file with a random name in the target's directory, created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` (an existing file or symlink under that name is never
//! opened, so a symlink planted there cannot redirect the write), then the file is
//! fsynced, renamed over the target, and the directory fsynced. `rename(2)` replaces a
//! symlink at the target with the new file instead of writing through it, so neither the
//! temporary name nor the target name can be used to make the agent overwrite another
//! file. A crash leaves either the old file or the new one, never half of one.
//!
//! Temporary files are named `.<stem>.<random>.<ext>.tmp` (`.<name>.<random>.tmp` for a
//! name without an extension): they start with a dot and end in `.tmp`, so CDI consumers,
//! which read `*.json` and `*.yaml`, never see them; [`remove_stale_temps`] removes the
//! ones a crash left.
//!
//! Files opened in place (the checkpoint log, its lock file) are opened with
//! [`no_follow`].

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How a file is replaced: its mode and what is synced. [`Replace::durable`] is what a
/// write must use unless losing it in a power loss is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replace {
    /// Permission bits of the new file (set exactly: the umask does not apply).
    pub mode: u32,
    /// `fsync` the new file before the rename.
    pub sync_file: bool,
    /// `fsync` the directory after the rename (the rename itself survives a power loss).
    pub sync_dir: bool,
}

impl Replace {
    /// Fsync the file and the directory.
    pub const fn durable(mode: u32) -> Self {
        Self {
            mode,
            sync_file: true,
            sync_dir: true,
        }
    }

    /// Replace `path` with `bytes` (creating its directory when missing). Returns the new
    /// file, open for reading and writing.
    pub fn write(&self, path: &Path, bytes: &[u8]) -> std::io::Result<File> {
        self.write_with(path, |f| f.write_all(bytes))
    }

    /// Replace `path` with what `fill` writes into the (empty) new file.
    pub fn write_with(
        &self,
        path: &Path,
        fill: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> std::io::Result<File> {
        let (dir, stem, ext) = split(path)?;
        std::fs::create_dir_all(&dir)?;
        let prefix = format!(".{stem}.");
        let suffix = temp_suffix(ext);
        let mode = self.mode;
        let mut tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(&suffix)
            .make_in(&dir, |p| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                    .open(p)
            })?;
        // On any error below the temporary file is removed when `tmp` drops.
        // The exact mode, whatever the umask.
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
        fill(tmp.as_file_mut())?;
        if self.sync_file {
            tmp.as_file().sync_all()?;
        }
        let file = tmp.persist(path).map_err(|e| e.error)?;
        if self.sync_dir {
            sync_dir(&dir)?;
        }
        Ok(file)
    }
}

/// `fsync` a directory (after a rename or a create in it).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `options` with `O_NOFOLLOW`: opening a symlink fails (`ELOOP`) instead of opening
/// what it points at.
pub fn no_follow(options: &mut OpenOptions) -> &mut OpenOptions {
    options.custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
}

/// Remove the temporary files a crashed [`Replace`] of `path` left (the ones it names;
/// nothing else in the directory). Only for a target no other write is in progress to.
/// Returns how many were removed.
pub fn remove_stale_temps(path: &Path) -> std::io::Result<usize> {
    let (dir, stem, ext) = split(path)?;
    let prefix = format!(".{stem}.");
    let suffix = temp_suffix(ext);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_ours = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(&suffix))
            .is_some_and(|random| {
                !random.is_empty() && random.chars().all(|c| c.is_ascii_alphanumeric())
            });
        if is_ours {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

fn temp_suffix(ext: Option<&str>) -> String {
    match ext {
        Some(ext) => format!(".{ext}.tmp"),
        None => ".tmp".to_string(),
    }
}

/// The directory, stem and extension of `path`.
fn split(path: &Path) -> std::io::Result<(PathBuf, &str, Option<&str>)> {
    let invalid = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a file path", path.display()),
        )
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(invalid)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && !ext.is_empty() => (dir, stem, Some(ext)),
        _ => (dir, name, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/spec.json");
        Replace::durable(0o644).write(&path, b"one").unwrap();
        Replace::durable(0o644).write(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(names(&dir.path().join("sub")), vec!["spec.json"]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "mode {mode:o}");
        Replace::durable(0o600).write(&path, b"three").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
    }

    #[test]
    fn symlinks_at_the_old_temp_name_and_at_the_target_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let cdi = dir.path().join("cdi");
        std::fs::create_dir(&cdi).unwrap();
        // The fixed temporary names earlier releases used, and the target itself.
        for planted in [".spec.json.tmp", "spec.json.tmp", "spec.json"] {
            std::os::unix::fs::symlink(&victim, cdi.join(planted)).unwrap();
        }
        let target = cdi.join("spec.json");
        Replace::durable(0o644).write(&target, b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert!(
            !std::fs::symlink_metadata(&target).unwrap().is_symlink(),
            "the symlink at the target was replaced, not written through"
        );
        // The planted temp-name links are left alone (not ours to remove).
        assert!(std::fs::symlink_metadata(cdi.join(".spec.json.tmp"))
            .unwrap()
            .is_symlink());
    }

    #[test]
    fn a_failed_fill_leaves_the_target_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        std::fs::write(&path, b"old").unwrap();
        let err = Replace::durable(0o600)
            .write_with(&path, |f| {
                f.write_all(b"half")?;
                Err(std::io::Error::other("disk full"))
            })
            .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), vec!["record.json"]);
    }

    #[test]
    fn stale_temporary_files_of_the_target_only_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for n in [
            ".checkpoint.Ab12Cd.json.tmp",
            ".checkpoint.json.tmp",
            ".other.Ab12Cd.json.tmp",
            "checkpoint.json",
            ".lock.XyZ123.tmp",
        ] {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        let removed = remove_stale_temps(&dir.path().join("checkpoint.json")).unwrap();
        assert_eq!(removed, 1);
        assert_eq!(remove_stale_temps(&dir.path().join("lock")).unwrap(), 1);
        assert_eq!(
            names(dir.path()),
            vec![
                ".checkpoint.json.tmp",
                ".other.Ab12Cd.json.tmp",
                "checkpoint.json"
            ]
        );
    }

    #[test]
    fn no_follow_refuses_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("checkpoint.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = no_follow(OpenOptions::new().read(true).write(true))
            .open(&link)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ELOOP));
    }
}
