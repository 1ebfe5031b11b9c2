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
# What `kubectl apply -k` installs: daemonset/ (DRA, 1.34+) and daemonset/ with the no-dra
# component, rendered by kustomize (kubectl's built-in) and validated as a whole.
if command -v kubectl >/dev/null 2>&1; then
  tmp=$(mktemp -d -p "$PWD")
  trap 'rm -rf "$tmp"' EXIT
  kubectl kustomize daemonset/ > "$tmp/dra.yaml"
  mkdir "$tmp/no-dra"
  printf 'resources: [../../daemonset]\ncomponents: [../../daemonset/components/no-dra]\n' \
    > "$tmp/no-dra/kustomization.yaml"
  kubectl kustomize "$tmp/no-dra" > "$tmp/no-dra.yaml"
  mkdir "$tmp/driver-container"
  printf 'resources: [../../daemonset]\ncomponents: [../../daemonset/components/driver-container]\n' \
    > "$tmp/driver-container/kustomization.yaml"
  kubectl kustomize "$tmp/driver-container" > "$tmp/driver-container.yaml"
  grep -q 'value: /run/nvidia/driver' "$tmp/driver-container.yaml"
  grep -q '^kind: DeviceClass' "$tmp/dra.yaml"
  if grep -q '^kind: DeviceClass' "$tmp/no-dra.yaml"; then
    echo "no-dra component left a DeviceClass" >&2; exit 1
  fi
  for v in 1.34.0 1.35.0; do
    kubernetes-validate --strict --quiet -k "$v" "$tmp/dra.yaml" "$tmp/no-dra.yaml" \
      "$tmp/driver-container.yaml"
  done
  echo "kustomizations (daemonset/, + components/no-dra, + components/driver-container) render and are valid"
else
  echo "kubectl not found: kustomize rendering not checked (tests/manifests.rs checks the structure)"
fi
echo "manifests valid for Kubernetes 1.34 and 1.35"
