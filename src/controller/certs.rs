//! The webhook's own certificate (`--cert-mode=self`, the default): a fresh
//! `kubectl apply -k daemonset/` needs nothing else. As Kueue's cert-controller does,
//! the controller keeps a self-signed CA and a serving certificate for the webhook
//! Service's DNS names in one Secret, serves the pair from memory, rotates it before it
//! expires, and writes the CA into the MutatingWebhookConfiguration's `caBundle`.
//!
//! ```text
//! every check interval, each replica:
//!   GET Secret ─404─► generate CA + serving pair ─► POST ─409 (the other replica won)─┐
//!     │                                                                               │
//!     ├─ CA expires within rotate-before ──► new CA (the old one stays in ca.crt while │
//!     │                                      valid) + new serving pair ─► PUT ─409─────┤
//!     ├─ serving pair expires / not for the names / not from the CA ─► new pair ─► PUT │
//!     ▼                                                        re-read ◄───────────────┘
//!   serve the stored pair (hot swap: new handshakes only), then
//!   GET MutatingWebhookConfiguration ─caBundle ≠ ca.crt─► PUT (409: re-read, again)
//! ```
//!
//! The Secret (`kubernetes.io/tls`) holds `tls.crt`, `tls.key`, `ca.crt` (the current CA
//! first, then a previous CA still valid: the API server keeps trusting a replica that
//! has not yet loaded the new pair) and `ca.key`. Both replicas converge on the Secret
//! through the API server's create/update conflicts; neither ever overwrites a pair it
//! did not read.

use super::error::{Error, Result};
use super::tls::{certified_key, CertResolver};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use x509_parser::extensions::GeneralName;

/// Keys of the Secret.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

const DAY: Duration = Duration::from_secs(24 * 3600);
/// Certificates start this long before they are made (clocks of the nodes differ).
const BACKDATE: Duration = Duration::from_secs(3600);
/// Tries of a create/update that keeps conflicting with the other replica.
const TRIES: usize = 5;

/// Where the certificate lives and how long it lasts.
#[derive(Clone, Debug)]
pub struct CertConfig {
    /// Namespace of the Secret and of the webhook Service.
    pub namespace: String,
    /// Name of the Secret holding the CA and the serving pair.
    pub secret: String,
    /// Name of the webhook Service (the serving certificate names its DNS names).
    pub service: String,
    /// MutatingWebhookConfiguration whose `caBundle` is kept at the CA ("" = none).
    pub webhook_config: String,
    pub ca_validity: Duration,
    pub cert_validity: Duration,
    /// A certificate (CA or serving) with less than this left is replaced.
    pub rotate_before: Duration,
    /// How often the Secret and the `caBundle` are checked.
    pub check_every: Duration,
}

impl CertConfig {
    /// Defaults: CA 10 years, serving certificate 1 year, rotated 30 days before expiry,
    /// checked every minute.
    pub fn new(namespace: &str) -> CertConfig {
        CertConfig {
            namespace: namespace.into(),
            secret: "tessera-webhook-cert".into(),
            service: "tessera-webhook".into(),
            webhook_config: "tessera-admission".into(),
            ca_validity: 3650 * DAY,
            cert_validity: 365 * DAY,
            rotate_before: 30 * DAY,
            check_every: Duration::from_secs(60),
        }
    }

    /// The names the API server may call the Service by.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, ns) = (&self.service, &self.namespace);
        vec![
            format!("{s}.{ns}.svc"),
            format!("{s}.{ns}.svc.cluster.local"),
            format!("{s}.{ns}"),
            s.clone(),
        ]
    }
}

/// The Secret's four PEM entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The current CA first, then a previous one still valid.
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
}

/// What a bundle needs at some instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing.
    None,
    /// A new serving pair from the same CA.
    Serving,
    /// A new CA and a new serving pair.
    All,
}

