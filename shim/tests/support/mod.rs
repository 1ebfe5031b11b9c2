//! Test support: builds the fake `libcuda.so.1` / `libnvidia-ml.so.1` and the probe with
//! the system C compiler, and runs the probe under the shim with a chosen environment.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// The fake's allocation granularity.
pub const GRAN: u64 = 2 * MIB;
/// The fake's default context overhead.
pub const CTX: u64 = 300 * MIB;
/// Ways the probe reaches the driver.
pub const MODES: &[&str] = &[
    "direct",
    "dlsym",
    "rtldnext",
    "procaddr",
    "procaddr11",
    "ptsz",
];

fn fake_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake")
}

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("running cc");
    assert!(
        out.status.success(),
        "cc {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Directory holding the fake libraries and the probe (built once per test binary).
pub fn fake_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test exe");
        let name = exe
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("t")
            .to_string();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-{name}"));
        std::fs::create_dir_all(&dir).expect("create fake dir");
        let src = fake_src();
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let inc = format!("-I{}", src.display());
        cc(&[
            "-O2",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic",
            "-o",
            &d("libcuda.so.1"),
            &s("libcuda.c"),
            "-lpthread",
        ]);
        cc(&[
            "-O2",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            &d("libnvidia-ml.so.1"),
            &s("libnvml.c"),
            "-ldl",
        ]);
        let libdir = format!("-L{}", dir.display());
        cc(&[
            "-O2",
            &inc,
            "-o",
            &d("probe"),
            &s("probe.c"),
            &libdir,
            "-l:libcuda.so.1",
            "-ldl",
            "-lpthread",
        ]);
        dir
    })
}

/// The shim cargo built for this test run (`target/<profile>/deps/libtessera_cuda.so`;
/// `cargo test` does not copy it up to `target/<profile>/`).
pub fn shim_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let so = exe
        .parent()
        .map(|d| d.join("libtessera_cuda.so"))
        .expect("deps dir");
    assert!(so.exists(), "{} not built", so.display());
    so
}

/// A copy of the fake driver whose symbols carry a version (`FAKECUDA_1`), so that
/// `dlvsym` can reach them (glibc's `dlvsym` finds no unversioned symbol).
pub fn versioned_fake_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let plain = fake_dir();
        let dir = plain.with_file_name(format!(
            "{}-versioned",
            plain.file_name().and_then(|n| n.to_str()).unwrap_or("fake")
        ));
        std::fs::create_dir_all(&dir).expect("create versioned fake dir");
        let script = dir.join("fakecuda.map");
        std::fs::write(&script, "FAKECUDA_1 { global: *; };\n").expect("version script");
        let src = fake_src().join("libcuda.c");
        cc(&[
            "-O2",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic",
            &format!("-Wl,--version-script={}", script.display()),
            "-o",
            &dir.join("libcuda.so.1").to_string_lossy(),
            &src.to_string_lossy(),
            "-lpthread",
        ]);
        for f in ["libnvidia-ml.so.1", "probe"] {
            std::fs::copy(plain.join(f), dir.join(f)).expect("copy fake file");
        }
        dir
    })
}

/// A probe invocation.
pub struct Probe {
    cmd: Command,
}

impl Probe {
    /// `probe MODE COMMAND ARGS...` under the shim.
    pub fn new(mode: &str, command: &str, args: &[&str]) -> Probe {
        Probe::with_shim(&shim_path(), mode, command, args)
    }

    /// Under another build of the shim (the bench's before/after comparison).
    pub fn with_shim(so: &Path, mode: &str, command: &str, args: &[&str]) -> Probe {
        let mut p = Probe::bare(mode, command, args);
        p.cmd.env("LD_PRELOAD", so);
        p
    }

    /// Without the shim (baseline).
    pub fn bare(mode: &str, command: &str, args: &[&str]) -> Probe {
        let dir = fake_dir();
        let mut cmd = Command::new(dir.join("probe"));
        cmd.args([mode, command]).args(args);
        cmd.env_clear()
            .env("LD_LIBRARY_PATH", dir)
            .env("PATH", "/usr/bin:/bin");
        Probe { cmd }
    }

    /// Against the versioned copy of the fake driver ([`versioned_fake_dir`]).
    pub fn versioned(mut self) -> Probe {
        let dir = versioned_fake_dir();
        let mut cmd = Command::new(dir.join("probe"));
        cmd.args(self.cmd.get_args());
        cmd.env_clear();
        for (k, v) in self.cmd.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        cmd.env("LD_LIBRARY_PATH", dir);
        self.cmd = cmd;
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<std::ffi::OsStr>) -> Probe {
        self.cmd.env(k, v);
        self
    }

    pub fn run(mut self) -> Report {
        let out = self.cmd.output().expect("run probe");
        Report::from(out)
    }

    pub fn spawn(mut self) -> Child {
        self.cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn probe")
    }
}

/// Parsed `key=value` output of a probe.
#[derive(Debug)]
pub struct Report {
    pub vals: HashMap<String, String>,
    pub stdout: String,
    pub stderr: String,
    pub code: Option<i32>,
}

impl From<Output> for Report {
    fn from(out: Output) -> Report {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let vals = stdout
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Report {
            vals,
            stdout,
            stderr,
            code: out.status.code(),
        }
    }
}

impl Report {
    pub fn get(&self, k: &str) -> &str {
        self.vals.get(k).map(String::as_str).unwrap_or_else(|| {
            panic!(
                "no {k} in probe output:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    pub fn num(&self, k: &str) -> i64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}={} not a number", self.get(k)))
    }

    pub fn u(&self, k: &str) -> u64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}={} not a number", self.get(k)))
    }

    pub fn f(&self, k: &str) -> f64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k}={} not a number", self.get(k)))
    }
}

/// Read the fake GPU's (used, peak) from its state file.
pub fn fake_state(path: &Path) -> (u64, u64) {
    let b = std::fs::read(path).expect("fake state");
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    (word(0), word(1))
}

/// Read the child's stdout until a line starting with `prefix` (or panic after `secs`).
pub fn wait_line(child: &mut Child, prefix: &str, secs: u64) -> String {
    use std::io::{BufRead, BufReader};
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with(&prefix) {
                let _ = tx.send(line);
                return;
            }
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("no line starting with the prefix within {secs}s"))
}

/// SIGKILL and reap.
pub fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
