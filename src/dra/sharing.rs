//! Opaque device configuration of `gpu.tessera.io` claims: GPU sharing (time-slicing).
//!
//! Several pods that reference one ResourceClaim share its GPU; the kubelet prepares the
//! claim once. How the GPU switches between their contexts is set through the claim's
//! (or its DeviceClass's) opaque configuration, copied by the scheduler into
//! `status.allocation.devices.config[]`:
//!
//! ```yaml
//! config:
//! - requests: ["gpu"]            # optional: every request of the claim when absent
//!   opaque:
//!     driver: gpu.tessera.io
//!     parameters:
//!       apiVersion: gpu.tessera.io/v1alpha1
//!       kind: GpuConfig
//!       sharing:
//!         strategy: TimeSlicing
//!         timeSlicing: { interval: Short }   # Default | Short | Medium | Long
//! ```
//!
//! Parsing is strict: an unknown apiVersion, kind, field, strategy or interval is a
//! per-claim error naming the config entry and field, and nothing is prepared. Entries are
//! applied in order (class entries come first, then the claim's), so the claim's own entry
//! wins. Pure: no I/O.

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use serde::Deserialize;

use super::names::DRIVER;
use crate::gpu::TimeSlice;

/// The parameters' `apiVersion`.
pub const API_VERSION: &str = "gpu.tessera.io/v1alpha1";
/// The parameters' `kind`.
pub const KIND: &str = "GpuConfig";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config[{index}] (driver {DRIVER}): {reason}")]
pub struct ConfigError {
    /// Position in `status.allocation.devices.config`.
    pub index: usize,
    pub reason: String,
}

/// `GpuConfig` as written by users.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGpuConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    sharing: Option<RawSharing>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSharing {
    strategy: Strategy,
    #[serde(default)]
    time_slicing: Option<RawTimeSlicing>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum Strategy {
    TimeSlicing,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTimeSlicing {
    #[serde(default)]
    interval: TimeSlice,
}

/// The validated configuration of one entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuConfig {
    /// `Some` when the entry asks for time-slicing.
    pub time_slice: Option<TimeSlice>,
}

/// One of our config entries, validated, with the requests it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    /// Empty: every request of the claim.
    pub requests: Vec<String>,
    pub config: GpuConfig,
}

impl ConfigEntry {
    /// Does this entry cover the allocation result of `request` (`req` or `req/sub`)?
    pub fn applies_to(&self, request: &str) -> bool {
        let parent = request.split('/').next().unwrap_or(request);
        self.requests.is_empty() || self.requests.iter().any(|r| r == request || r == parent)
    }
}

/// Parse one `parameters` object strictly.
pub fn parse_parameters(value: &serde_json::Value) -> Result<GpuConfig, String> {
    let raw: RawGpuConfig = serde_path_to_error::deserialize(value)
        .map_err(|e| format!("parameters.{}: {}", e.path(), e.inner()))?;
    if raw.api_version != API_VERSION {
        return Err(format!(
            "parameters.apiVersion: {:?} is not {API_VERSION}",
            raw.api_version
        ));
    }
    if raw.kind != KIND {
        return Err(format!("parameters.kind: {:?} is not {KIND}", raw.kind));
    }
    let time_slice = raw.sharing.map(|s| match s.strategy {
        Strategy::TimeSlicing => s.time_slicing.map(|t| t.interval).unwrap_or_default(),
    });
    Ok(GpuConfig { time_slice })
}

/// Our entries of an allocation's `config[]`, in order; other drivers' are skipped.
pub fn parse_configs(
    configs: &[DeviceAllocationConfiguration],
) -> Result<Vec<ConfigEntry>, ConfigError> {
    let mut out = Vec::new();
    for (index, c) in configs.iter().enumerate() {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == DRIVER) else {
            continue;
        };
        let config = parse_parameters(&opaque.parameters.0)
            .map_err(|reason| ConfigError { index, reason })?;
        out.push(ConfigEntry {
            requests: c.requests.clone().unwrap_or_default(),
            config,
        });
    }
    Ok(out)
}

/// The time-slice for the device allocated for `request`: the last entry that covers it
/// and says anything about sharing.
pub fn time_slice_for(entries: &[ConfigEntry], request: &str) -> Option<TimeSlice> {
    entries
        .iter()
        .filter(|e| e.applies_to(request))
        .filter_map(|e| e.config.time_slice)
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    fn entry(
        driver: &str,
        requests: Option<&[&str]>,
        params: serde_json::Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: "FromClaim".into(),
            requests: requests.map(|r| r.iter().map(|s| s.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(params),
            }),
        }
    }

    fn ts(interval: &str) -> serde_json::Value {
        json!({"apiVersion": API_VERSION, "kind": KIND,
               "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}})
    }

    #[test]
    fn valid_parameters() {
        let cases = [
            (ts("Short"), Some(TimeSlice::Short)),
            (ts("Long"), Some(TimeSlice::Long)),
            (ts("Default"), Some(TimeSlice::Default)),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "sharing": {"strategy": "TimeSlicing"}}),
                Some(TimeSlice::Default),
            ),
            (json!({"apiVersion": API_VERSION, "kind": KIND}), None),
        ];
        for (params, want) in cases {
            assert_eq!(
                parse_parameters(&params).unwrap().time_slice,
                want,
                "{params}"
            );
        }
    }

    #[test]
    fn strict_errors_name_the_field() {
        let cases = [
            (ts("Fast"), "parameters.sharing.timeSlicing.interval"),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "sharing": {"strategy": "MPS"}}),
                "parameters.sharing.strategy",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "replicas": 4}),
                "replicas",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND,
                       "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short", "x": 1}}}),
                "parameters.sharing.timeSlicing",
            ),
            (
                json!({"apiVersion": "gpu.tessera.io/v9", "kind": KIND}),
                "parameters.apiVersion",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "MigConfig"}),
                "parameters.kind",
            ),
            (json!({"kind": KIND}), "apiVersion"),
            (json!("TimeSlicing"), "parameters"),
        ];
        for (params, field) in cases {
            let e = parse_parameters(&params).unwrap_err();
            assert!(e.contains(field), "{params}: {e}");
        }
    }

    #[test]
    fn entries_apply_in_order_to_their_requests() {
        let configs = vec![
            entry("other.example.com", None, json!({"anything": true})),
            entry(DRIVER, None, ts("Long")),
            entry(DRIVER, Some(&["train"]), ts("Short")),
        ];
        let entries = parse_configs(&configs).unwrap();
        assert_eq!(entries.len(), 2, "other drivers' entries are skipped");
        assert_eq!(time_slice_for(&entries, "train"), Some(TimeSlice::Short));
        assert_eq!(
            time_slice_for(&entries, "train/big"),
            Some(TimeSlice::Short)
        );
        assert_eq!(time_slice_for(&entries, "infer"), Some(TimeSlice::Long));
        assert_eq!(time_slice_for(&[], "infer"), None);

        let bad = vec![
            entry(DRIVER, None, json!({})),
            entry(DRIVER, None, ts("Fast")),
        ];
        let e = parse_configs(&bad).unwrap_err();
        assert_eq!(e.index, 0);
        assert!(
            e.to_string()
                .starts_with("config[0] (driver gpu.tessera.io): "),
            "{e}"
        );
    }
}
