//! The vGPU pod webhook (`POST /vgpu`), pure: a pod that asks for HAMi-style vGPU
//! shares (`nvidia.com/gpumem`, `gpumem-percentage`, `gpucores` in any container or init
//! container) is checked with [`crate::vgpu::pod_request`] and sent to Tessera's
//! scheduler profile (`spec.schedulerName`, the kube-scheduler profile that calls the
//! extender), whether or not it names a queue. The HTTPS shell is `webhook_server.rs`;
//! the API server calls this path only for the pods the `vgpu-pods.admission.tessera.io`
//! entry's `matchConditions` select (`daemonset/components/vgpu-scheduler`).
//!
//! In DRA mode ([`VgpuMode::Dra`], `--vgpu-mode dra`) the pod is instead rewritten into
//! ResourceClaims of `vgpu.gpu.tessera.io` ([`crate::vgpu::dra_claim`]) and left to the
//! stock scheduler; [`plan`] returns the templates the server creates before answering.
//!
//! Left alone: a pod that names another scheduler (anything but `default-scheduler`,
//! which the API server fills in when the field is empty, and Tessera's own), since it
//! is that scheduler's to judge; a pod with `spec.nodeName` already set keeps its
//! scheduler (nothing schedules it) but is still checked. A pod asking for
//! `nvidia.com/gpu` alone may be a whole-GPU pod of the device plugin: it is sent to
//! Tessera's scheduler only with [`VgpuOptions::plain_gpu`] (docs/install.md).

use super::webhook::{respond, BadReview, Request, Review, Verdict};
use crate::vgpu;
use crate::vgpu::dra_claim::{self, ClaimTemplate};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::Operation;
use serde_json::{json, Value};

/// The scheduler name the API server gives a pod that names none.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// The scheduler profile of `daemonset/components/vgpu-scheduler`.
pub const DEFAULT_SCHEDULER_NAME: &str = "tessera-scheduler";

/// How vGPU pods reach a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VgpuMode {
    /// Tessera's scheduler profile, which calls the extender (`spec.schedulerName`).
    #[default]
    Extender,
    /// ResourceClaims of `vgpu.gpu.tessera.io`, placed by the stock scheduler (DRA
    /// consumable capacity, Kubernetes 1.34+ with `DRAConsumableCapacity`).
    Dra,
}

impl std::str::FromStr for VgpuMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "extender" => Ok(VgpuMode::Extender),
            "dra" => Ok(VgpuMode::Dra),
            other => Err(format!("vGPU mode {other:?}: expected extender or dra")),
        }
    }
}

/// What the vGPU webhook does besides checking the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VgpuOptions {
    /// Extender (the default) or DRA.
    pub mode: VgpuMode,
    /// The scheduler profile set on vGPU pods (`--vgpu-scheduler-name`); `None`: the
    /// pods are only checked.
    pub scheduler_name: Option<String>,
    /// Pods asking for `nvidia.com/gpu` alone go to the profile too
    /// (`--vgpu-scheduler-plain-gpu`), as HAMi sends them; off by default.
    pub plain_gpu: bool,
}

impl Default for VgpuOptions {
    fn default() -> Self {
        VgpuOptions {
            mode: VgpuMode::Extender,
            scheduler_name: Some(DEFAULT_SCHEDULER_NAME.to_string()),
            plain_gpu: false,
        }
    }
}

impl VgpuOptions {
    /// From the flags: an empty scheduler name sets none.
    pub fn new(scheduler_name: &str, plain_gpu: bool) -> Self {
        VgpuOptions {
            mode: VgpuMode::Extender,
            scheduler_name: Some(scheduler_name.trim())
                .filter(|n| !n.is_empty())
                .map(str::to_string),
            plain_gpu,
        }
    }
}

/// Answers an AdmissionReview (`admission.k8s.io/v1`) sent to `/vgpu`, without creating
/// the templates a DRA-mode answer refers to (the server creates them, [`plan`]).
pub fn review(body: &Value, options: &VgpuOptions) -> Result<Review, BadReview> {
    let request = super::webhook::request(body)?;
    Ok(respond(&request, decide(&request, options)))
}

