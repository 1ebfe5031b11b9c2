//! MIG capability device nodes: which `/dev/nvidia-caps/nvidia-cap<minor>` a container
//! needs to open a MIG device's GPU instance and compute instance.
//!
//! A process given a MIG device needs, besides the parent GPU's `/dev/nvidia<minor>`, the
//! access nodes of the device's GPU instance (`gpu<G>/gi<I>/access`) and compute instance
//! (`gpu<G>/gi<I>/ci<C>/access`), where `G` is the parent GPU's minor number. The driver
//! publishes the capability → minor table in `/proc/driver/nvidia-caps/mig-minors` (one
//! `<name> <minor>` per line; `config` and `monitor` lines too) and registers the char
//! device major `nvidia-caps` in `/proc/devices`. The table is static for a driver load:
//! it lists every possible GI/CI of every GPU, so it can be read before an instance exists.
//!
//! Parsing is pure ([`parse_mig_minors`], [`parse_caps_major`]); [`MigCaps::load`] reads
//! the two files from configurable paths ([`MigCapsPaths`]) so tests use a temp dir.
//! Device nodes carry `type`/`major`/`minor` so a runtime can create them in the container
//! even on a fresh node where the host's `/dev/nvidia-caps` nodes do not exist yet (those
//! fields are in every CDI version, so they never raise the spec's `cdiVersion`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::DeviceNode;

/// Where the container sees the capability nodes.
pub const CONTAINER_CAPS_DIR: &str = "/dev/nvidia-caps";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{path} line {line}: {reason}")]
    Parse {
        path: String,
        line: usize,
        reason: String,
    },
    #[error(
        "cannot read {path}: {reason} (MIG devices need the NVIDIA driver's capability table)"
    )]
    Read { path: String, reason: String },
    #[error("{path} has no `nvidia-caps` character device")]
    NoMajor { path: String },
    #[error(
        "{path} has no entry {name} (GPU minor {gpu}, GPU instance {gi}, compute instance {ci})"
    )]
    Missing {
        path: String,
        name: String,
        gpu: u32,
        gi: u32,
        ci: u32,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One MIG capability name of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    /// `config`: create/destroy instances (not given to containers).
    Config,
    /// `monitor`: read all instances (not given to containers).
    Monitor,
    /// `gpu<G>/gi<I>/access`.
    GpuInstance { gpu: u32, gi: u32 },
    /// `gpu<G>/gi<I>/ci<C>/access`.
    ComputeInstance { gpu: u32, gi: u32, ci: u32 },
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Capability::Config => write!(f, "config"),
            Capability::Monitor => write!(f, "monitor"),
            Capability::GpuInstance { gpu, gi } => write!(f, "gpu{gpu}/gi{gi}/access"),
            Capability::ComputeInstance { gpu, gi, ci } => {
                write!(f, "gpu{gpu}/gi{gi}/ci{ci}/access")
            }
        }
    }
}

/// Parse a capability name (`gpu0/gi1/ci0/access`, `config`, ...).
fn parse_capability(name: &str) -> std::result::Result<Capability, String> {
    match name {
        "config" => return Ok(Capability::Config),
        "monitor" => return Ok(Capability::Monitor),
        _ => {}
    }
    let number = |part: &str, prefix: &str| -> std::result::Result<u32, String> {
        part.strip_prefix(prefix)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("expected {prefix}<number>, found {part:?} in {name:?}"))
    };
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [g, i, "access"] => Ok(Capability::GpuInstance {
            gpu: number(g, "gpu")?,
            gi: number(i, "gi")?,
        }),
        [g, i, c, "access"] => Ok(Capability::ComputeInstance {
            gpu: number(g, "gpu")?,
            gi: number(i, "gi")?,
            ci: number(c, "ci")?,
        }),
        _ => Err(format!("unknown capability {name:?}")),
    }
}

/// The parsed `mig-minors` table: capability → minor of `nvidia-cap<minor>`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigMinors {
    pub minors: BTreeMap<Capability, u32>,
}

impl MigMinors {
    pub fn get(&self, cap: Capability) -> Option<u32> {
        self.minors.get(&cap).copied()
    }
}

/// Parse the text of `mig-minors`. `path` only names the file in errors. Blank lines are
/// skipped; anything else must be `<capability> <minor>`.
pub fn parse_mig_minors(path: &str, text: &str) -> Result<MigMinors> {
    let mut out = MigMinors::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let err = |reason: String| Error::Parse {
            path: path.to_string(),
            line: i + 1,
            reason,
        };
        let mut fields = line.split_whitespace();
        let (Some(name), Some(minor), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(err(format!(
                "expected `<capability> <minor>`, found {line:?}"
            )));
        };
        let cap = parse_capability(name).map_err(err)?;
        let minor: u32 = minor
            .parse()
            .map_err(|_| err(format!("minor {minor:?} is not a number")))?;
        if out.minors.insert(cap, minor).is_some() {
            return Err(err(format!("{name} listed twice")));
        }
    }
    Ok(out)
}

