//! The parts of Kueue's manager `Configuration` Tessera uses, in Kueue's field names, so a
//! Kueue config ports by keeping these sections. One parser for both readers: the
//! controller's `--config FILE` and a `kind: Configuration` document in a `tessera plan`
//! scenario:
//!
//! ```yaml
//! apiVersion: config.kueue.x-k8s.io/v1beta1   # optional, not checked
//! kind: Configuration                         # optional; must be this when given
//! waitForPodsReady:
//!   enable: true
//!   blockAdmission: true      # admit one workload at a time until its pods are Ready
//!   timeout: 5m
//!   requeuingStrategy: {backoffLimitCount: 5, backoffBaseSeconds: 60, backoffMaxSeconds: 3600}
//! resources:
//!   deviceClassMappings:
//!     - {name: nvidia.com/gpu, deviceClassNames: [gpu.tessera.io]}
//! ```
//! Unknown fields are refused (with their path), never ignored.

use crate::quota::quantity::{parse_duration, Time};
use crate::quota::WaitForPodsReady;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Why a configuration file is refused (names the field).
#[derive(Debug, thiserror::Error)]
#[error("Kueue Configuration: {field}: {why}")]
pub struct ConfigError {
    pub field: String,
    pub why: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    wait_for_pods_ready: Option<RawWait>,
    #[serde(default)]
    resources: Option<RawResources>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWait {
    #[serde(default)]
    enable: bool,
    /// As in Kueue, `true` turns `enable` on.
    #[serde(default)]
    block_admission: bool,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    requeuing_strategy: Option<RawRequeuing>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRequeuing {
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    backoff_limit_count: Option<u32>,
    #[serde(default)]
    backoff_base_seconds: Option<u64>,
    #[serde(default)]
    backoff_max_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawResources {
    #[serde(default)]
    device_class_mappings: Vec<RawMapping>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawMapping {
    name: String,
    device_class_names: Vec<String>,
}

/// The validated configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KueueConfig {
    /// `waitForPodsReady` when enabled.
    pub wait_for_pods_ready: Option<WaitForPodsReady>,
    /// DRA device class → quota resource.
    pub device_classes: BTreeMap<String, String>,
}

fn err(field: &str, why: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        why: why.into(),
    }
}

impl KueueConfig {
    /// Parses and validates a YAML document.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        // Bounded (size, depth, aliases) and without quoting the input: crate::yaml.
        let raw: Raw = crate::yaml::from_str(text).map_err(|e| err(&e.path, e.reason))?;
        Self::validate(raw)
    }

    /// Parses and validates one already-read YAML document (a plan scenario's).
    pub fn from_value(value: serde_json::Value) -> Result<Self, ConfigError> {
        let raw: Raw = serde_path_to_error::deserialize(value)
            .map_err(|e| err(&e.path().to_string(), e.inner().to_string()))?;
        Self::validate(raw)
    }

    fn validate(raw: Raw) -> Result<Self, ConfigError> {
        let _ = raw.api_version;
        if let Some(kind) = raw.kind.as_deref() {
            if kind != "Configuration" {
                return Err(err("kind", format!("{kind:?}: must be Configuration")));
            }
        }
        let mut out = KueueConfig::default();
        if let Some(w) = raw
            .wait_for_pods_ready
            .filter(|w| w.enable || w.block_admission)
        {
            let mut cfg = WaitForPodsReady {
                block_admission: w.block_admission,
                ..WaitForPodsReady::default()
            };
            if let Some(t) = &w.timeout {
                cfg.timeout = parse_duration(t)
                    .map_err(|e| err("waitForPodsReady.timeout", e.to_string()))?;
                if cfg.timeout == 0 {
                    return Err(err("waitForPodsReady.timeout", "must be positive"));
                }
            }
            if let Some(r) = &w.requeuing_strategy {
                let secs = |v: u64, field: &str| -> Result<Time, ConfigError> {
                    if v == 0 {
                        return Err(err(field, "must be positive"));
                    }
                    Ok(v.saturating_mul(1000))
                };
                if let Some(b) = r.backoff_base_seconds {
                    cfg.backoff_base =
                        secs(b, "waitForPodsReady.requeuingStrategy.backoffBaseSeconds")?;
                }
                if let Some(m) = r.backoff_max_seconds {
                    cfg.backoff_max =
                        secs(m, "waitForPodsReady.requeuingStrategy.backoffMaxSeconds")?;
                }
                cfg.backoff_limit_count = r.backoff_limit_count;
                cfg.requeue_by_eviction_time = match r.timestamp.as_deref() {
                    None | Some("Eviction") => true,
                    Some("Creation") => false,
                    Some(other) => {
                        return Err(err(
                            "waitForPodsReady.requeuingStrategy.timestamp",
                            format!("{other:?}: must be Eviction or Creation"),
                        ))
                    }
                };
            }
            out.wait_for_pods_ready = Some(cfg);
        }
        for (i, m) in raw
            .resources
            .map(|r| r.device_class_mappings)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            if m.name.is_empty() {
                return Err(err(
                    &format!("resources.deviceClassMappings[{i}].name"),
                    "empty",
                ));
            }
            for class in m.device_class_names {
                if let Some(other) = out.device_classes.insert(class.clone(), m.name.clone()) {
                    return Err(err(
                        &format!("resources.deviceClassMappings[{i}].deviceClassNames"),
                        format!("{class:?} is already mapped to {other:?}"),
                    ));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let full = "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\n\
            waitForPodsReady:\n  enable: true\n  timeout: 2m\n  requeuingStrategy:\n    backoffLimitCount: 3\n    backoffBaseSeconds: 10\n    backoffMaxSeconds: 100\n    timestamp: Creation\n\
            resources:\n  deviceClassMappings:\n    - {name: nvidia.com/gpu, deviceClassNames: [gpu.tessera.io, mig.gpu.tessera.io]}\n";
        let cfg = KueueConfig::parse(full).unwrap();
        let w = cfg.wait_for_pods_ready.unwrap();
        assert_eq!(
            (
                w.timeout,
                w.backoff_base,
                w.backoff_max,
                w.backoff_limit_count
            ),
            (120_000, 10_000, 100_000, Some(3))
        );
        assert!(!w.requeue_by_eviction_time);
        assert!(!w.block_admission, "off unless asked for");
        // (text, enabled, blockAdmission)
        let block = [
            (
                "waitForPodsReady: {enable: true, blockAdmission: true}",
                true,
                true,
            ),
            ("waitForPodsReady: {blockAdmission: true}", true, true),
            (
                "waitForPodsReady: {enable: true, blockAdmission: false}",
                true,
                false,
            ),
            (
                "waitForPodsReady: {enable: false, blockAdmission: false}",
                false,
                false,
            ),
        ];
        for (text, enabled, blocks) in block {
            let w = KueueConfig::parse(text).unwrap().wait_for_pods_ready;
            assert_eq!(w.is_some(), enabled, "{text}");
            assert_eq!(w.is_some_and(|w| w.block_admission), blocks, "{text}");
        }
        assert_eq!(cfg.device_classes["mig.gpu.tessera.io"], "nvidia.com/gpu");
        let empty = KueueConfig::parse("{}").unwrap();
        assert_eq!(empty, KueueConfig::default());
        let disabled =
            KueueConfig::parse("waitForPodsReady: {enable: false, timeout: 1m}").unwrap();
        assert!(disabled.wait_for_pods_ready.is_none());
        // (case, text, field named in the error)
        let bad = [
            ("unknown field", "waitForPodsReady: {enable: true, timout: 1m}", "waitForPodsReady"),
            ("bad duration", "waitForPodsReady: {enable: true, timeout: soon}", "waitForPodsReady.timeout"),
            ("zero timeout", "waitForPodsReady: {enable: true, timeout: 0s}", "waitForPodsReady.timeout"),
            ("bad timestamp", "waitForPodsReady: {enable: true, requeuingStrategy: {timestamp: Later}}", "timestamp"),
            ("zero base", "waitForPodsReady: {enable: true, requeuingStrategy: {backoffBaseSeconds: 0}}", "backoffBaseSeconds"),
            ("wrong kind", "kind: Deployment", "kind"),
            ("class mapped twice", "resources:\n  deviceClassMappings:\n    - {name: a, deviceClassNames: [c]}\n    - {name: b, deviceClassNames: [c]}\n", "deviceClassMappings[1]"),
        ];
        for (name, text, field) in bad {
            let e = KueueConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(field), "{name}: {e}");
        }
    }

    #[test]
    fn the_shipped_config_map_parses() {
        let text = std::fs::read_to_string("daemonset/controller/deployment.yaml").unwrap();
        let doc = serde_saphyr::from_multiple::<serde_json::Value>(&text)
            .unwrap()
            .into_iter()
            .find(|d| d["kind"] == "ConfigMap")
            .expect("a ConfigMap");
        let config = doc["data"]["config.yaml"].as_str().unwrap();
        let parsed = KueueConfig::parse(config).unwrap();
        assert!(parsed.wait_for_pods_ready.is_none(), "off by default");
    }
}
