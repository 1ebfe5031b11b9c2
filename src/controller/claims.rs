//! DRA claims of live pods counted against quota: each `spec.resourceClaims[]` entry
//! names a ResourceClaimTemplate (`resourceClaimTemplateName`) or a ResourceClaim
//! (`resourceClaimName`), whose spec is counted by [`crate::quota::claims::claimed`]
//! (the function `tessera plan` counts a ResourceClaimTemplate with): devices per class,
//! charged as the resource the device-class mapping names (Kueue's
//! `resources.deviceClassMappings`), else as a resource named after the class
//! (`gpu.tessera.io`); a vGPU slice's memory and cores as `nvidia.com/gpumem` and
//! `nvidia.com/gpucores`. A spec that cannot be counted (`allocationMode: All`, no
//! class) makes the workload unadmissible, with that reason.

use crate::quota::quantity::Quantity;
use crate::quota::WorkloadInfo;
use serde_json::Value;
use std::collections::BTreeMap;

/// Why a pod's claims cannot be counted: (reason, message) for its pending status.
pub type ClaimError = (String, String);

/// Claim objects kept between passes, by (namespace, name).
pub type ClaimObjects = BTreeMap<(String, String), Value>;

/// What a pod's `spec.resourceClaims[]` entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimSource {
    /// `resourceClaimTemplateName`: counted by the template's `spec.spec`.
    Template,
    /// `resourceClaimName`: counted by the claim's `spec`.
    Claim,
}

/// The object one `spec.resourceClaims[]` entry names; `None` for an entry naming
/// neither (counted as nothing).
pub fn named_by(entry: &Value) -> Option<(ClaimSource, &str)> {
    if let Some(t) = entry["resourceClaimTemplateName"].as_str() {
        Some((ClaimSource::Template, t))
    } else {
        entry["resourceClaimName"]
            .as_str()
            .map(|c| (ClaimSource::Claim, c))
    }
}

/// The claim objects of a snapshot (or kept between passes) and the class → resource
/// mapping.
#[derive(Clone, Debug)]
pub struct ClaimIndex<'a> {
    templates: Objects<'a>,
    claims: Objects<'a>,
    resources: &'a BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
enum Objects<'a> {
    Listed(BTreeMap<(&'a str, &'a str), &'a Value>),
    Kept(&'a ClaimObjects),
}

impl Objects<'_> {
    fn get(&self, namespace: &str, name: &str) -> Option<&Value> {
        match self {
            Objects::Listed(m) => m.get(&(namespace, name)).copied(),
            Objects::Kept(m) => m.get(&(namespace.to_string(), name.to_string())),
        }
    }
}

fn key(v: &Value) -> (&str, &str) {
    (
        v["metadata"]["namespace"].as_str().unwrap_or("default"),
        v["metadata"]["name"].as_str().unwrap_or(""),
    )
}

impl<'a> ClaimIndex<'a> {
    /// `resources`: device class name → quota resource name.
    pub fn new(
        templates: &'a [Value],
        claims: &'a [Value],
        resources: &'a BTreeMap<String, String>,
    ) -> Self {
        ClaimIndex {
            templates: Objects::Listed(templates.iter().map(|t| (key(t), t)).collect()),
            claims: Objects::Listed(claims.iter().map(|c| (key(c), c)).collect()),
            resources,
        }
    }

    /// Over objects kept between passes (no index to build).
    pub fn kept(
        templates: &'a ClaimObjects,
        claims: &'a ClaimObjects,
        resources: &'a BTreeMap<String, String>,
    ) -> Self {
        ClaimIndex {
            templates: Objects::Kept(templates),
            claims: Objects::Kept(claims),
            resources,
        }
    }

