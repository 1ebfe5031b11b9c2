//! The webhook's serving certificate, reloaded when its files change: cert-manager (or
//! the kubelet updating the mounted Secret) rotates `tls.crt` / `tls.key` in place, and
//! new TLS handshakes get the new pair without the listener or open connections being
//! dropped.
//!
//! ```text
//! poll every interval: read tls.crt + tls.key ─changed?─► parse, check key matches cert
//!                                                         ├─ ok:  swap the CertifiedKey
//!                                                         └─ bad: keep the old pair, warn
//! handshake ─► CertResolver::resolve ─► current CertifiedKey
//! ```
//! The files are read whole (a few kB) rather than compared by mtime, so the Secret
//! volume's symlink swap and editors that keep mtimes are both seen.
//!
//! With `--cert-mode=self` the pair comes from memory instead ([`super::certs`]
//! generates and rotates it and calls [`CertResolver::set`]); a resolver with no pair
//! yet refuses handshakes and [`CertResolver::is_ready`] is false (the readiness probe).

use super::error::{Error, Result};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain and key, checking that the key belongs to the chain's
/// first certificate. `what` names the files in errors.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8], what: &str) -> Result<CertifiedKey> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Tls(format!("{what}: certificate: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{what}: no certificate")));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| Error::Tls(format!("{what}: key: {e}")))?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|e| Error::Tls(format!("{what}: {e}")))
}

/// Serves whatever pair was set last (none yet: handshakes fail).
#[derive(Debug, Default)]
pub struct CertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().and_then(|k| k.clone())
    }
}

impl CertResolver {
    /// A resolver serving nothing until [`Self::set`].
    pub fn empty() -> Arc<CertResolver> {
        Arc::new(CertResolver::default())
    }

    /// Serves `pair` to the handshakes from now on.
    pub fn set(&self, pair: CertifiedKey) {
        if let Ok(mut current) = self.current.write() {
            *current = Some(Arc::new(pair));
        }
    }

    /// Whether a pair is being served.
    pub fn is_ready(&self) -> bool {
        self.current.read().is_ok_and(|k| k.is_some())
    }

    /// The leaf certificate served now (DER).
    pub fn leaf(&self) -> Option<Vec<u8>> {
        let current = self.current.read().ok()?;
        Some(current.as_ref()?.cert.first()?.to_vec())
    }

    /// A rustls server configuration that always presents the current pair.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>> {
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        Ok(Arc::new(config))
    }
}

/// The certificate and key files and the pair last loaded from them.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    resolver: Arc<CertResolver>,
    /// The file contents last loaded (or last refused), to skip unchanged files.
    seen: (Vec<u8>, Vec<u8>),
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))
}

impl ReloadingCert {
    /// Loads the pair now (an error names the file).
    pub fn load(cert: &Path, key: &Path) -> Result<Self> {
        let (c, k) = (read(cert)?, read(key)?);
        let what = format!("{} / {}", cert.display(), key.display());
        let pair = certified_key(&c, &k, &what)?;
        let resolver = CertResolver::empty();
        resolver.set(pair);
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            resolver,
            seen: (c, k),
        })
    }

    /// A rustls server configuration that always presents the current pair.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        self.resolver.server_config()
    }

    /// The resolver serving the pair (shared with the readiness probe).
    pub fn resolver(&self) -> Arc<CertResolver> {
        self.resolver.clone()
    }

    /// Re-reads the files; swaps the served pair when they changed and are valid.
    /// Returns whether a new pair is served. A bad pair (half-written rotation, key of
    /// another certificate) keeps the old one and is retried when the files change again.
    pub fn reload(&mut self) -> Result<bool> {
        let (c, k) = (read(&self.cert)?, read(&self.key)?);
        if (&c, &k) == (&self.seen.0, &self.seen.1) {
            return Ok(false);
        }
        let what = format!("{} / {}", self.cert.display(), self.key.display());
        let result = certified_key(&c, &k, &what);
        self.seen = (c, k);
        self.resolver.set(result?);
        Ok(true)
    }

    /// Polls the files every `interval` until `shutdown`.
    pub async fn watch(mut self, interval: Duration, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            match self.reload() {
                Ok(true) => {
                    tracing::info!(cert = %self.cert.display(), "webhook certificate reloaded")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "webhook certificate not reloaded; still serving the previous one")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = "tests/data/webhook";

    #[test]
    fn reload_swaps_only_a_valid_changed_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let copy = |from: &str, to: &Path| std::fs::copy(Path::new(DIR).join(from), to).unwrap();
        copy("tls.crt", &cert);
        copy("tls.key", &key);
        let mut r = ReloadingCert::load(&cert, &key).unwrap();
        let served = |r: &ReloadingCert| r.resolver.leaf().unwrap();
        let first = served(&r);
        assert!(!r.reload().unwrap(), "unchanged files");
        // Half a rotation: the new certificate with the old key is refused.
        copy("rotated/tls.crt", &cert);
        let err = r.reload().unwrap_err().to_string();
        assert!(err.contains("tls.crt"), "{err}");
        assert_eq!(served(&r), first, "still the old pair");
        copy("rotated/tls.key", &key);
        assert!(r.reload().unwrap());
        assert_ne!(served(&r), first);
        std::fs::remove_file(&key).unwrap();
        assert!(
            r.reload().is_err(),
            "a missing file is an error, the pair stays"
        );
        assert_ne!(served(&r), first);
    }
}
