//! The API resources the controller reads that k8s-openapi has no type for: its own queue
//! CRDs (`tessera.io/v1alpha1`) and the DRA kinds (`resource.k8s.io/v1`). A leaf.

use kube::api::{ApiResource, GroupVersionKind};

/// A `tessera.io/v1alpha1` kind with its plural.
pub fn crd_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tessera.io", "v1alpha1", kind),
        plural,
    )
}

/// The four queue kinds: (kind, plural).
pub const QUEUE_KINDS: [(&str, &str); 4] = [
    ("ResourceFlavor", "resourceflavors"),
    ("ClusterQueue", "clusterqueues"),
    ("LocalQueue", "localqueues"),
    ("WorkloadPriorityClass", "workloadpriorityclasses"),
];

/// `resource.k8s.io/v1` kinds pods refer to for DRA devices.
pub fn dra_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("resource.k8s.io", "v1", kind),
        plural,
    )
}