/// The major number of the `nvidia-caps` character device in `/proc/devices` text.
pub fn parse_caps_major(text: &str) -> Option<u32> {
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        match line {
            "Character devices:" => in_char = true,
            "Block devices:" => in_char = false,
            _ if in_char => {
                let mut f = line.split_whitespace();
                if let (Some(major), Some("nvidia-caps")) = (f.next(), f.next()) {
                    return major.parse().ok();
                }
            }
            _ => {}
        }
    }
    None
}

/// Where the driver's capability files are (configuration, so tests use a temp dir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigCapsPaths {
    /// `/proc/driver/nvidia-caps/mig-minors`.
    pub mig_minors: PathBuf,
    /// `/proc/devices`.
    pub proc_devices: PathBuf,
    /// Where the host's `/dev/nvidia-caps` is visible to the agent (CDI `hostPath` when
    /// it is not `/dev/nvidia-caps`).
    pub host_dev_dir: String,
}

impl Default for MigCapsPaths {
    fn default() -> Self {
        Self::under(Path::new("/proc"), "/dev")
    }
}

impl MigCapsPaths {
    /// `<proc_root>/driver/nvidia-caps/mig-minors`, `<proc_root>/devices`, and the nodes
    /// under `<dev_root>/nvidia-caps`.
    pub fn under(proc_root: &Path, dev_root: &str) -> Self {
        Self {
            mig_minors: proc_root.join("driver/nvidia-caps/mig-minors"),
            proc_devices: proc_root.join("devices"),
            host_dev_dir: format!("{}/nvidia-caps", dev_root.trim_end_matches('/')),
        }
    }
}

/// The capability table and device major, ready to answer [`MigCaps::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigCaps {
    pub minors: MigMinors,
    pub major: u32,
    source: String,
    host_dev_dir: String,
}

impl MigCaps {
    /// Read both files. A missing file is an error naming it.
    pub fn load(paths: &MigCapsPaths) -> Result<Self> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| Error::Read {
                path: p.display().to_string(),
                reason: e.to_string(),
            })
        };
        let source = paths.mig_minors.display().to_string();
        let minors = parse_mig_minors(&source, &read(&paths.mig_minors)?)?;
        let major =
            parse_caps_major(&read(&paths.proc_devices)?).ok_or_else(|| Error::NoMajor {
                path: paths.proc_devices.display().to_string(),
            })?;
        Ok(Self::new(minors, major, source, &paths.host_dev_dir))
    }

    pub fn new(minors: MigMinors, major: u32, source: String, host_dev_dir: &str) -> Self {
        Self {
            minors,
            major,
            source,
            host_dev_dir: host_dev_dir.trim_end_matches('/').to_string(),
        }
    }

    /// The GPU-instance and compute-instance access nodes of the MIG device `(gi, ci)` on
    /// the GPU with minor `gpu`, in that order.
    pub fn nodes(&self, gpu: u32, gi: u32, ci: u32) -> Result<Vec<DeviceNode>> {
        [
            Capability::GpuInstance { gpu, gi },
            Capability::ComputeInstance { gpu, gi, ci },
        ]
        .into_iter()
        .map(|cap| {
            let minor = self.minors.get(cap).ok_or_else(|| Error::Missing {
                path: self.source.clone(),
                name: cap.to_string(),
                gpu,
                gi,
                ci,
            })?;
            let path = format!("{CONTAINER_CAPS_DIR}/nvidia-cap{minor}");
            let host = format!("{}/nvidia-cap{minor}", self.host_dev_dir);
            Ok(DeviceNode {
                host_path: (host != path).then_some(host),
                path,
                r#type: Some("c".into()),
                major: Some(self.major),
                minor: Some(minor),
            })
        })
        .collect()
    }
}

/// The table a driver writes for `gpus` GPUs (minors `0..gpus`): `config` 1, `monitor` 2,
/// then per GPU 15 GPU instances, each its `access` followed by its 8 compute instances
/// (so `gpu0/gi0/access` is 3 and `gpu3/gi3/ci3/access` 439). For tests and the fake
/// backend's node; a real node's table is read from the driver.
pub fn synthetic_mig_minors(gpus: u32) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    let mut minor = 3;
    for gpu in 0..gpus {
        for gi in 0..15 {
            out.push_str(&format!("gpu{gpu}/gi{gi}/access {minor}\n"));
            minor += 1;
            for ci in 0..8 {
                out.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {minor}\n"));
                minor += 1;
            }
        }
    }
    out
}

