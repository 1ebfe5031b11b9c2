//! Where the limits come from (docs/shim.md "Where limits come from").
//!
//! Inside a container built by the Tessera agent, the limits, the core policy and the
//! accounting file's path come from a file the agent wrote, [`LIMITS_FILE`], in a directory
//! the runtime bind-mounts read-only at [`LIMITS_DIR`]. The environment keeps the HAMi-core
//! variables (tools read them), but a value it sets can only *lower* a limit; it can never
//! raise one, lift an SM limit with `TESSERA_CORE_POLICY=disable`, or move the accounting
//! file.
//!
//! The paths are compiled in: nothing the container's environment says can point the shim
//! elsewhere. The process is "under Tessera" when [`LIMITS_DIR`] exists (the mount point:
//! neither removable nor renamable without mount privileges) **or** `/etc/ld.so.preload`
//! names this library (the agent's default preload, itself a mount point). Only when
//! neither holds — the shim preloaded by hand, outside any Tessera container — does the
//! environment alone configure it (HAMi-core's contract, kept for standalone use).
//!
//! Under Tessera a missing limits file is waited for ([`LIMITS_WAIT`]: the agent may write
//! it after answering the kubelet), then refused; an unreadable or malformed file, or one
//! on a writable mount, is refused at once (fail closed).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{self, Config, CorePolicy};

/// Mount point of the agent's per-allocation directory in the container (read-only).
pub const LIMITS_DIR: &str = "/etc/tessera";
/// The agent-written limits file in [`LIMITS_DIR`].
pub const LIMITS_FILE_NAME: &str = "limits";
/// Full path of the limits file in the container.
pub const LIMITS_FILE: &str = "/etc/tessera/limits";
/// The loader's preload list; the agent's default way of loading the shim.
pub const PRELOAD_LIST: &str = "/etc/ld.so.preload";
/// How long a process waits for a limits file that is not there yet.
pub const LIMITS_WAIT: Duration = Duration::from_secs(5);
/// The format version the agent writes (`version=1`).
pub const FORMAT_VERSION: &str = "1";
/// A limits file larger than this is malformed (a real one is a few hundred bytes).
const MAX_LEN: u64 = 64 * 1024;

/// Keys a limits file may hold (besides `version`).
const FILE_KEYS: &[&str] = &[
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "TESSERA_CORE_POLICY",
];

/// Why the limits cannot be established (the shim then refuses CUDA).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Env(#[source] config::Error),
    #[error(
        "limits file {path} is missing after {waited_ms} ms (this container is under Tessera: \
         {why}; the agent writes the file when the container is allocated)"
    )]
    Missing {
        path: String,
        waited_ms: u128,
        why: &'static str,
    },
    #[error("limits file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "limits file {path} is not on a read-only mount; refusing limits a process could rewrite"
    )]
    Writable { path: String },
    #[error("limits file {path}, line {line}: {reason}")]
    Malformed {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("limits file {path}: {source}")]
    Value {
        path: String,
        #[source]
        source: config::Error,
    },
}

/// Where the configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The agent's limits file (environment may only lower).
    File(PathBuf),
    /// No Tessera mount and no Tessera preload list: the environment alone.
    Environment,
}

/// The outcome of [`load`]: the effective config and what the environment tried that was
/// not honoured (logged as warnings).
#[derive(Debug)]
pub struct Loaded {
    pub cfg: Config,
    pub origin: Origin,
    pub ignored: Vec<String>,
}

/// What the loader reads from the system; production uses [`System`], tests a temporary
/// root.
pub trait Fs {
    /// Whether `path` exists (without following a final symlink).
    fn exists(&self, path: &Path) -> bool;
    /// Read at most `max` bytes of `path`.
    fn read(&self, path: &Path, max: u64) -> std::io::Result<Vec<u8>>;
    /// Whether `path` is on a read-only mount.
    fn read_only(&self, path: &Path) -> std::io::Result<bool>;
}

/// The real filesystem under `root` (`/` in production). `read_only` is the caller's
/// `statvfs` check (the only unsafe part, kept in `ffi`).
pub struct System<F: Fn(&Path) -> std::io::Result<bool>> {
    pub root: PathBuf,
    pub read_only: F,
}

impl<F: Fn(&Path) -> std::io::Result<bool>> System<F> {
    fn at(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }
}

