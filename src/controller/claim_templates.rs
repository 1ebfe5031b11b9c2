//! The ResourceClaimTemplates of the vGPU webhook's DRA mode (`--vgpu-mode dra`,
//! [`crate::vgpu::dra_claim`]): created in the pod's namespace while the pod is admitted,
//! before the webhook answers, so the kube-controller-manager finds the template when it
//! makes the pod's claims. A template's name is derived from its spec, so pods asking
//! the same share one, and creating it again is a no-op; a name already taken by another
//! spec (a tenant's object of that name, say) refuses the pod rather than run it under
//! someone else's request.
//!
//! The webhook is registered with `sideEffects: NoneOnDryRun`: a dry-run request gets the
//! same patch and creates nothing.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::resource::v1::{ResourceClaimSpec, ResourceClaimTemplate};
use kube::api::{Api, PostParams};

use crate::vgpu::dra_claim::ClaimTemplate;

/// The outcome of making sure one template exists: `Err` carries the reason for the pod.
pub type Ensured<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Where the webhook's DRA mode creates templates.
pub trait TemplateSink: Send + Sync + 'static {
    /// Makes sure `template` exists in `namespace` with exactly its spec.
    fn ensure<'a>(&'a self, namespace: &'a str, template: &'a ClaimTemplate) -> Ensured<'a>;
}

/// No API access (extender mode, tests): every template is refused with the reason.
pub struct NoTemplates;

impl TemplateSink for NoTemplates {
    fn ensure<'a>(&'a self, _namespace: &'a str, template: &'a ClaimTemplate) -> Ensured<'a> {
        let reason = format!(
            "ResourceClaimTemplate {}: this webhook server cannot create templates (DRA mode without API access)",
            template.name
        );
        Box::pin(async move { Err(reason) })
    }
}

/// Templates created through the API server.
pub struct ApiTemplates(pub kube::Client);

impl TemplateSink for ApiTemplates {
    fn ensure<'a>(&'a self, namespace: &'a str, template: &'a ClaimTemplate) -> Ensured<'a> {
        Box::pin(async move { ensure(&self.0, namespace, template).await })
    }
}

async fn ensure(
    client: &kube::Client,
    namespace: &str,
    template: &ClaimTemplate,
) -> Result<(), String> {
    let name = &template.name;
    let wanted: ResourceClaimTemplate = serde_json::from_value(template.object(namespace))
        .map_err(|e| format!("ResourceClaimTemplate {name}: {e}"))?;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    match api.create(&PostParams::default(), &wanted).await {
        Ok(_) => {
            tracing::info!(
                namespace,
                name,
                "created ResourceClaimTemplate for vGPU pods"
            );
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let existing = api
                .get(name)
                .await
                .map_err(|e| format!("ResourceClaimTemplate {namespace}/{name}: {e}"))?;
            if same_request(&existing.spec.spec, &wanted.spec.spec) {
                Ok(())
            } else {
                Err(format!(
                    "ResourceClaimTemplate {namespace}/{name} exists with another request; Tessera names its templates after their spec, so delete that object"
                ))
            }
        }
        Err(e) => Err(format!(
            "cannot create ResourceClaimTemplate {namespace}/{name}: {e}"
        )),
    }
}

/// Whether two claim specs ask for the same devices (compared as the API server stores
/// them; the translation writes every field the server would default).
fn same_request(a: &ResourceClaimSpec, b: &ResourceClaimSpec) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}
