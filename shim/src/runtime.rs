//! The per-process shim state: validated config, the memory ledger and the per-device
//! throttles. Built once per process (and again in a forked child) by the FFI layer.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::account::usage::{LocalUsage, Usage};
use crate::account::{shared, Ledger};
use crate::config::{self, Config, MAX_DEVICES};
use crate::limiter::Throttle;

/// How long registration waits for the accounting file's lock before refusing.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the shim refuses to let this process use CUDA.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("invalid configuration: {0}")]
    Config(#[from] config::Error),
    #[error("{0}")]
    Source(#[from] crate::source::Error),
    #[error("memory accounting unavailable: {0}")]
    Shared(#[from] shared::Error),
}

/// Everything the hooks consult.
pub struct Shim {
    pub cfg: Config,
    pub ledger: Ledger,
    /// Any device has an effective SM limit (the launch fast path reads only this).
    pub any_sm_limit: bool,
    throttles: [OnceLock<Option<Arc<Throttle>>>; MAX_DEVICES],
    /// Descriptor of the accounting file (closed in a forked child).
    pub shared_fd: Option<i32>,
}

impl Shim {
    /// Build from a validated config; opens and registers in the accounting file if one is
    /// configured and any device has a memory limit.
    pub fn build(cfg: Config, pid: u64) -> Result<Shim, InitError> {
        let limits: [Option<u64>; MAX_DEVICES] = std::array::from_fn(|i| cfg.devices[i].memory);
        let (usage, shared_fd): (Box<dyn Usage>, Option<i32>) = match &cfg.shared_cache {
            Some(path) if cfg.any_memory_limit() => {
                let u = shared::open(Path::new(path), pid, LOCK_TIMEOUT)?;
                let fd = u.backing().raw_fd();
                (Box::new(u), Some(fd))
            }
            _ => (Box::<LocalUsage>::default(), None),
        };
        let any_sm_limit = (0..MAX_DEVICES).any(|d| cfg.effective_sm_limit(d).is_some());
        Ok(Shim {
            ledger: Ledger::new(limits, usage),
            any_sm_limit,
            throttles: std::array::from_fn(|_| OnceLock::new()),
            shared_fd,
            cfg,
        })
    }

    /// The throttle of `dev`, created on first use by `start` (given the target percent,
    /// it returns the throttle after starting its watcher). `None`: no limit on `dev`.
    pub fn throttle(
        &self,
        dev: usize,
        start: impl FnOnce(u8) -> Option<Arc<Throttle>>,
    ) -> Option<&Throttle> {
        let cell = self.throttles.get(dev)?;
        cell.get_or_init(|| self.cfg.effective_sm_limit(dev).and_then(start))
            .as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_local_when_no_cache_and_throttle_only_where_limited() {
        let cfg = Config::parse(|k| match k {
            "CUDA_DEVICE_MEMORY_LIMIT_0" => Some("1g".into()),
            "CUDA_DEVICE_SM_LIMIT_1" => Some("30".into()),
            _ => None,
        })
        .unwrap();
        let shim = Shim::build(cfg, 1).unwrap();
        assert!(shim.any_sm_limit);
        assert!(shim.shared_fd.is_none());
        assert_eq!(shim.ledger.limit(0), Some(1 << 30));
        assert!(shim.throttle(0, |_| panic!("no limit on 0")).is_none());
        let t = shim
            .throttle(1, |pct| Some(Arc::new(Throttle::new(pct, 10))))
            .unwrap();
        assert_eq!(t.target_pct(), 30);
    }

    #[test]
    fn shared_cache_file_is_created_and_registered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.cache");
        let p = path.to_string_lossy().into_owned();
        let cfg = Config::parse(|k| match k {
            "CUDA_DEVICE_MEMORY_LIMIT" => Some("1g".into()),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => Some(p.clone()),
            _ => None,
        })
        .unwrap();
        let a = Shim::build(cfg.clone(), 1).unwrap();
        let b = Shim::build(cfg, 2).unwrap();
        assert!(a.shared_fd.is_some());
        let c = a.ledger.reserve(0, 600 << 20).unwrap();
        a.ledger.commit(crate::account::Kind::Ptr, 1, c);
        assert_eq!(b.ledger.used(0), 600 << 20);
        assert!(b.ledger.reserve(0, 500 << 20).is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), shared::FILE_LEN);
    }

    #[test]
    fn corrupt_cache_file_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.cache");
        std::fs::write(&path, b"HAMi-core cache of another layout").unwrap();
        let p = path.to_string_lossy().into_owned();
        let cfg = Config::parse(|k| match k {
            "CUDA_DEVICE_MEMORY_LIMIT" => Some("1g".into()),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => Some(p.clone()),
            _ => None,
        })
        .unwrap();
        let a = Shim::build(cfg, 1).unwrap();
        assert_eq!(a.ledger.used(0), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), shared::FILE_LEN);
    }

    #[test]
    fn unwritable_cache_path_fails_closed() {
        let cfg = Config::parse(|k| match k {
            "CUDA_DEVICE_MEMORY_LIMIT" => Some("1g".into()),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE" => Some("/proc/nonexistent/dir/cache".into()),
            _ => None,
        })
        .unwrap();
        let err = Shim::build(cfg, 1).err().unwrap();
        assert!(
            err.to_string().contains("/proc/nonexistent/dir/cache"),
            "{err}"
        );
    }
}
