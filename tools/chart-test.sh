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
for copy in manifests/optional/dashboard/gpu-remediator.json:gpu-remediator.json \
  manifests/agent/admission-policy.yaml:agent-admission-policy.yaml \
  manifests/approval/rbac.yaml:approval-rbac.yaml \
  manifests/approval/admission-policy.yaml:approval-admission-policy.yaml \
  manifests/controller/fence-policy.yaml:fence-policy.yaml \
  manifests/controller/records-policy.yaml:records-policy.yaml \
  manifests/controller/flow-schemas.yaml:flow-schemas.yaml \
  manifests/optional/diagnostics/diagnostics.yaml:diagnostics.yaml; do
  cmp -s "${copy%%:*}" "${chart}/files/${copy#*:}" \
    || { echo "${chart}/files/${copy#*:} differs from ${copy%%:*}" >&2; stale=true; }
done
cat manifests/optional/gpu-reset/rbac.yaml <(echo ---) manifests/optional/gpu-reset/admission-policy.yaml \
  | cmp -s - "${chart}/files/gpu-reset.yaml" \
  || { echo "${chart}/files/gpu-reset.yaml differs from manifests/optional/gpu-reset/" >&2; stale=true; }
if $stale; then
  echo "run \`make chart-sync\` to refresh the chart's copies" >&2
  exit 1
fi

"${helm}" lint --strict "${chart}"
for values in "${chart}"/ci/*-values.yaml; do
  "${helm}" lint --strict "${chart}" --values "${values}"
done

# The chart's rendering (plus the namespace), passed through kustomize too: kustomize re-writes
# some block scalars (a folded one with more-indented lines gains blank lines), so both sides
# are compared as kustomize would send them.
render_chart() { # NAME [helm template flags...]
  local name=$1
  shift
  mkdir -p "${out}/${name}"
  "${helm}" template gpu-remediator "${chart}" --namespace gpu-remediation --include-crds "$@" \
    > "${out}/${name}/chart.yaml"
  cp manifests/namespace.yaml "${out}/${name}/namespace.yaml"
  printf 'resources: [chart.yaml, namespace.yaml]\n' > "${out}/${name}/kustomization.yaml"
  "${kubectl}" kustomize "${out}/${name}" > "${out}/${name}.yaml"
}

render_chart chart
"${kubectl}" kustomize manifests > "${out}/kustomize.yaml"
"${objects}" same "${out}/chart.yaml" "${out}/kustomize.yaml"

render_chart chart-all --values "${chart}/ci/all-optional-values.yaml"
"${kubectl}" kustomize tools/chart-test/all-optional > "${out}/kustomize-all.yaml"
"${objects}" same "${out}/chart-all.yaml" "${out}/kustomize-all.yaml"