/// The decision for one `request` of an AdmissionReview sent to `/vgpu`.
pub fn decide(request: &Request, options: &VgpuOptions) -> Verdict {
    plan(request, options).verdict
}

/// A decision and what must exist before it is answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub verdict: Verdict,
    /// DRA mode: templates the patch refers to, to create in `namespace` first.
    pub templates: Vec<ClaimTemplate>,
    pub namespace: String,
    /// A dry-run request: nothing may be created.
    pub dry_run: bool,
}

/// The decision for one `request`, with the templates it needs.
pub fn plan(request: &Request, options: &VgpuOptions) -> Plan {
    let mut plan = Plan {
        verdict: Verdict::Allow(Vec::new()),
        templates: Vec::new(),
        namespace: request.namespace.clone().unwrap_or_default(),
        dry_run: request.dry_run,
    };
    let kind = &request.kind;
    let pod = (kind.group.as_str(), kind.kind.as_str()) == ("", "Pod");
    if request.operation != Operation::Create || !pod {
        return plan;
    }
    let Some(object) = request.object.as_ref() else {
        plan.verdict = Verdict::Deny("Pod: request.object is missing".into());
        return plan;
    };
    // A pod that does not decode is left to the API server's own validation.
    let Ok(pod) = object.clone().try_parse::<Pod>() else {
        return plan;
    };
    match options.mode {
        VgpuMode::Extender => plan.verdict = route_to_extender(&pod, options),
        VgpuMode::Dra => match translate_to_dra(&pod) {
            Ok(Some(_)) if plan.namespace.is_empty() => {
                plan.verdict = Verdict::Deny("Pod: request.namespace is missing".into());
            }
            Ok(Some(t)) => {
                plan.verdict = Verdict::Allow(t.patch);
                plan.templates = t.templates;
            }
            Ok(None) => {}
            Err(message) => plan.verdict = Verdict::Deny(message),
        },
    }
    plan
}

/// DRA mode: the pod's vGPU request as ResourceClaims, `None` when it is not ours
/// (no vGPU shares, another scheduler's, already on a node), `Err` with the denial.
fn translate_to_dra(pod: &Pod) -> Result<Option<dra_claim::Translation>, String> {
    let config = vgpu::RequestConfig::default();
    let names = vgpu::request::ResourceNames::new(&config.prefix);
    if !vgpu::request::carries_vgpu_resources(pod, &names) {
        return Ok(None);
    }
    let spec = pod.spec.as_ref();
    let current = spec.and_then(|s| s.scheduler_name.as_deref()).unwrap_or("");
    if !current.is_empty() && current != DEFAULT_SCHEDULER {
        return Ok(None);
    }
    let request = match vgpu::pod_request(pod, &config) {
        Err(e) => return Err(format!("Pod: {e}")),
        Ok(None) => return Ok(None),
        Ok(Some(r)) => r,
    };
    // A pod on a node already is not scheduled: its claims could never be allocated.
    if spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        return Ok(None);
    }
    dra_claim::translate(pod, &request, &names)
        .map(Some)
        .map_err(|e| format!("Pod: {e}"))
}

/// Extender mode: the pod checked and sent to Tessera's scheduler profile.
fn route_to_extender(pod: &Pod, options: &VgpuOptions) -> Verdict {
    let config = vgpu::RequestConfig::default();
    let names = vgpu::request::ResourceNames::new(&config.prefix);
    let routed = vgpu::request::carries_vgpu_resources(pod, &names)
        || (options.plain_gpu && asks_for(pod, &names.gpu));
    if !routed {
        return Verdict::Allow(Vec::new());
    }
    let spec = pod.spec.as_ref();
    let current = spec.and_then(|s| s.scheduler_name.as_deref()).unwrap_or("");
    let ours = options.scheduler_name.as_deref();
    if !current.is_empty() && current != DEFAULT_SCHEDULER && Some(current) != ours {
        return Verdict::Allow(Vec::new());
    }
    match vgpu::pod_request(pod, &config) {
        Err(e) => return Verdict::Deny(format!("Pod: {e}")),
        // `nvidia.com/gpu: 0` and nothing else: no vGPU, nothing to schedule.
        Ok(None) => return Verdict::Allow(Vec::new()),
        Ok(Some(_)) => {}
    }
    let bound = spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    match ours {
        Some(name) if !bound && current != name => {
            Verdict::Allow(vec![PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["spec", "schedulerName"]),
                value: json!(name),
            })])
        }
        _ => Verdict::Allow(Vec::new()),
    }
}

