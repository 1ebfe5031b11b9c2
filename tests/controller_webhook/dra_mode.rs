//! `POST /vgpu` in DRA mode (`--vgpu-mode dra`) over HTTPS, with templates created in the
//! API-server double: the issue's pod comes back as a pod with a claim, its template
//! exists (valid for Kubernetes 1.34 and 1.35, as is the patched pod); a second pod of the
//! same shape reuses it; a name taken by another spec refuses the pod and changes
//! nothing; a dry run creates nothing; what DRA cannot say is refused with the reason.

use crate::support::apiserver::ApiServer;
use crate::support::schema;
use crate::{apply, patch_ops, pod_review, post, test_server_parts, vgpu_pod, vgpu_server};
use serde_json::{json, Value};
use std::sync::Arc;
use tessera::controller::claim_templates::ApiTemplates;
use tessera::controller::vgpu_webhook::{VgpuMode, VgpuOptions};
use tessera::controller::webhook_server::run;
use tokio_util::sync::CancellationToken;

const TEMPLATES: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates";

#[tokio::test]
async fn vgpu_pods_become_resource_claims_in_dra_mode() {
    let api = ApiServer::empty().await;
    let (tls, listener, addr) = test_server_parts().await;
    let shutdown = CancellationToken::new();
    let dra = VgpuOptions {
        mode: VgpuMode::Dra,
        ..VgpuOptions::default()
    };
    let server = vgpu_server(tls, dra, Arc::new(ApiTemplates(api.client())));
    let task = tokio::spawn(run(server, listener, shutdown.clone()));
    let issue = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                       "nvidia.com/gpucores": "30"});

    // The issue's pod: a claim from a template that now exists; the scheduler untouched.
    let pod = vgpu_pod(json!({}), issue.clone(), "default-scheduler");
    let (code, out) = post(addr, "/vgpu", pod_review("d1", &pod)).await;
    assert_eq!(
        (code, &out["response"]["allowed"]),
        (200, &json!(true)),
        "{out}"
    );
    let after = apply(pod.clone(), &patch_ops(&out["response"]));
    assert_eq!(after["spec"]["schedulerName"], "default-scheduler");
    let template_name = after["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap()
        .to_string();
    let stored = api.objects(TEMPLATES);
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["metadata"]["name"], template_name.as_str());
    assert_eq!(
        stored[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"],
        json!({"requests": {"memory": "10240Mi", "cores": "30"}})
    );
    schema::validate_all(&[stored[0].clone(), after.clone()], &["1.34.0", "1.35.0"]);
    // Called again on its own output (reinvocation): nothing more to do.
    let (_, out) = post(addr, "/vgpu", pod_review("d1b", &after)).await;
    assert!(patch_ops(&out["response"]).is_empty(), "{out}");

    // Same shape again: the template is reused, not duplicated.
    let (_, out) = post(addr, "/vgpu", pod_review("d2", &pod)).await;
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert_eq!(api.objects(TEMPLATES).len(), 1);

    // A dry run: the same answer, nothing created.
    let bigger = vgpu_pod(
        json!({}),
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "50"}),
        "default-scheduler",
    );
    let mut dry: Value = serde_json::from_slice(&pod_review("d3", &bigger)).unwrap();
    dry["request"]["dryRun"] = json!(true);
    let (_, out) = post(addr, "/vgpu", serde_json::to_vec(&dry).unwrap()).await;
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert!(!patch_ops(&out["response"]).is_empty());
    assert_eq!(api.objects(TEMPLATES).len(), 1, "a dry run creates nothing");

    // That name taken by another spec (a tenant's object): refused, the object kept.
    let wanted = apply(bigger.clone(), &patch_ops(&out["response"]));
    let name = wanted["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap()
        .to_string();
    let squatter = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "vgpu-0", "exactly": {
            "deviceClassName": "vgpu.gpu.tessera.io", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "80Gi", "cores": "100"}}}}]}}}});
    api.put_object(TEMPLATES, squatter.clone());
    let (_, out) = post(addr, "/vgpu", pod_review("d4", &bigger)).await;
    assert_eq!(out["response"]["allowed"], false, "{out}");
    let message = out["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("exists with another request"), "{message}");
    let kept = api
        .objects(TEMPLATES)
        .into_iter()
        .find(|t| t["metadata"]["name"] == name.as_str())
        .unwrap();
    assert_eq!(kept["spec"], squatter["spec"]);

    // What DRA cannot say: refused with the reason, nothing created.
    let relative = vgpu_pod(
        json!({}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50",
               "nvidia.com/gpucores": "30"}),
        "default-scheduler",
    );
    let (_, out) = post(addr, "/vgpu", pod_review("d5", &relative)).await;
    assert_eq!(out["response"]["allowed"], false);
    let message = out["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("50% of the memory cannot be a DRA capacity request"),
        "{message}"
    );
    assert_eq!(api.objects(TEMPLATES).len(), 2);

    // Every request the webhook made is one the component's RBAC allows.
    crate::support::rbac::assert_allows_every_request(
        &api,
        "daemonset/components/vgpu-dra/rbac.yaml",
    );

    shutdown.cancel();
    task.await.unwrap().unwrap();
}
