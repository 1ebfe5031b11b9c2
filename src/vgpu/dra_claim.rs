//! HAMi-style vGPU requests as DRA claims: the vGPU webhook's DRA mode (`--vgpu-mode dra`).
//!
//! On a cluster with DRA consumable capacity (`DRAConsumableCapacity`, Kubernetes 1.34+),
//! the stock kube-scheduler can place vGPU slices itself: each GPU in `mode: vgpu` is one
//! device of `vgpu.gpu.tessera.io` with capacity `memory` and `cores`
//! (`src/dra/slices.rs`). [`translate`] turns a pod written HAMi's way into that:
//!
//! - each container that asks for vGPUs gets a ResourceClaimTemplate (one request per
//!   vGPU, `capacity.requests` of its memory and cores, a `distinctAttribute` constraint
//!   on the GPU's UUID so that its vGPUs land on distinct GPUs, as HAMi's do, and CEL
//!   selectors from `nvidia.com/use-gputype` and the other selector annotations);
//! - the pod references it in `spec.resourceClaims` (`tessera-vgpu-<n>`, one per such
//!   container, init containers first), the container in `resources.claims`, and the
//!   container's `nvidia.com/gpu`, `gpumem`, `gpumem-percentage`, `gpucores` go (the
//!   device plugin's resource would be counted twice);
//! - the pod keeps what it asked in the annotation [`ORIGINAL_ANNOTATION`] (quota, and a
//!   reader wondering where its resources went).
//!
//! A template's name is derived from its spec (`tessera-vgpu-<count>x<MiB>mib-<cores>c-
//! <hash>`): pods asking the same share the template; the webhook creates it when
//! missing and refuses a pod whose template name is taken by another spec.
//!
//! What DRA cannot say, refused with the reason (the extender mode takes these pods):
//! memory as a percentage (`gpumem-percentage`, or no `gpumem` at all, HAMi's "whole
//! memory"), since a capacity request is absolute and which GPU a percentage is of is
//! known only after scheduling; and `gpucores: 0` (HAMi's "no SM limit"), since a slice
//! reserves its SMs. Pure: a Pod and its parsed request in, JSON out.

use std::collections::BTreeMap;

use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::request::{ContainerKind, MemoryRequest, PodRequest, ResourceNames, Selectors};

/// The DeviceClass of vGPU slices (`daemonset/dra/deviceclasses.yaml`).
pub const VGPU_DEVICE_CLASS: &str = "vgpu.gpu.tessera.io";
/// The attribute whose values must differ between one container's vGPUs.
pub const UUID_ATTRIBUTE: &str = "gpu.tessera.io/uuid";
/// Annotation keeping the pod's vGPU resources as written, per container:
/// `{"<container>": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", ...}}`.
pub const ORIGINAL_ANNOTATION: &str = "tessera.io/vgpu-dra-request";
/// Prefix of the pod's claim entries and of the templates' names.
const CLAIM_PREFIX: &str = "tessera-vgpu";

/// Why a pod cannot be translated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TranslateError {
    #[error(
        "container {container:?}: memory {memory} cannot be a DRA capacity request (it is absolute, and which GPU a share is of is known only after scheduling); write nvidia.com/gpumem in MiB, or use the scheduler extender (--vgpu-mode extender)"
    )]
    RelativeMemory { container: String, memory: String },
    #[error(
        "container {container:?}: nvidia.com/gpucores 0 (no SM limit) cannot be a DRA slice, which reserves its SMs; ask for 1-100, or use the scheduler extender (--vgpu-mode extender)"
    )]
    NoCores { container: String },
    #[error(
        "spec.resourceClaims already has an entry {name:?}; Tessera's DRA mode names its claims so"
    )]
    ClaimNameTaken { name: String },
    #[error("annotation value {value:?} has a control character")]
    ControlCharacter { value: String },
}

/// A ResourceClaimTemplate the pod refers to: its name and `spec` (namespace: the pod's).
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimTemplate {
    pub name: String,
    pub spec: Value,
}