fn tls_err(what: &str) -> impl Fn(rcgen::Error) -> Error + '_ {
    move |e| Error::Tls(format!("{what}: {e}"))
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// A new self-signed CA valid from `now` for `validity`: (certificate, key) PEM.
pub fn new_ca(now: SystemTime, validity: Duration) -> Result<(String, String)> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "tessera-webhook-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = offset(now - BACKDATE);
    params.not_after = offset(now + validity);
    let key = KeyPair::generate().map_err(tls_err("generating the CA key"))?;
    let cert = params
        .self_signed(&key)
        .map_err(tls_err("signing the CA"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving pair for `names` signed by the CA (`ca_cert` PEM: its first certificate,
/// `ca_key` PEM), valid from `now` for `validity`: (certificate, key) PEM.
pub fn new_serving(
    ca_cert: &str,
    ca_key: &str,
    names: &[String],
    now: SystemTime,
    validity: Duration,
) -> Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca_key).map_err(tls_err(CA_KEY))?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert, ca_key).map_err(tls_err(CA_CERT))?;
    let mut params =
        CertificateParams::new(names.to_vec()).map_err(tls_err("the webhook DNS names"))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now - BACKDATE);
    params.not_after = offset(now + validity);
    let key = KeyPair::generate().map_err(tls_err("generating the serving key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(tls_err("signing the serving certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The DER certificates of a PEM text.
fn ders(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Tls(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{what}: no certificate")));
    }
    Ok(certs)
}

/// Seconds since the epoch at which the first certificate of `pem` expires.
pub fn not_after(pem: &str) -> Result<i64> {
    let der = ders(pem, "certificate")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der[0])
        .map_err(|e| Error::Tls(format!("certificate: {e}")))?;
    Ok(cert.validity().not_after.timestamp())
}

impl Bundle {
    /// A new CA and a serving pair for `cfg`'s names.
    pub fn generate(cfg: &CertConfig, now: SystemTime) -> Result<Bundle> {
        let (ca_cert, ca_key) = new_ca(now, cfg.ca_validity)?;
        let (cert, key) = new_serving(&ca_cert, &ca_key, &cfg.dns_names(), now, cfg.cert_validity)?;
        Ok(Bundle {
            ca_cert,
            ca_key,
            cert,
            key,
        })
    }

    /// The bundle a Secret holds (`None`: an entry is missing or not UTF-8).
    pub fn from_secret(secret: &Secret) -> Option<Bundle> {
        let data = secret.data.as_ref()?;
        let get = |k: &str| String::from_utf8(data.get(k)?.0.clone()).ok();
        Some(Bundle {
            ca_cert: get(CA_CERT)?,
            ca_key: get(CA_KEY)?,
            cert: get(TLS_CERT)?,
            key: get(TLS_KEY)?,
        })
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (TLS_CERT, &self.cert),
            (TLS_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }

    /// The serving pair, ready for rustls.
    pub fn certified_key(&self) -> Result<CertifiedKey> {
        certified_key(
            self.cert.as_bytes(),
            self.key.as_bytes(),
            "the webhook certificate Secret",
        )
    }

    /// What this bundle needs at `now` under `cfg`.
    pub fn renewal(&self, cfg: &CertConfig, now: SystemTime) -> Renewal {
        let deadline = unix(now + cfg.rotate_before);
        let Ok(cas) = ders(&self.ca_cert, CA_CERT) else {
            return Renewal::All;
        };
        let Ok((_, ca)) = x509_parser::parse_x509_certificate(&cas[0]) else {
            return Renewal::All;
        };
        if ca.validity().not_after.timestamp() <= deadline || !ca.is_ca() {
            return Renewal::All;
        }
        if KeyPair::from_pem(&self.ca_key)
            .ok()
            .and_then(|k| Issuer::from_ca_cert_der(&cas[0], k).ok())
            .is_none()
        {
            return Renewal::All;
        }
        let serving_ok = || -> Option<()> {
            self.certified_key().ok()?;
            let leaf = ders(&self.cert, TLS_CERT).ok()?;
            let (_, leaf) = x509_parser::parse_x509_certificate(&leaf[0]).ok()?;
            if leaf.validity().not_after.timestamp() <= deadline {
                return None;
            }
            leaf.verify_signature(Some(ca.public_key())).ok()?;
            let san = leaf.subject_alternative_name().ok()??;
            let covered: Vec<&str> = san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(*d),
                    _ => None,
                })
                .collect();
            cfg.dns_names()
                .iter()
                .all(|n| covered.contains(&n.as_str()))
                .then_some(())
        };
        match serving_ok() {
            Some(()) => Renewal::None,
            None => Renewal::Serving,
        }
    }

    /// The bundle after `renewal` at `now`. A new CA keeps the previous one in
    /// `ca_cert` while it is still valid; expired CAs are dropped.
    pub fn renew(&self, renewal: Renewal, cfg: &CertConfig, now: SystemTime) -> Result<Bundle> {
        let valid = |pem: &String| not_after(pem).is_ok_and(|t| t > unix(now));
        match renewal {
            Renewal::None => Ok(self.clone()),
            Renewal::Serving => {
                let (cert, key) = new_serving(
                    &self.ca_cert,
                    &self.ca_key,
                    &cfg.dns_names(),
                    now,
                    cfg.cert_validity,
                )?;
                Ok(Bundle {
                    cert,
                    key,
                    ..self.clone()
                })
            }
            Renewal::All => {
                let mut next = Bundle::generate(cfg, now)?;
                // Only the CA being replaced is kept (not older ones), while valid.
                if let Some(previous) = pem_blocks(&self.ca_cert).into_iter().next().filter(valid) {
                    next.ca_cert.push_str(&previous);
                }
                Ok(next)
            }
        }
    }
}