impl<F: Fn(&Path) -> std::io::Result<bool>> Fs for System<F> {
    fn exists(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(self.at(path)).is_ok()
    }

    fn read(&self, path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        std::fs::File::open(self.at(path))?
            .take(max + 1)
            .read_to_end(&mut buf)?;
        Ok(buf)
    }

    fn read_only(&self, path: &Path) -> std::io::Result<bool> {
        (self.read_only)(&self.at(path))
    }
}

/// Why this process is under Tessera, or `None` (standalone).
pub fn under_tessera(fs: &impl Fs) -> Option<&'static str> {
    if fs.exists(Path::new(LIMITS_DIR)) {
        return Some("/etc/tessera exists");
    }
    let listed = fs
        .read(Path::new(PRELOAD_LIST), MAX_LEN)
        .map(|b| String::from_utf8_lossy(&b).contains("libtessera_cuda"))
        .unwrap_or(false);
    listed.then_some("/etc/ld.so.preload names libtessera_cuda")
}

/// Establish the configuration: the limits file merged with the environment (`env` reads
/// a variable, `env_names` lists the environment's names), waiting up to `wait` for a
/// file that is not there yet.
pub fn load(
    fs: &impl Fs,
    env: impl Fn(&str) -> Option<String>,
    env_names: &[String],
    wait: Duration,
) -> Result<Loaded, Error> {
    let from_env = Config::parse(&env)
        .and_then(|c| {
            Config::check_indices(env_names.iter().map(String::as_str))?;
            Ok(c)
        })
        .map_err(Error::Env)?;
    let Some(why) = under_tessera(fs) else {
        return Ok(Loaded {
            cfg: from_env,
            origin: Origin::Environment,
            ignored: Vec::new(),
        });
    };
    let path = Path::new(LIMITS_FILE);
    let shown = LIMITS_FILE.to_string();
    let start = Instant::now();
    let bytes = loop {
        match fs.read(path, MAX_LEN) {
            Ok(b) => break b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if start.elapsed() >= wait {
                    return Err(Error::Missing {
                        path: shown,
                        waited_ms: start.elapsed().as_millis(),
                        why,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(source) => {
                return Err(Error::Io {
                    path: shown,
                    source,
                })
            }
        }
    };
    match fs.read_only(path) {
        Ok(true) => {}
        Ok(false) => return Err(Error::Writable { path: shown }),
        Err(source) => {
            return Err(Error::Io {
                path: shown,
                source,
            })
        }
    }
    let file = parse_file(&shown, &bytes)?;
    let (cfg, ignored) = merge(file, from_env);
    Ok(Loaded {
        cfg,
        origin: Origin::File(path.to_path_buf()),
        ignored,
    })
}

/// Parse the agent's limits file: `KEY=VALUE` lines (`#` comments, blank lines), a
/// `version=1` line, only the HAMi-core limit keys and `TESSERA_CORE_POLICY`.
pub fn parse_file(path: &str, bytes: &[u8]) -> Result<Config, Error> {
    let bad = |line: usize, reason: String| Error::Malformed {
        path: path.to_string(),
        line,
        reason,
    };
    if bytes.len() as u64 > MAX_LEN {
        return Err(bad(0, format!("larger than {MAX_LEN} bytes")));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| bad(0, "not UTF-8".into()))?;
    let mut map: HashMap<String, String> = HashMap::new();
    let mut version = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| bad(n + 1, "expected KEY=VALUE".into()))?;
        let (k, v) = (k.trim(), v.trim());
        if k == "version" {
            version = Some(v.to_string());
            continue;
        }
        let known = FILE_KEYS.contains(&k)
            || k.starts_with("CUDA_DEVICE_MEMORY_LIMIT_")
            || k.starts_with("CUDA_DEVICE_SM_LIMIT_");
        if !known {
            return Err(bad(n + 1, format!("unknown key {k:?}")));
        }
        if map.insert(k.to_string(), v.to_string()).is_some() {
            return Err(bad(n + 1, format!("{k} given twice")));
        }
    }
    match version.as_deref() {
        Some(FORMAT_VERSION) => {}
        Some(v) => {
            return Err(bad(
                0,
                format!("version {v:?}, this shim reads {FORMAT_VERSION}"),
            ))
        }
        None => return Err(bad(0, "no version line".into())),
    }
    let value = |source| Error::Value {
        path: path.to_string(),
        source,
    };
    Config::check_indices(map.keys().map(String::as_str)).map_err(value)?;
    Config::parse(|k| map.get(k).cloned()).map_err(value)
}

fn min_opt<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

/// The file's config with the environment applied where it only lowers a limit.
pub fn merge(file: Config, env: Config) -> (Config, Vec<String>) {
    let mut ignored = Vec::new();
    let mut out = file.clone();
    for (i, (o, e)) in out.devices.iter_mut().zip(env.devices.iter()).enumerate() {
        o.memory = min_opt(o.memory, e.memory);
        o.sm_percent = min_opt(o.sm_percent, e.sm_percent);
        if e.memory.is_some() && o.memory != e.memory {
            ignored.push(format!(
                "device {i}: the environment's memory limit is above the agent's; the agent's applies"
            ));
        }
        if e.sm_percent.is_some() && o.sm_percent != e.sm_percent {
            ignored.push(format!(
                "device {i}: the environment's SM limit is above the agent's; the agent's applies"
            ));
        }
    }
    out.core_policy = match (file.core_policy, env.core_policy) {
        // The environment may switch throttling on (`force`), never off.
        (CorePolicy::Disable, CorePolicy::Force) => CorePolicy::Force,
        (CorePolicy::Disable, _) => CorePolicy::Disable,
        (p, CorePolicy::Disable) => {
            ignored.push("TESSERA_CORE_POLICY=disable from the environment is ignored: the agent's limits file sets the policy".into());
            p
        }
        (p, _) => p,
    };
    if env.shared_cache.is_some() && env.shared_cache != file.shared_cache {
        ignored.push(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE from the environment is ignored: the agent's limits file names the accounting file"
                .into(),
        );
    }
    out.shared_cache = file.shared_cache;
    out.log_level = env.log_level;
    (out, ignored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const GIB: u64 = 1 << 30;

    struct Mem {
        files: HashMap<&'static str, Vec<u8>>,
        dir: bool,
        ro: bool,
        /// The limits file appears after this many reads.
        appears_after: Cell<u32>,
    }

    impl Mem {
        fn new(limits: Option<&str>) -> Mem {
            let mut files = HashMap::new();
            if let Some(l) = limits {
                files.insert(LIMITS_FILE, l.as_bytes().to_vec());
            }
            Mem {
                files,
                dir: true,
                ro: true,
                appears_after: Cell::new(0),
            }
        }
    }

    impl Fs for Mem {
        fn exists(&self, path: &Path) -> bool {
            path == Path::new(LIMITS_DIR) && self.dir
        }
        fn read(&self, path: &Path, _max: u64) -> std::io::Result<Vec<u8>> {
            let key = path.to_str().unwrap_or_default();
            if key == LIMITS_FILE && self.appears_after.get() > 0 {
                self.appears_after.set(self.appears_after.get() - 1);
                return Err(std::io::ErrorKind::NotFound.into());
            }
            self.files
                .get(key)
                .cloned()
                .ok_or_else(|| std::io::ErrorKind::NotFound.into())
        }
        fn read_only(&self, _: &Path) -> std::io::Result<bool> {
            Ok(self.ro)
        }
    }

    const FILE: &str = "# written by tessera node\nversion=1\nCUDA_DEVICE_MEMORY_LIMIT_0=16384m\n\
                        CUDA_DEVICE_SM_LIMIT_0=25\n\
                        CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/run/tessera/cuda.cache\n\
                        TESSERA_CORE_POLICY=default\n";

    fn load_with(fs: &Mem, env: &[(&str, &str)]) -> Result<Loaded, Error> {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let names: Vec<String> = map.keys().cloned().collect();
        load(
            fs,
            |k| map.get(k).cloned(),
            &names,
            Duration::from_millis(300),
        )
    }

    #[test]
    fn the_environment_can_lower_but_never_raise() {
        let fs = Mem::new(Some(FILE));
        let l = load_with(
            &fs,
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "70g"),
                ("CUDA_DEVICE_SM_LIMIT_0", "100"),
                ("TESSERA_CORE_POLICY", "disable"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine"),
            ],
        )
        .unwrap();
        assert_eq!(l.origin, Origin::File(PathBuf::from(LIMITS_FILE)));
        assert_eq!(l.cfg.devices[0].memory, Some(16 * GIB));
        assert_eq!(l.cfg.effective_sm_limit(0), Some(25));
        assert_eq!(
            l.cfg.shared_cache.as_deref(),
            Some(Path::new("/var/run/tessera/cuda.cache"))
        );
        assert_eq!(l.ignored.len(), 3, "{:?}", l.ignored);

        let l = load_with(
            &fs,
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "4g"),
                ("CUDA_DEVICE_SM_LIMIT_0", "10"),
            ],
        )
        .unwrap();
        assert_eq!(l.cfg.devices[0].memory, Some(4 * GIB));
        assert_eq!(l.cfg.effective_sm_limit(0), Some(10));
        // Unsetting the accounting variable changes nothing.
        let l = load_with(&fs, &[]).unwrap();
        assert!(l.cfg.shared_cache.is_some());
        // A device the file leaves unlimited may be limited by the environment.
        let l = load_with(&fs, &[("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")]).unwrap();
        assert_eq!(l.cfg.devices[1].memory, Some(GIB));
    }

    #[test]
    fn a_missing_file_is_waited_for_then_refused() {
        let fs = Mem::new(None);
        let e = load_with(&fs, &[]).unwrap_err();
        assert!(e.to_string().contains("missing after"), "{e}");
        let fs = Mem::new(Some(FILE));
        fs.appears_after.set(3);
        assert!(load_with(&fs, &[]).is_ok(), "a file written late is read");
    }

    #[test]
    fn standalone_only_without_the_mount_and_the_preload_list() {
        let mut fs = Mem::new(None);
        fs.dir = false;
        let l = load_with(&fs, &[("CUDA_DEVICE_MEMORY_LIMIT_0", "70g")]).unwrap();
        assert_eq!(l.origin, Origin::Environment);
        assert_eq!(l.cfg.devices[0].memory, Some(70 * GIB));
        // The mount gone (renamed parent) but the preload list still names the shim.
        fs.files.insert(
            PRELOAD_LIST,
            b"/usr/local/tessera/lib/libtessera_cuda.so\n".to_vec(),
        );
        let e = load_with(&fs, &[]).unwrap_err();
        assert!(e.to_string().contains("ld.so.preload"), "{e}");
    }

    #[test]
    fn bad_files_and_writable_mounts_fail_closed() {
        let cases = [
            ("CUDA_DEVICE_MEMORY_LIMIT_0=1g\n", "no version"),
            ("version=2\n", "version"),
            ("version=1\nCUDA_DEVICE_MEMORY_LIMIT_0=ten\n", "not a size"),
            ("version=1\nLD_PRELOAD=x\n", "unknown key"),
            ("version=1\nTESSERA_LOG=debug\n", "unknown key"),
            ("version=1\nCUDA_DEVICE_SM_LIMIT_0\n", "KEY=VALUE"),
            ("version=1\nCUDA_DEVICE_MEMORY_LIMIT_16=1g\n", "16"),
            (
                "version=1\nCUDA_DEVICE_MEMORY_LIMIT_0=1g\nCUDA_DEVICE_MEMORY_LIMIT_0=2g\n",
                "twice",
            ),
        ];
        for (text, want) in cases {
            let e = load_with(&Mem::new(Some(text)), &[]).unwrap_err();
            assert!(e.to_string().contains(want), "{text:?}: {e}");
            assert!(e.to_string().contains(LIMITS_FILE), "{e}");
        }
        let mut fs = Mem::new(Some(FILE));
        fs.ro = false;
        let e = load_with(&fs, &[]).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        // A malformed environment still fails closed under Tessera.
        let e = load_with(
            &Mem::new(Some(FILE)),
            &[("CUDA_DEVICE_MEMORY_LIMIT_0", "10 gigs")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_0"), "{e}");
    }

    #[test]
    fn file_disable_policy_can_be_tightened_by_the_environment() {
        let text = "version=1\nCUDA_DEVICE_SM_LIMIT=30\nTESSERA_CORE_POLICY=disable\n";
        let l = load_with(&Mem::new(Some(text)), &[]).unwrap();
        assert_eq!(l.cfg.effective_sm_limit(0), None);
        let l = load_with(&Mem::new(Some(text)), &[("TESSERA_CORE_POLICY", "force")]).unwrap();
        assert_eq!(l.cfg.effective_sm_limit(0), Some(30));
    }
}
