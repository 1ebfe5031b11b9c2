//! The queue CRDs (`tessera.io/v1alpha1`), generated from the engine's own spec types
//! (`quota::api`) with kube's `CustomResource` derive: a Kueue manifest ports by changing
//! its `apiVersion`. `tessera controller crds` prints them; `daemonset/controller/crds.yaml`
//! is that output, and a test keeps the two equal.

use super::workload_record::{WorkloadSpec, WorkloadStatus};
use crate::quota::api::{ClusterQueueSpec as CqSpec, LocalQueueSpec as LqSpec, ResourceFlavorSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `ResourceFlavor` (cluster-scoped): `nodeLabels`, `nodeTaints`, `tolerations`.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "ResourceFlavor",
    root = "ResourceFlavorResource",
    shortname = "rf"
)]
pub struct ResourceFlavorFields {
    #[serde(flatten)]
    pub spec: ResourceFlavorSpec,
}

/// `ClusterQueue` (cluster-scoped): quotas per flavor, cohort, queueing and preemption.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "ClusterQueue",
    root = "ClusterQueueResource",
    shortname = "cq",
    status = "ClusterQueueStatus",
    printcolumn = r#"{"name":"Cohort","type":"string","jsonPath":".spec.cohortName"}"#,
    printcolumn = r#"{"name":"Admitted","type":"integer","jsonPath":".status.admittedWorkloads"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingWorkloads"}"#
)]
pub struct ClusterQueueFields {
    #[serde(flatten)]
    pub spec: CqSpec,
}

/// Status of a ClusterQueue, as Kueue reports it (counts only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueStatus {
    #[serde(default)]
    pub admitted_workloads: i64,
    #[serde(default)]
    pub pending_workloads: i64,
}

/// `LocalQueue` (namespaced): what users put in `tessera.io/queue-name`.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "LocalQueue",
    root = "LocalQueueResource",
    namespaced,
    shortname = "lq",
    printcolumn = r#"{"name":"ClusterQueue","type":"string","jsonPath":".spec.clusterQueue"}"#
)]
pub struct LocalQueueFields {
    #[serde(flatten)]
    pub spec: LqSpec,
}

/// `WorkloadPriorityClass` (cluster-scoped): `value` and `description` at the top level,
/// like Kueue's (and like `scheduling.k8s.io` PriorityClass).
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "WorkloadPriorityClass",
    root = "WorkloadPriorityClassResource",
    no_spec,
    printcolumn = r#"{"name":"Value","type":"integer","jsonPath":".value"}"#
)]
pub struct WorkloadPriorityClassFields {
    pub value: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `Workload` (namespaced, short name `wl`): the controller's record of one workload
/// ([`super::workload_record`]), with Kueue's field names. Written by the controller only.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "Workload",
    root = "WorkloadResource",
    namespaced,
    shortname = "wl",
    status = "WorkloadStatus",
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".spec.queueName"}"#,
    printcolumn = r#"{"name":"Reserved in","type":"string","jsonPath":".status.admission.clusterQueue"}"#,
    printcolumn = r#"{"name":"Admitted","type":"string","jsonPath":".status.conditions[?(@.type==\"Admitted\")].status"}"#,
    printcolumn = r#"{"name":"Finished","type":"string","jsonPath":".status.conditions[?(@.type==\"Finished\")].status"}"#,
    printcolumn = r#"{"name":"Position","type":"string","jsonPath":".status.positionInClusterQueue"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"QuotaReserved\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct WorkloadFields {
    #[serde(flatten)]
    pub spec: WorkloadSpec,
}

/// Every CRD the controller serves, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![
        ResourceFlavorResource::crd(),
        ClusterQueueResource::crd(),
        LocalQueueResource::crd(),
        WorkloadPriorityClassResource::crd(),
        WorkloadResource::crd(),
        inference_scaler_crd(),
    ]
}