/// Write a synthetic driver table for `gpus` GPUs under `root` (as `<root>/driver/...` and
/// `<root>/devices`, with `nvidia-caps` major `major`) and return the paths, with the
/// nodes under `/dev`. For tests.
pub fn write_synthetic(root: &Path, gpus: u32, major: u32) -> std::io::Result<MigCapsPaths> {
    let paths = MigCapsPaths::under(root, "/dev");
    if let Some(dir) = paths.mig_minors.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&paths.mig_minors, synthetic_mig_minors(gpus))?;
    std::fs::write(
        &paths.proc_devices,
        format!(
            "Character devices:\n  1 mem\n195 nvidia-frontend\n{major} nvidia-caps\n\nBlock devices:\n  8 sd\n"
        ),
    )?;
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_driver_table() {
        let t = parse_mig_minors("m", &synthetic_mig_minors(8)).unwrap();
        assert_eq!(t.get(Capability::Config), Some(1));
        assert_eq!(t.get(Capability::Monitor), Some(2));
        // Values as a real driver lists them.
        for (cap, want) in [
            (Capability::GpuInstance { gpu: 0, gi: 0 }, 3),
            (
                Capability::ComputeInstance {
                    gpu: 0,
                    gi: 0,
                    ci: 0,
                },
                4,
            ),
            (
                Capability::ComputeInstance {
                    gpu: 3,
                    gi: 3,
                    ci: 3,
                },
                439,
            ),
            (
                Capability::ComputeInstance {
                    gpu: 6,
                    gi: 11,
                    ci: 7,
                },
                920,
            ),
        ] {
            assert_eq!(t.get(cap), Some(want), "{cap}");
        }
        assert_eq!(t.minors.len(), 2 + 8 * 15 * 9);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let cases = [
            (
                "config 1\ngpu0/gi1/access\n",
                2,
                "expected `<capability> <minor>`",
            ),
            ("gpu0/gi1/access x\n", 1, "not a number"),
            ("\n\ngpuX/gi1/access 3\n", 3, "expected gpu<number>"),
            ("gpu0/gi/access 3\n", 1, "expected gi<number>"),
            ("gpu0/gi1/ci1/bogus 3\n", 1, "unknown capability"),
            (
                "gpu0/gi1/access 3 4\n",
                1,
                "expected `<capability> <minor>`",
            ),
            ("gpu0/gi1/access 3\ngpu0/gi1/access 4\n", 2, "listed twice"),
            ("gpu0/gi1/access -3\n", 1, "not a number"),
        ];
        for (text, line, reason) in cases {
            let e = parse_mig_minors("/proc/x", text).unwrap_err();
            match &e {
                Error::Parse {
                    line: l, reason: r, ..
                } => {
                    assert_eq!(*l, line, "{text:?}: {e}");
                    assert!(r.contains(reason), "{text:?}: {e}");
                }
                other => panic!("{text:?}: {other}"),
            }
            assert!(e.to_string().starts_with(&format!("/proc/x line {line}:")));
        }
    }

    #[test]
    fn major_is_read_from_the_character_section() {
        let text =
            "Character devices:\n  1 mem\n508 nvidia-caps\n\nBlock devices:\n509 nvidia-caps\n";
        assert_eq!(parse_caps_major(text), Some(508));
        assert_eq!(parse_caps_major("Block devices:\n509 nvidia-caps\n"), None);
        assert_eq!(parse_caps_major("Character devices:\n195 nvidia\n"), None);
    }

    #[test]
    fn nodes_for_a_mig_device() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write_synthetic(dir.path(), 2, 508).unwrap();
        let caps = MigCaps::load(&paths).unwrap();
        let nodes = caps.nodes(1, 2, 0).unwrap();
        // gpu1 starts at 3 + 135; gi2 at +18.
        assert_eq!(nodes[0].path, "/dev/nvidia-caps/nvidia-cap156");
        assert_eq!(nodes[1].path, "/dev/nvidia-caps/nvidia-cap157");
        assert_eq!((nodes[1].major, nodes[1].minor), (Some(508), Some(157)));
        assert_eq!(nodes[1].r#type.as_deref(), Some("c"));
        assert_eq!(nodes[1].host_path, None);

        let e = caps.nodes(5, 0, 0).unwrap_err();
        assert!(e.to_string().contains("gpu5/gi0/access"), "{e}");

        let mut host = paths.clone();
        host.host_dev_dir = "/host/dev/nvidia-caps".into();
        let nodes = MigCaps::load(&host).unwrap().nodes(0, 1, 0).unwrap();
        assert_eq!(
            nodes[0].host_path.as_deref(),
            Some("/host/dev/nvidia-caps/nvidia-cap12")
        );
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let paths = MigCapsPaths::under(dir.path(), "/dev");
        let e = MigCaps::load(&paths).unwrap_err();
        assert!(e.to_string().contains("mig-minors"), "{e}");
        write_synthetic(dir.path(), 1, 508).unwrap();
        std::fs::write(&paths.proc_devices, "Character devices:\n195 nvidia\n").unwrap();
        let e = MigCaps::load(&paths).unwrap_err();
        assert!(matches!(e, Error::NoMajor { .. }), "{e}");
    }
}