impl ClaimTemplate {
    /// The API object, in `namespace`.
    pub fn object(&self, namespace: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "tessera"},
            },
            "spec": self.spec,
        })
    }
}

/// The pod's rewrite: JSON patch operations and the templates they refer to.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    pub patch: Vec<PatchOperation>,
    pub templates: Vec<ClaimTemplate>,
}

/// The DRA form of `pod`, whose parsed vGPU request is `request`.
pub fn translate(
    pod: &Pod,
    request: &PodRequest,
    names: &ResourceNames,
) -> Result<Translation, TranslateError> {
    let spec = pod.spec.as_ref();
    let taken: Vec<&str> = spec
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let selectors = cel_selectors(&request.selectors)?;
    let mut patch = Vec::new();
    let mut templates = Vec::new();
    let mut original = BTreeMap::new();
    let mut claims = Vec::new();
    for (n, c) in request.containers.iter().enumerate() {
        let memory_mib = match c.memory {
            MemoryRequest::Mib(mib) => mib,
            m @ MemoryRequest::Percent(_) => {
                return Err(TranslateError::RelativeMemory {
                    container: c.name.clone(),
                    memory: m.to_string(),
                })
            }
        };
        if c.cores == 0 {
            return Err(TranslateError::NoCores {
                container: c.name.clone(),
            });
        }
        let claim = format!("{CLAIM_PREFIX}-{n}");
        if taken.contains(&claim.as_str()) {
            return Err(TranslateError::ClaimNameTaken { name: claim });
        }
        let template = template(c.count, memory_mib, c.cores, &selectors);
        claims.push(json!({"name": claim, "resourceClaimTemplateName": template.name}));
        let (list, index) = container_index(pod, &c.name, c.kind);
        let path = PointerBuf::from_tokens([
            Token::new("spec"),
            Token::new(list),
            Token::from(index),
            Token::new("resources"),
        ]);
        original.insert(
            c.name.clone(),
            remove_vgpu_resources(pod, list, index, names, &path, &mut patch),
        );
        let has_claims = container_at(pod, list, index)
            .and_then(|k| k.resources.as_ref())
            .is_some_and(|r| r.claims.is_some());
        patch.push(if has_claims {
            add(
                path.with_trailing_token("claims").with_trailing_token("-"),
                json!({"name": claim}),
            )
        } else {
            add(path.with_trailing_token("claims"), json!([{"name": claim}]))
        });
        if !templates.contains(&template) {
            templates.push(template);
        }
    }
    if taken.is_empty() {
        let path = PointerBuf::from_tokens(["spec", "resourceClaims"]);
        patch.push(add(path, Value::Array(claims)));
    } else {
        for c in claims {
            patch.push(add(
                PointerBuf::from_tokens(["spec", "resourceClaims", "-"]),
                c,
            ));
        }
    }
    let original = serde_json::to_string(&original).unwrap_or_default();
    if pod.metadata.annotations.is_none() {
        let path = PointerBuf::from_tokens(["metadata", "annotations"]);
        patch.push(add(path, json!({})));
    }
    let path = PointerBuf::from_tokens(["metadata", "annotations", ORIGINAL_ANNOTATION]);
    patch.push(add(path, json!(original)));
    Ok(Translation { patch, templates })
}

/// A JSONPatch `add` of `value` at `path`.
fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// The template for one container: `count` requests of `memory_mib` and `cores`.
fn template(count: u32, memory_mib: u64, cores: u32, selectors: &[Value]) -> ClaimTemplate {
    let requests: Vec<Value> = (0..count)
        .map(|i| {
            // allocationMode and count as the API server would default them, so the
            // stored template compares equal to this one.
            let mut exactly = json!({
                "deviceClassName": VGPU_DEVICE_CLASS,
                "allocationMode": "ExactCount",
                "count": 1,
                "capacity": {"requests": {"memory": format!("{memory_mib}Mi"),
                                          "cores": cores.to_string()}},
            });
            if !selectors.is_empty() {
                exactly["selectors"] = Value::Array(selectors.to_vec());
            }
            json!({"name": format!("vgpu-{i}"), "exactly": exactly})
        })
        .collect();
    let mut devices = json!({ "requests": requests });
    if count > 1 {
        let names: Vec<String> = (0..count).map(|i| format!("vgpu-{i}")).collect();
        devices["constraints"] = json!([{"requests": names, "distinctAttribute": UUID_ATTRIBUTE}]);
    }
    let spec = json!({ "spec": { "devices": devices } });
    // Same spec, same name: serde_json's maps are sorted, so the text is canonical.
    let hash = fnv1a(spec.to_string().as_bytes());
    let name = format!("{CLAIM_PREFIX}-{count}x{memory_mib}mib-{cores}c-{hash:08x}");
    ClaimTemplate { name, spec }
}