/// `InferenceScaler` (namespaced, short name `isc`): KEDA's ScaledObject fields
/// ([`crate::autoscale::ScalerSpec`]). Its `spec` keeps unknown fields on purpose: the API
/// server would prune a misspelt field silently, and the scaler would run without it;
/// kept, the controller refuses the spec naming the field (`Ready=False`, an Event) and
/// leaves the target as it is.
pub fn inference_scaler_crd() -> CustomResourceDefinition {
    let free = serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "inferencescalers.tessera.io"},
        "spec": {
            "group": "tessera.io",
            "scope": "Namespaced",
            "names": {
                "kind": "InferenceScaler",
                "listKind": "InferenceScalerList",
                "plural": "inferencescalers",
                "singular": "inferencescaler",
                "shortNames": ["isc"]
            },
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Target", "type": "string", "jsonPath": ".spec.scaleTargetRef.name"},
                    {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicaCount"},
                    {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicaCount"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".status.desiredReplicas"},
                    {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                    {"name": "Active", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Active\")].status"}
                ],
                "schema": {"openAPIV3Schema": {
                    "description": "Scales a target with a /scale subresource from Prometheus queries, with KEDA's ScaledObject fields, coupled with Tessera's quota.",
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": free,
                        "status": free
                    }
                }}
            }]
        }
    });
    // A literal of the type's own shape: deserializing it cannot fail.
    serde_json::from_value(crd).unwrap_or_default()
}

/// The CRDs as one multi-document YAML stream (what `tessera controller crds` prints).
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::from("# Generated by `tessera controller crds`; do not edit.\n");
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_use_kueue_field_names_in_the_tessera_group() {
        let crds = crds();
        let names: Vec<&str> = crds.iter().map(|c| c.spec.names.kind.as_str()).collect();
        assert_eq!(
            names,
            [
                "ResourceFlavor",
                "ClusterQueue",
                "LocalQueue",
                "WorkloadPriorityClass",
                "Workload",
                "InferenceScaler"
            ]
        );
        for crd in &crds {
            assert_eq!(crd.spec.group, "tessera.io");
            assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        }
        let cq = serde_json::to_value(&crds[1]).unwrap();
        let spec = &cq["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let quota = &spec["properties"]["resourceGroups"]["items"]["properties"]["flavors"]
            ["items"]["properties"]["resources"]["items"]["properties"];
        for field in ["nominalQuota", "borrowingLimit", "lendingLimit"] {
            assert_eq!(quota[field]["x-kubernetes-int-or-string"], true, "{field}");
        }
        for field in [
            "cohortName",
            "queueingStrategy",
            "preemption",
            "flavorFungibility",
            "namespaceSelector",
            "stopPolicy",
        ] {
            assert!(spec["properties"][field].is_object(), "{field}");
        }
        let wpc = serde_json::to_value(&crds[3]).unwrap();
        let top = &wpc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert!(top["value"].is_object() && top["spec"].is_null());
        let wl = serde_json::to_value(&crds[4]).unwrap();
        let top = &wl["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert!(top["spec"]["properties"]["queueName"].is_object());
        let status = &top["status"]["properties"];
        for field in [
            "admission",
            "conditions",
            "requeueState",
            "positionInClusterQueue",
        ] {
            assert!(status[field].is_object(), "{field}");
        }
        assert_eq!(wl["spec"]["names"]["shortNames"][0], "wl");
    }

    #[test]
    fn a_kueue_cluster_queue_reads_as_the_crd_and_the_engine_type() {
        let yaml = r#"
apiVersion: tessera.io/v1alpha1
kind: ClusterQueue
metadata: {name: team-a}
spec:
  cohortName: research
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: h100
      resources: [{name: nvidia.com/gpu, nominalQuota: 8, borrowingLimit: 4}]
  preemption: {withinClusterQueue: LowerPriority, reclaimWithinCohort: Any}
"#;
        let typed: ClusterQueueResource = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(typed.spec.spec.cohort_name.as_deref(), Some("research"));
        let plain: crate::quota::api::ClusterQueue = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(plain.spec, typed.spec.spec);
    }
}