/// Whether any container or init container names `resource` in its limits or requests.
fn asks_for(pod: &Pod, resource: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .any(|r| {
            [&r.limits, &r.requests]
                .into_iter()
                .flatten()
                .any(|m| m.contains_key(resource))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AdmissionReview of a pod CREATE, as the API server sends it.
    fn review_of(spec: Value, annotations: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u", "operation": "CREATE",
                   "kind": {"group": "", "version": "v1", "kind": "Pod"},
                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                   "namespace": "ml", "userInfo": {"username": "alice"},
                   "object": {"apiVersion": "v1", "kind": "Pod",
                              "metadata": {"name": "p", "namespace": "ml",
                                           "annotations": annotations},
                              "spec": spec}}})
    }

    fn request(spec: Value, annotations: Value) -> Request {
        parse(&review_of(spec, annotations))
    }

    fn parse(review: &Value) -> Request {
        super::super::webhook::request(review).unwrap()
    }

    fn set(name: &str) -> Verdict {
        Verdict::Allow(vec![PatchOperation::Add(AddOperation {
            path: PointerBuf::parse("/spec/schedulerName").unwrap(),
            value: json!(name),
        })])
    }

    fn main_with(limits: Value) -> Value {
        json!({"containers": [{"name": "main", "image": "cuda",
                               "resources": {"limits": limits}}],
               "schedulerName": "default-scheduler"})
    }

    const SET: &str = "set";
    const KEPT: &str = "kept";

    #[test]
    fn table() {
        let vgpu = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                          "nvidia.com/gpucores": "30"});
        let plain = json!({"nvidia.com/gpu": "1"});
        let with = |mut spec: Value, key: &str, value: Value| {
            spec[key] = value;
            spec
        };
        let unset = {
            let mut s = main_with(vgpu.clone());
            s.as_object_mut().unwrap().remove("schedulerName");
            s
        };
        let init_only = json!({
            "initContainers": [{"name": "warm", "image": "cuda",
                "resources": {"requests": {"nvidia.com/gpu": "1",
                                           "nvidia.com/gpumem-percentage": "25"}}}],
            "containers": [{"name": "main", "image": "cuda"}],
            "schedulerName": "default-scheduler"});
        let default = VgpuOptions::default();
        let plain_on = VgpuOptions::new("tessera-scheduler", true);
        let check_only = VgpuOptions::new("", false);
        // (case, spec, options, SET / KEPT / the denial)
        let cases = [
            ("the issue's pod", main_with(vgpu.clone()), &default, SET),
            ("no schedulerName at all", unset, &default, SET),
            ("init container only, from requests", init_only, &default, SET),
            (
                "already Tessera's",
                with(main_with(vgpu.clone()), "schedulerName", json!("tessera-scheduler")),
                &default,
                KEPT,
            ),
            (
                "another scheduler is the user's choice",
                with(main_with(vgpu.clone()), "schedulerName", json!("hami-scheduler")),
                &default,
                KEPT,
            ),
            (
                "another scheduler's pod is not judged",
                with(
                    main_with(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"})),
                    "schedulerName",
                    json!("hami-scheduler"),
                ),
                &default,
                KEPT,
            ),
            (
                "already on a node",
                with(main_with(vgpu.clone()), "nodeName", json!("gpu-1")),
                &default,
                KEPT,
            ),
            ("whole-GPU pod by default", main_with(plain.clone()), &default, KEPT),
            ("whole-GPU pod with plain_gpu", main_with(plain.clone()), &plain_on, SET),
            (
                "gpu: 0 alone with plain_gpu",
                main_with(json!({"nvidia.com/gpu": "0"})),
                &plain_on,
                KEPT,
            ),
            ("CPU pod", main_with(json!({"cpu": "1"})), &plain_on, KEPT),
            ("name flag empty: checked only", main_with(vgpu.clone()), &check_only, KEPT),
            (
                "invalid request",
                main_with(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"})),
                &default,
                "Pod: container \"main\": nvidia.com/gpucores is 150, above 100 (% of the GPU's SMs)",
            ),
            (
                "invalid even when only checked",
                main_with(json!({"nvidia.com/gpumem": "1024"})),
                &check_only,
                "Pod: container \"main\": nvidia.com/gpumem without nvidia.com/gpu; add nvidia.com/gpu: 1 (HAMi adds it silently, Tessera asks you to write it)",
            ),
            (
                "invalid and already on a node",
                with(
                    main_with(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10Gi"})),
                    "nodeName",
                    json!("gpu-1"),
                ),
                &default,
                "Pod: container \"main\": nvidia.com/gpumem \"10Gi\" has a unit; it counts MiB (write 10240 for 10 GiB)",
            ),
        ];
        for (name, spec, options, want) in cases {
            let verdict = decide(&request(spec, json!({})), options);
            let expected = match want {
                SET => set("tessera-scheduler"),
                KEPT => Verdict::Allow(Vec::new()),
                denial => Verdict::Deny(denial.to_string()),
            };
            assert_eq!(verdict, expected, "{name}");
        }
    }

    #[test]
    fn annotations_of_a_routed_plain_pod_are_checked() {
        let spec = main_with(json!({"nvidia.com/gpu": "2"}));
        let bad = json!({"hami.io/gpu-scheduler-policy": "topology-aware"});
        let on = VgpuOptions::new("tessera-scheduler", true);
        assert!(
            matches!(decide(&request(spec.clone(), bad.clone()), &on), Verdict::Deny(m)
            if m.contains("hami.io/gpu-scheduler-policy"))
        );
        // Not routed: not ours to judge.
        assert_eq!(
            decide(&request(spec, bad), &VgpuOptions::default()),
            Verdict::Allow(Vec::new())
        );
    }

    #[test]
    fn other_operations_and_kinds_pass_untouched() {
        let spec = main_with(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}));
        let mut update = review_of(spec.clone(), json!({}));
        update["request"]["operation"] = json!("UPDATE");
        let mut job = review_of(spec, json!({}));
        job["request"]["kind"] = json!({"group": "batch", "version": "v1", "kind": "Job"});
        for r in [update, job] {
            assert_eq!(
                decide(&parse(&r), &VgpuOptions::default()),
                Verdict::Allow(Vec::new())
            );
        }
        let mut missing = review_of(json!({}), json!({}));
        missing["request"].as_object_mut().unwrap().remove("object");
        assert_eq!(
            decide(&parse(&missing), &VgpuOptions::default()),
            Verdict::Deny("Pod: request.object is missing".into())
        );
        // A dry run is told to the server, which then creates nothing.
        let mut dry = review_of(json!({}), json!({}));
        assert!(!plan(&parse(&dry), &VgpuOptions::default()).dry_run);
        dry["request"]["dryRun"] = json!(true);
        let plan = plan(&parse(&dry), &VgpuOptions::default());
        assert!(plan.dry_run);
        assert_eq!(plan.namespace, "ml");
    }

    #[test]
    fn scheduler_name_flag() {
        assert_eq!(VgpuOptions::new(" ", false).scheduler_name, None);
        assert_eq!(
            VgpuOptions::new("gpu-sched", false)
                .scheduler_name
                .as_deref(),
            Some("gpu-sched")
        );
        assert_eq!(
            VgpuOptions::default(),
            VgpuOptions::new(DEFAULT_SCHEDULER_NAME, false)
        );
    }
}
