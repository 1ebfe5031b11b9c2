//! Where the NVIDIA device nodes live on the host, for the `hostPath` of CDI device nodes.
//!
//! With the driver installed on the host, the nodes are the host's `/dev/nvidia*` and a
//! CDI device node needs only its `path`. With the driver in a container (NVIDIA's GPU
//! Operator installs it under `/run/nvidia/driver`), the nodes may sit under
//! `<driver-root>/dev` instead: the runtime must then be told the host path of each node
//! (`hostPath`, which needs `cdiVersion` 0.5.0), while the container still sees
//! `/dev/nvidia0`. The rule, as NVIDIA's own tools apply it: the driver root is the dev
//! root when it has a `dev` directory, else the nodes are in the host's `/dev`.
//!
//! Only device nodes under `/dev/` are mapped; mounts (the shim library, the vGPU
//! accounting directory) are Tessera's own host paths and stay as they are.

use std::path::Path;

use super::Spec;

/// The host directory whose `dev/` holds the NVIDIA device nodes (`/`: the host's `/dev`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevRoot(String);

impl Default for DevRoot {
    fn default() -> Self {
        Self::host()
    }
}

impl DevRoot {
    /// The host's own `/dev`.
    pub fn host() -> Self {
        Self("/".into())
    }

    /// The dev root of a driver root: the driver root itself when `<root>/dev` is a
    /// directory (as the agent sees it: mount the driver root at the same path), else `/`.
    pub fn from_driver_root(driver_root: &Path) -> Self {
        let root = driver_root.to_string_lossy();
        let root = root.trim_end_matches('/');
        if root.is_empty() || !driver_root.join("dev").is_dir() {
            return Self::host();
        }
        Self(root.to_string())
    }

    pub fn is_host(&self) -> bool {
        self.0 == "/"
    }

    /// `/` or the driver root.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host path of a node the container sees at `path` (`None`: the same path, or
    /// not a device node under `/dev/`).
    pub fn host_path(&self, path: &str) -> Option<String> {
        (!self.is_host() && path.starts_with("/dev/")).then(|| format!("{}{path}", self.0))
    }

    /// Where the MIG capability nodes are on the host (`<root>/dev/nvidia-caps`).
    pub fn caps_dir(&self) -> String {
        match self.is_host() {
            true => "/dev/nvidia-caps".into(),
            false => format!("{}/dev/nvidia-caps", self.0),
        }
    }
}

/// Give every device node of `spec` without a `hostPath` the one `root` implies.
pub fn map_device_nodes(spec: &mut Spec, root: &DevRoot) {
    let edits = std::iter::once(&mut spec.container_edits)
        .chain(spec.devices.iter_mut().map(|d| &mut d.container_edits));
    for e in edits {
        for n in &mut e.device_nodes {
            if n.host_path.is_none() {
                n.host_path = root.host_path(&n.path);
            }
        }
    }
}

/// [`map_device_nodes`], then `cdiVersion` set to the minimum the spec's fields need.
pub fn with_host_dev(mut spec: Spec, root: &DevRoot) -> Spec {
    map_device_nodes(&mut spec, root);
    super::with_minimum_version(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::{node_spec_with, ContainerEdits, Mount};
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;

    #[test]
    fn the_driver_root_is_the_dev_root_only_with_a_dev_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run/nvidia/driver");
        std::fs::create_dir_all(&root).unwrap();
        assert!(DevRoot::from_driver_root(&root).is_host(), "no dev/ yet");
        std::fs::create_dir_all(root.join("dev")).unwrap();
        let with_slash = format!("{}/", root.display());
        for given in [root.display().to_string(), with_slash] {
            let d = DevRoot::from_driver_root(Path::new(&given));
            assert_eq!(d.as_str(), root.display().to_string());
        }
        assert!(DevRoot::from_driver_root(Path::new("/")).is_host());
        assert!(DevRoot::from_driver_root(Path::new("")).is_host());
    }

    #[test]
    fn device_nodes_map_and_mounts_do_not() {
        let r = DevRoot("/run/nvidia/driver".into());
        assert_eq!(
            r.host_path("/dev/nvidia0").as_deref(),
            Some("/run/nvidia/driver/dev/nvidia0")
        );
        assert_eq!(r.host_path("/proc/x"), None);
        assert_eq!(DevRoot::host().host_path("/dev/nvidia0"), None);
        assert_eq!(r.caps_dir(), "/run/nvidia/driver/dev/nvidia-caps");
        assert_eq!(DevRoot::host().caps_dir(), "/dev/nvidia-caps");

        let inv = FakeBackend::from_spec("2xL4").unwrap().inventory().unwrap();
        let mut spec = node_spec_with(&inv, "/dev", None);
        assert_eq!(spec.cdi_version, "0.3.0");
        spec.container_edits.mounts.push(Mount {
            host_path: "/var/lib/tessera/lib/libtessera_cuda.so".into(),
            container_path: "/usr/local/tessera/lib/libtessera_cuda.so".into(),
            options: vec!["ro".into(), "bind".into()],
        });
        let mapped = with_host_dev(spec.clone(), &r);
        assert_eq!(mapped.cdi_version, "0.5.0", "hostPath needs 0.5.0");
        let all = |s: &Spec| -> Vec<ContainerEdits> {
            std::iter::once(s.container_edits.clone())
                .chain(s.devices.iter().map(|d| d.container_edits.clone()))
                .collect()
        };
        for e in all(&mapped) {
            for n in &e.device_nodes {
                assert_eq!(
                    n.host_path.as_deref(),
                    Some(&*format!("/run/nvidia/driver{}", n.path))
                );
            }
        }
        assert_eq!(mapped.container_edits.mounts, spec.container_edits.mounts);
        // The host's /dev: nothing to add, the base version stays.
        assert_eq!(with_host_dev(spec.clone(), &DevRoot::host()), spec);
    }
}