/// CEL selectors for the pod's GPU selector annotations (model names: case-insensitive
/// substrings, as HAMi matches them; UUIDs: exact).
fn cel_selectors(s: &Selectors) -> Result<Vec<Value>, TranslateError> {
    let model = r#"device.attributes["gpu.tessera.io"].productName.lowerAscii()"#;
    let uuid = r#"device.attributes["gpu.tessera.io"].uuid"#;
    let mut out = Vec::new();
    let any_of =
        |values: &[String], each: &dyn Fn(&str) -> String| -> Result<String, TranslateError> {
            let parts: Result<Vec<String>, _> = values
                .iter()
                .map(|v| cel_string(v).map(|lit| each(&lit)))
                .collect();
            Ok(parts?.join(" || "))
        };
    let contains = |lit: &str| format!("{model}.contains({})", lit.to_lowercase());
    let equals = |lit: &str| format!("{uuid} == {lit}");
    if !s.use_types.is_empty() {
        out.push(any_of(&s.use_types, &contains)?);
    }
    if !s.nouse_types.is_empty() {
        out.push(format!("!({})", any_of(&s.nouse_types, &contains)?));
    }
    if !s.use_uuids.is_empty() {
        out.push(any_of(&s.use_uuids, &equals)?);
    }
    if !s.nouse_uuids.is_empty() {
        out.push(format!("!({})", any_of(&s.nouse_uuids, &equals)?));
    }
    Ok(out
        .into_iter()
        .map(|e| json!({"cel": {"expression": e}}))
        .collect())
}

/// `value` as a CEL string literal.
fn cel_string(value: &str) -> Result<String, TranslateError> {
    if value.chars().any(char::is_control) {
        return Err(TranslateError::ControlCharacter {
            value: value.to_string(),
        });
    }
    let mut lit = String::with_capacity(value.len() + 2);
    lit.push('"');
    for ch in value.chars() {
        if ch == '"' || ch == '\\' {
            lit.push('\\');
        }
        lit.push(ch);
    }
    lit.push('"');
    Ok(lit)
}

/// Where container `name` of `kind` sits: `("initContainers" | "containers", index)`.
fn container_index(pod: &Pod, name: &str, kind: ContainerKind) -> (&'static str, usize) {
    let spec = pod.spec.as_ref();
    let (list, containers) = match kind {
        ContainerKind::App => ("containers", spec.map(|s| s.containers.as_slice())),
        ContainerKind::Init | ContainerKind::Sidecar => (
            "initContainers",
            spec.and_then(|s| s.init_containers.as_deref()),
        ),
    };
    let index = containers
        .unwrap_or_default()
        .iter()
        .position(|c| c.name == name)
        .unwrap_or(0);
    (list, index)
}

fn container_at<'a>(
    pod: &'a Pod,
    list: &str,
    index: usize,
) -> Option<&'a k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref()?;
    match list {
        "containers" => spec.containers.get(index),
        _ => spec.init_containers.as_ref()?.get(index),
    }
}