    /// Devices per quota resource that one pod with `pod_spec` (in `namespace`) claims.
    pub fn devices(
        &self,
        namespace: &str,
        pod_spec: &Value,
    ) -> Result<BTreeMap<String, u32>, ClaimError> {
        let mut out = BTreeMap::new();
        let Some(refs) = pod_spec["resourceClaims"].as_array() else {
            return Ok(out);
        };
        for (i, r) in refs.iter().enumerate() {
            let (what, spec) = match named_by(r) {
                Some((ClaimSource::Template, t)) => {
                    let Some(obj) = self.templates.get(namespace, t) else {
                        return Err((
                            "ResourceClaimTemplateNotFound".into(),
                            format!("spec.resourceClaims[{i}]: ResourceClaimTemplate {namespace}/{t} does not exist"),
                        ));
                    };
                    (
                        format!("ResourceClaimTemplate {namespace}/{t}"),
                        &obj["spec"]["spec"],
                    )
                }
                Some((ClaimSource::Claim, c)) => {
                    let Some(obj) = self.claims.get(namespace, c) else {
                        return Err((
                            "ResourceClaimNotFound".into(),
                            format!("spec.resourceClaims[{i}]: ResourceClaim {namespace}/{c} does not exist"),
                        ));
                    };
                    (format!("ResourceClaim {namespace}/{c}"), &obj["spec"])
                }
                None => continue,
            };
            let claimed = crate::quota::claims::claimed(spec)
                .map_err(|why| ("InvalidResourceClaim".to_string(), format!("{what}: {why}")))?;
            for (key, n) in claimed {
                // Device classes go by the mapping; vGPU shares are resources already.
                let resource = self.resources.get(&key).cloned().unwrap_or(key);
                let e = out.entry(resource).or_insert(0u32);
                *e = e.saturating_add(n);
            }
        }
        Ok(out)
    }

    /// Adds the claimed devices to every pod set of `info` (all built from `pod_spec`).
    pub fn charge(&self, info: &mut WorkloadInfo, pod_spec: &Value) -> Result<(), ClaimError> {
        let devices = self.devices(&info.namespace, pod_spec)?;
        for ps in &mut info.pod_sets {
            ps.claim_templates.clear();
            for (resource, n) in &devices {
                let q = ps.requests.entry(resource.clone()).or_default();
                q.0 = q.0.saturating_add(Quantity::units(i64::from(*n)).0);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(name: &str, requests: Value) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": name, "namespace": "team"},
               "spec": {"spec": {"devices": {"requests": requests}}}})
    }

