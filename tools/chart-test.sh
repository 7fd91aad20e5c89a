#!/usr/bin/env bash
# `make chart-test`: the Helm chart (charts/gpu-remediator) and manifests/ are one installation.
#  1. the chart's copies (CRDs, alerts, dashboard) are current (`make chart-sync` refreshes them);
#  2. `helm lint --strict` is clean for the default values and every charts/gpu-remediator/ci/ file;
#  3. `helm template` with default values yields the same objects as `kubectl kustomize manifests/`
#     less its Namespace (manifests/namespace.yaml, applied before `helm install`), and with
#     ci/all-optional-values.yaml the same as manifests/ with every optional component
#     (tools/chart-test/all-optional). Objects are compared parsed, keyed by kind/namespace/name.
# helm, kubectl (the control plane's) and kube-objects are built from pinned Go modules and cached.
set -euo pipefail
cd "$(dirname "$0")/.."
chart=charts/gpu-remediator
helm=$(tools/build.sh helm)
objects=$(tools/build.sh kube-objects)
kubectl="$(e2e/controlplane/build.sh)/kubectl"
out=$(mktemp -d)
trap 'rm -rf "${out}"' EXIT

stale=false
for crd in crds/gpuremediation*.yaml; do
  cmp -s "${crd}" "${chart}/crds/$(basename "${crd}")" || { echo "${chart}/crds/ differs from ${crd}" >&2; stale=true; }
done
cmp -s manifests/optional/dashboard/gpu-remediator.json "${chart}/files/gpu-remediator.json" \
  || { echo "${chart}/files/gpu-remediator.json differs from manifests/optional/dashboard/" >&2; stale=true; }
if $stale; then
  echo "run \`make chart-sync\` to refresh the chart's copies" >&2
  exit 1
fi

"${helm}" lint --strict "${chart}"
for values in "${chart}"/ci/*-values.yaml; do
  "${helm}" lint --strict "${chart}" --values "${values}"
done

"${helm}" template gpu-remediator "${chart}" --namespace gpu-remediation --include-crds > "${out}/chart.yaml"
printf -- '---\n' >> "${out}/chart.yaml"
cat manifests/namespace.yaml >> "${out}/chart.yaml"
"${kubectl}" kustomize manifests > "${out}/kustomize.yaml"
"${objects}" same "${out}/chart.yaml" "${out}/kustomize.yaml"

"${helm}" template gpu-remediator "${chart}" --namespace gpu-remediation --include-crds \
  --values "${chart}/ci/all-optional-values.yaml" > "${out}/chart-all.yaml"
printf -- '---\n' >> "${out}/chart-all.yaml"
cat manifests/namespace.yaml >> "${out}/chart-all.yaml"
"${kubectl}" kustomize tools/chart-test/all-optional > "${out}/kustomize-all.yaml"
"${objects}" same "${out}/chart-all.yaml" "${out}/kustomize-all.yaml"