/// Patch operations removing the container's vGPU resources from its limits and
/// requests; returns what was there (limits over requests, as the request is read).
fn remove_vgpu_resources(
    pod: &Pod,
    list: &str,
    index: usize,
    names: &ResourceNames,
    path: &PointerBuf,
    patch: &mut Vec<PatchOperation>,
) -> BTreeMap<String, String> {
    let mut kept = BTreeMap::new();
    let Some(resources) = container_at(pod, list, index).and_then(|c| c.resources.as_ref()) else {
        return kept;
    };
    let vgpu: Vec<&str> = std::iter::once(names.gpu.as_str())
        .chain(names.share_names())
        .collect();
    for (field, map) in [
        ("requests", &resources.requests),
        ("limits", &resources.limits),
    ] {
        let Some(map) = map else { continue };
        for (name, q) in map.iter().filter(|(n, _)| vgpu.contains(&n.as_str())) {
            kept.insert(name.clone(), q.0.clone());
            patch.push(PatchOperation::Remove(RemoveOperation {
                path: path.with_trailing_token(field).with_trailing_token(name),
            }));
        }
    }
    kept
}

/// 32-bit FNV-1a: a short, stable name suffix (not a security measure: the webhook
/// compares a taken name's spec before using it).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vgpu::{pod_request, RequestConfig};

    fn pod(containers: Value, annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
               "spec": {"containers": containers}})
    }

    fn main_with(limits: Value) -> Value {
        json!([{"name": "main", "image": "cuda", "resources": {"limits": limits}}])
    }

    fn run(pod: &Value) -> Result<Translation, TranslateError> {
        let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
        let config = RequestConfig::default();
        let request = pod_request(&pod, &config).unwrap().unwrap();
        translate(&pod, &request, &ResourceNames::new(&config.prefix))
    }

    /// Applies the patch as the API server does (RFC 6902).
    fn apply(mut doc: Value, ops: &[PatchOperation]) -> Value {
        json_patch::patch(&mut doc, ops).unwrap_or_else(|e| panic!("{e}: {ops:?}"));
        doc
    }

    #[test]
    fn the_issues_pod_becomes_one_claim_of_its_memory_and_cores() {
        let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                            "nvidia.com/gpucores": "30", "cpu": "2"});
        let before = pod(main_with(limits), json!({}));
        let t = run(&before).unwrap();
        assert_eq!(t.templates.len(), 1);
        let template = &t.templates[0];
        assert!(
            template.name.starts_with("tessera-vgpu-1x10240mib-30c-"),
            "{}",
            template.name
        );
        assert_eq!(
            template.spec,
            json!({"spec": {"devices": {"requests": [{"name": "vgpu-0", "exactly": {
                "deviceClassName": "vgpu.gpu.tessera.io", "allocationMode": "ExactCount",
                "count": 1,
                "capacity": {"requests": {"memory": "10240Mi", "cores": "30"}}}}]}}})
        );
        let after = apply(before, &t.patch);
        let main = &after["spec"]["containers"][0];
        assert_eq!(main["resources"]["limits"], json!({"cpu": "2"}));
        assert_eq!(
            main["resources"]["claims"],
            json!([{"name": "tessera-vgpu-0"}])
        );
        assert_eq!(
            after["spec"]["resourceClaims"],
            json!([{"name": "tessera-vgpu-0", "resourceClaimTemplateName": template.name}])
        );
        let kept: Value = serde_json::from_str(
            after["metadata"]["annotations"][ORIGINAL_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            kept,
            json!({"main": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                            "nvidia.com/gpucores": "30"}})
        );
        // Still a valid Pod, and not a vGPU pod any more: a second call changes nothing.
        let again: Pod = serde_json::from_value(after).unwrap();
        assert_eq!(
            pod_request(&again, &RequestConfig::default()).unwrap(),
            None
        );
    }

    #[test]
    fn several_vgpus_land_on_distinct_gpus_of_the_named_models() {
        let limits = json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000",
                            "nvidia.com/gpucores": "50"});
        let annotations = json!({"nvidia.com/use-gputype": "A100,H100",
                                 "nvidia.com/nouse-gpuuuid": "GPU-bad\"id"});
        let t = run(&pod(main_with(limits), annotations)).unwrap();
        let devices = &t.templates[0].spec["spec"]["devices"];
        assert_eq!(devices["requests"].as_array().unwrap().len(), 2);
        assert_eq!(
            devices["constraints"],
            json!([{"requests": ["vgpu-0", "vgpu-1"], "distinctAttribute": "gpu.tessera.io/uuid"}])
        );
        let model = r#"device.attributes["gpu.tessera.io"].productName.lowerAscii()"#;
        let uuid = r#"device.attributes["gpu.tessera.io"].uuid"#;
        assert_eq!(
            devices["requests"][1]["exactly"]["selectors"],
            json!([
                {"cel": {"expression": format!(r#"{model}.contains("a100") || {model}.contains("h100")"#)}},
                {"cel": {"expression": format!(r#"!({uuid} == "GPU-bad\"id")"#)}},
            ])
        );
    }

    #[test]
    fn containers_asking_the_same_share_one_template_and_keep_their_claims() {
        let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                            "nvidia.com/gpucores": "20"});
        let containers = json!([
            {"name": "a", "image": "cuda", "resources": {"requests": limits.clone(), "limits": limits.clone()}},
            {"name": "b", "image": "cuda", "resources": {"limits": limits, "claims": [{"name": "other"}]}},
        ]);
        let mut before = pod(containers, json!({}));
        before["spec"]["resourceClaims"] =
            json!([{"name": "other", "resourceClaimName": "scratch"}]);
        let t = run(&before).unwrap();
        assert_eq!(t.templates.len(), 1);
        let after = apply(before, &t.patch);
        let claims = after["spec"]["resourceClaims"].as_array().unwrap();
        assert_eq!(claims.len(), 3);
        assert_eq!(claims[1]["name"], "tessera-vgpu-0");
        assert_eq!(claims[2]["name"], "tessera-vgpu-1");
        assert_eq!(
            claims[1]["resourceClaimTemplateName"],
            claims[2]["resourceClaimTemplateName"]
        );
        let a = &after["spec"]["containers"][0]["resources"];
        assert_eq!((&a["limits"], &a["requests"]), (&json!({}), &json!({})));
        assert_eq!(
            after["spec"]["containers"][1]["resources"]["claims"],
            json!([{"name": "other"}, {"name": "tessera-vgpu-1"}])
        );
    }

    #[test]
    fn what_dra_cannot_say_is_refused_with_the_reason() {
        let cases = [
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25",
                    "nvidia.com/gpucores": "30"}),
                "memory 25% of the memory cannot be a DRA capacity request",
            ),
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}),
                "memory 100% of the memory cannot be a DRA capacity request",
            ),
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}),
                "nvidia.com/gpucores 0 (no SM limit) cannot be a DRA slice",
            ),
        ];
        for (limits, want) in cases {
            let e = run(&pod(main_with(limits.clone()), json!({})))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(want) && e.contains("--vgpu-mode extender"),
                "{limits}: {e}"
            );
        }
        let mut taken = pod(
            main_with(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024",
                             "nvidia.com/gpucores": "10"})),
            json!({}),
        );
        taken["spec"]["resourceClaims"] =
            json!([{"name": "tessera-vgpu-0", "resourceClaimName": "x"}]);
        assert_eq!(
            run(&taken).unwrap_err(),
            TranslateError::ClaimNameTaken {
                name: "tessera-vgpu-0".into()
            }
        );
        let control = pod(
            main_with(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024",
                             "nvidia.com/gpucores": "10"})),
            json!({"nvidia.com/use-gputype": "A100\u{7}"}),
        );
        assert!(matches!(
            run(&control),
            Err(TranslateError::ControlCharacter { .. })
        ));
    }

    #[test]
    fn the_name_follows_the_spec() {
        let a = template(1, 1024, 10, &[]);
        assert_eq!(a, template(1, 1024, 10, &[]));
        assert_ne!(a.name, template(1, 1024, 11, &[]).name);
        let sel = [json!({"cel": {"expression": "true"}})];
        assert_ne!(a.name, template(1, 1024, 10, &sel).name);
        assert!(a.name.len() <= 63, "{}", a.name);
    }
}