    #[test]
    fn claims_are_counted_by_device_class() {
        let templates = [
            template(
                "two-gpus",
                json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "count": 2}}]),
            ),
            template(
                "beta",
                json!([{"name": "g", "deviceClassName": "mig.gpu.tessera.io"}]),
            ),
            template(
                "alternatives",
                json!([{"name": "g", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.tessera.io", "count": 1},
                {"name": "small", "deviceClassName": "mig.gpu.tessera.io", "count": 2}]}]),
            ),
            template(
                "all",
                json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "allocationMode": "All"}}]),
            ),
            template("no-class", json!([{"name": "g", "exactly": {"count": 1}}])),
        ];
        let claims = [json!({"metadata": {"name": "shared", "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}}})];
        let mapping: BTreeMap<String, String> = [(
            "mig.gpu.tessera.io".to_string(),
            "nvidia.com/mig".to_string(),
        )]
        .into();
        let index = ClaimIndex::new(&templates, &claims, &mapping);
        let spec = |refs: Value| json!({"resourceClaims": refs});
        type Want = Result<BTreeMap<String, u32>, String>;
        let ok = |pairs: &[(&str, u32)]| -> Want {
            Ok(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
        };
        let cases: Vec<(&str, Value, Want)> = vec![
            ("no claims", json!({}), ok(&[])),
            (
                "template, v1 count",
                spec(json!([{"name": "a", "resourceClaimTemplateName": "two-gpus"}])),
                ok(&[("gpu.tessera.io", 2)]),
            ),
            (
                "v1beta1 shape, mapped class",
                spec(json!([{"name": "a", "resourceClaimTemplateName": "beta"}])),
                ok(&[("nvidia.com/mig", 1)]),
            ),
            (
                "first alternative",
                spec(json!([{"name": "a", "resourceClaimTemplateName": "alternatives"}])),
                ok(&[("gpu.tessera.io", 1)]),
            ),
            (
                "claim plus template add up",
                spec(json!([{"name": "a", "resourceClaimName": "shared"},
                                                         {"name": "b", "resourceClaimTemplateName": "two-gpus"}])),
                ok(&[("gpu.tessera.io", 3)]),
            ),
            (
                "missing template",
                spec(json!([{"name": "a", "resourceClaimTemplateName": "nope"}])),
                Err("ResourceClaimTemplateNotFound".into()),
            ),
            (
                "missing claim",
                spec(json!([{"name": "a", "resourceClaimName": "nope"}])),
                Err("ResourceClaimNotFound".into()),
            ),
            (
                "allocation mode all",
                spec(json!([{"name": "a", "resourceClaimTemplateName": "all"}])),
                Err("InvalidResourceClaim".into()),
            ),
            (
                "no class",
                spec(json!([{"name": "a", "resourceClaimTemplateName": "no-class"}])),
                Err("InvalidResourceClaim".into()),
            ),
        ];
        for (name, pod_spec, want) in cases {
            let got = index
                .devices("team", &pod_spec)
                .map_err(|(reason, message)| {
                    assert!(!message.is_empty(), "{name}: a message");
                    reason
                });
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn charge_adds_devices_to_every_pod_set() {
        let templates = [template(
            "two-gpus",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "count": 2}}]),
        )];
        let mapping = BTreeMap::new();
        let index = ClaimIndex::new(&templates, &[], &mapping);
        let mut info = WorkloadInfo::new("team/w", "lq");
        info.pod_sets.push(crate::quota::model::PodSetInfo {
            name: "main".into(),
            count: 3,
            claim_templates: vec!["two-gpus".into()],
            ..Default::default()
        });
        let spec =
            json!({"resourceClaims": [{"name": "a", "resourceClaimTemplateName": "two-gpus"}]});
        index.charge(&mut info, &spec).unwrap();
        assert_eq!(
            info.pod_sets[0].requests["gpu.tessera.io"],
            Quantity::units(2)
        );
        assert!(info.pod_sets[0].claim_templates.is_empty());
    }

    /// The vGPU webhook's DRA mode turns a HAMi pod into a claim; the queue is charged
    /// the same `gpumem` and `gpucores` for it as for the pod written HAMi's way.
    #[test]
    fn a_translated_vgpu_pod_is_charged_what_the_hami_pod_is() {
        use crate::quota::api::PodSpec;
        use crate::vgpu::dra_claim::{self, VGPU_DEVICE_CLASS};
        use crate::vgpu::{pod_request, request::ResourceNames, RequestConfig};
        let pod = json!({"metadata": {"name": "p", "namespace": "team"},
            "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits":
                {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"}}}]}});
        let hami: PodSpec = serde_json::from_value(pod["spec"].clone()).unwrap();
        let hami = hami.effective_requests();
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone()).unwrap();
        let request = pod_request(&typed, &RequestConfig::default())
            .unwrap()
            .unwrap();
        let t = dra_claim::translate(&typed, &request, &ResourceNames::new("nvidia.com")).unwrap();
        let templates = [t.templates[0].object("team")];
        let spec = json!({"resourceClaims": [{"name": "tessera-vgpu-0",
                          "resourceClaimTemplateName": t.templates[0].name}]});
        let mapping: BTreeMap<String, String> =
            [(VGPU_DEVICE_CLASS.to_string(), "nvidia.com/gpu".to_string())].into();
        let claimed = ClaimIndex::new(&templates, &[], &mapping)
            .devices("team", &spec)
            .unwrap();
        for resource in ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"] {
            assert_eq!(
                Quantity::units(i64::from(claimed[resource])),
                hami[resource],
                "{resource}"
            );
        }
        assert_eq!(claimed["nvidia.com/gpumem"], 20480);
        // A capacity that is not a quantity: the claim is invalid, with the reason.
        let mut bad = templates[0].clone();
        bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
            ["memory"] = json!("lots");
        let err = ClaimIndex::new(&[bad], &[], &mapping)
            .devices("team", &spec)
            .unwrap_err();
        assert_eq!(err.0, "InvalidResourceClaim");
        assert!(err.1.contains("capacity memory"), "{}", err.1);
    }
}
