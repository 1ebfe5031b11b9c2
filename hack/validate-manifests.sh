#!/usr/bin/env bash
# Validate every Kubernetes object in daemonset/ against the official OpenAPI schemas
# (kubernetes-validate from PyPI), strictly (unknown fields rejected), for each supported
# Kubernetes version.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install --quiet kubernetes-validate
fi
for v in 1.34.0 1.35.0; do
  kubernetes-validate --strict --quiet -k "$v" daemonset/node/*.yaml daemonset/dra/*.yaml
  # Example ResourceClaims / ResourceClaimTemplates (and the pods using them).
  kubernetes-validate --strict --quiet -k "$v" daemonset/examples/claims/*.yaml
done
# The quota controller: CRDs (apiextensions.k8s.io/v1), Deployment, RBAC, Service, webhook.
for v in 1.34.0 1.35.0; do
  kubernetes-validate --strict --quiet -k "$v" daemonset/controller/*.yaml
done
echo "manifests valid for Kubernetes 1.34 and 1.35"