/// The PEM blocks of `pem`, each with its END line.
fn pem_blocks(pem: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(i) = rest.find(END) {
        let (block, tail) = rest.split_at(i + END.len());
        out.push(format!("{}\n", block.trim()));
        rest = tail;
    }
    out
}

fn secret_object(cfg: &CertConfig, bundle: &Bundle) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(cfg.secret.clone()),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(
                [
                    ("app.kubernetes.io/name", "tessera"),
                    ("app.kubernetes.io/component", "controller"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(bundle.data()),
        ..Secret::default()
    }
}

/// One check: creates the Secret when absent, renews what needs it, and returns the
/// bundle stored now. A conflict with the other replica re-reads its Secret.
pub async fn ensure(client: &kube::Client, cfg: &CertConfig, now: SystemTime) -> Result<Bundle> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let what = format!("Secret {}/{}", cfg.namespace, cfg.secret);
    for _ in 0..TRIES {
        let existing = api
            .get_opt(&cfg.secret)
            .await
            .map_err(Error::api(format!("get {what}")))?;
        let Some(existing) = existing else {
            let bundle = Bundle::generate(cfg, now)?;
            match api
                .create(&PostParams::default(), &secret_object(cfg, &bundle))
                .await
                .map_err(Error::api(format!("create {what}")))
            {
                Ok(_) => {
                    tracing::info!(secret = %what, "created the webhook CA and serving certificate");
                    return Ok(bundle);
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        };
        let current = Bundle::from_secret(&existing);
        let renewal = current
            .as_ref()
            .map_or(Renewal::All, |b| b.renewal(cfg, now));
        let next = match (&current, renewal) {
            (Some(b), Renewal::None) => return Ok(b.clone()),
            (Some(b), r) => b.renew(r, cfg, now)?,
            (None, _) => Bundle::generate(cfg, now)?,
        };
        let mut updated = existing.clone();
        let mut data = updated.data.take().unwrap_or_default();
        data.extend(next.data());
        updated.data = Some(data);
        match api
            .replace(&cfg.secret, &PostParams::default(), &updated)
            .await
            .map_err(Error::api(format!("update {what}")))
        {
            Ok(_) => {
                tracing::info!(secret = %what, ?renewal, "rotated the webhook certificate");
                return Ok(next);
            }
            Err(e) if e.is_conflict() || e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Tls(format!(
        "{what}: still conflicting after {TRIES} tries"
    )))
}

/// Sets the `caBundle` of every webhook of `cfg.webhook_config` to `ca_cert`; returns
/// whether it changed anything. A missing configuration is not an error (the webhook
/// may be registered by other means), only logged.
pub async fn inject_ca_bundle(
    client: &kube::Client,
    cfg: &CertConfig,
    ca_cert: &str,
) -> Result<bool> {
    if cfg.webhook_config.is_empty() {
        return Ok(false);
    }
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("MutatingWebhookConfiguration {}", cfg.webhook_config);
    let want = ByteString(ca_cert.as_bytes().to_vec());
    for _ in 0..TRIES {
        let Some(mut config) = api
            .get_opt(&cfg.webhook_config)
            .await
            .map_err(Error::api(format!("get {what}")))?
        else {
            tracing::warn!(config = %what, "not found: its caBundle cannot be set");
            return Ok(false);
        };
        let mut changed = false;
        for hook in config.webhooks.iter_mut().flatten() {
            if hook.client_config.ca_bundle.as_ref() != Some(&want) {
                hook.client_config.ca_bundle = Some(want.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api
            .replace(&cfg.webhook_config, &PostParams::default(), &config)
            .await
            .map_err(Error::api(format!("update {what}")))
        {
            Ok(_) => {
                tracing::info!(config = %what, "caBundle set to the webhook CA");
                return Ok(true);
            }
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Tls(format!(
        "{what}: still conflicting after {TRIES} tries"
    )))
}

/// Keeps the Secret, the served pair and the `caBundle` current until `shutdown`:
/// checks at once, then every `cfg.check_every` (every 5 s at most while failing).
pub async fn run(
    client: kube::Client,
    cfg: CertConfig,
    resolver: Arc<CertResolver>,
    shutdown: CancellationToken,
) {
    let mut served: Option<Bundle> = None;
    loop {
        let ok = match check(&client, &cfg, &resolver, &mut served).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "webhook certificate check failed; retrying");
                false
            }
        };
        let wait = if ok {
            cfg.check_every
        } else {
            cfg.check_every.min(Duration::from_secs(5))
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn check(
    client: &kube::Client,
    cfg: &CertConfig,
    resolver: &CertResolver,
    served: &mut Option<Bundle>,
) -> Result<()> {
    let bundle = ensure(client, cfg, SystemTime::now()).await?;
    if served.as_ref() != Some(&bundle) {
        resolver.set(bundle.certified_key()?);
        tracing::info!("serving the webhook certificate from the Secret");
        *served = Some(bundle.clone());
    }
    inject_ca_bundle(client, cfg, &bundle.ca_cert).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CertConfig {
        CertConfig::new("tessera-system")
    }

    #[test]
    fn a_fresh_bundle_needs_nothing_and_names_the_service() {
        let now = SystemTime::now();
        let b = Bundle::generate(&cfg(), now).unwrap();
        assert_eq!(b.renewal(&cfg(), now), Renewal::None);
        assert!(b.certified_key().is_ok());
        let left = not_after(&b.cert).unwrap() - unix(now);
        assert!((364 * 86400..=366 * 86400).contains(&left), "{left}");
        let other = CertConfig {
            service: "other".into(),
            ..cfg()
        };
        assert_eq!(b.renewal(&other, now), Renewal::Serving, "other names");
    }

    #[test]
    fn expiring_certificates_are_renewed_the_right_amount() {
        let now = SystemTime::now();
        let b = Bundle::generate(&cfg(), now).unwrap();
        // 340 days on, the serving pair has < 30 days left; the CA is fine.
        let later = now + 340 * DAY;
        assert_eq!(b.renewal(&cfg(), later), Renewal::Serving);
        let renewed = b.renew(Renewal::Serving, &cfg(), later).unwrap();
        assert_eq!(renewed.ca_cert, b.ca_cert);
        assert_ne!(renewed.cert, b.cert);
        assert_eq!(renewed.renewal(&cfg(), later), Renewal::None);
        // Near the CA's end: a new CA, the old one kept in the bundle while valid.
        let end = now + 3640 * DAY;
        assert_eq!(renewed.renewal(&cfg(), end), Renewal::All);
        let fresh = renewed.renew(Renewal::All, &cfg(), end).unwrap();
        assert_ne!(fresh.ca_key, b.ca_key);
        let cas = ders(&fresh.ca_cert, CA_CERT).unwrap();
        assert_eq!(cas.len(), 2);
        assert_eq!(cas[1], ders(&b.ca_cert, CA_CERT).unwrap()[0]);
        assert_eq!(fresh.renewal(&cfg(), end), Renewal::None);
        // Renewed again after the old CA expired: it is dropped.
        let much_later = end + 3640 * DAY;
        let again = fresh.renew(Renewal::All, &cfg(), much_later).unwrap();
        assert_eq!(
            ders(&again.ca_cert, CA_CERT).unwrap().len(),
            2,
            "the previous, valid"
        );
        let again = again
            .renew(Renewal::All, &cfg(), much_later + 7300 * DAY)
            .unwrap();
        assert_eq!(
            ders(&again.ca_cert, CA_CERT).unwrap().len(),
            1,
            "expired CA dropped"
        );
    }

    #[test]
    fn a_pair_not_from_the_ca_or_broken_is_replaced() {
        let now = SystemTime::now();
        let a = Bundle::generate(&cfg(), now).unwrap();
        let b = Bundle::generate(&cfg(), now).unwrap();
        let mixed = Bundle {
            cert: b.cert.clone(),
            key: b.key.clone(),
            ..a.clone()
        };
        assert_eq!(mixed.renewal(&cfg(), now), Renewal::Serving, "other CA");
        let wrong_key = Bundle {
            key: b.key.clone(),
            ..a.clone()
        };
        assert_eq!(wrong_key.renewal(&cfg(), now), Renewal::Serving);
        let garbage = Bundle {
            ca_cert: "nope".into(),
            ..a
        };
        assert_eq!(garbage.renewal(&cfg(), now), Renewal::All);
    }

    #[test]
    fn pem_blocks_split_a_bundle() {
        let now = SystemTime::now();
        let (a, b) = (new_ca(now, DAY).unwrap().0, new_ca(now, DAY).unwrap().0);
        assert_eq!(pem_blocks(&format!("{a}{b}")), vec![a.clone(), b]);
        assert_eq!(pem_blocks(&a), vec![a]);
        assert!(pem_blocks("junk").is_empty());
    }
}
