//! The DRA driver's kubelet-facing names and sockets: the plugin-watcher constants,
//! where the two sockets live, and binding one. A leaf: registration and the plugin
//! service use it, and [`super::kubelet`] serves them together.

use super::names::DRIVER;
use std::path::{Path, PathBuf};

/// `PluginInfo.type` for DRA drivers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// `PluginInfo.supported_versions`, most preferred first.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// Where the two sockets live; derived from `--kubelet-dir`, so tests use a tempdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraPaths {
    /// `<kubelet-dir>/plugins_registry/gpu.tessera.io-reg.sock`
    pub registration_socket: PathBuf,
    /// `<kubelet-dir>/plugins/gpu.tessera.io/dra.sock`
    pub plugin_socket: PathBuf,
}

impl DraPaths {
    pub fn under(kubelet_dir: &Path) -> Self {
        Self {
            registration_socket: kubelet_dir
                .join("plugins_registry")
                .join(format!("{DRIVER}-reg.sock")),
            plugin_socket: kubelet_dir.join("plugins").join(DRIVER).join("dra.sock"),
        }
    }
}

/// Errors of the DRA kubelet layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot serve on {socket}: {source}")]
    Serve {
        socket: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Remove a stale socket file, create its directory, and listen on it.
pub fn bind(socket: &Path) -> Result<tokio::net::UnixListener> {
    let serve_err = |source| Error::Serve {
        socket: socket.display().to_string(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(serve_err)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(serve_err(e)),
    }
    tokio::net::UnixListener::bind(socket).map_err(serve_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_kubelet_layout() {
        let p = DraPaths::under(Path::new("/var/lib/kubelet"));
        assert_eq!(
            p.registration_socket,
            Path::new("/var/lib/kubelet/plugins_registry/gpu.tessera.io-reg.sock")
        );
        assert_eq!(
            p.plugin_socket,
            Path::new("/var/lib/kubelet/plugins/gpu.tessera.io/dra.sock")
        );
    }
}
