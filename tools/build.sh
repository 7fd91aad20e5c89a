#!/usr/bin/env bash
# Builds one of the Go tools that `make test` uses (helm, promtool, argocd-health) from its own
# pinned Go module in tools/NAME (go.mod + go.sum, committed) into a cache outside the repository,
# and prints the binary's path on its last line. The cache key is a hash of the tool's directory
# and the Go version, so a pin bump rebuilds and a warm cache builds nothing.
#
#   tools/build.sh helm       # helm.sh/helm/v3/cmd/helm
#   tools/build.sh promtool   # github.com/prometheus/prometheus/cmd/promtool, service discovery left out
#   tools/build.sh argocd-health   # the Argo CD health-check runner (gopher-lua), tools/argocd-health
#
#   tools/build.sh karpenter-kwok  # Karpenter with its KWOK cloud provider, and its CRDs (e2e on real controllers)
#   tools/build.sh capi-manager    # Cluster API's core manager, and its CRDs (e2e on real controllers)
#   tools/build.sh jobset          # JobSet's controller manager, and its CRD (e2e on real controllers)
#
# Each tools/NAME/build.env sets PACKAGE (what to build), and optionally TAGS, LDFLAGS and
# MODULE_FILES: `MODULE:GLOB` words naming files of a required module (its pinned version) copied
# beside the binary, e.g. the CRDs a controller needs, so they always match the binary.
# Environment: GPU_REMEDIATOR_CACHE (default ~/.cache/gpu-remediator) moves the cache.
set -euo pipefail
name=${1:?usage: tools/build.sh NAME (a directory under tools/)}
tools_dir=$(cd "$(dirname "$0")" && pwd)
module_dir="${tools_dir}/${name}"
[ -f "${module_dir}/go.mod" ] || { echo "tools/build.sh: no Go module tools/${name}" >&2; exit 2; }
cd "${module_dir}"
TAGS=""
LDFLAGS=""
MODULE_FILES=""
# shellcheck source=/dev/null
source ./build.env
: "${PACKAGE:?tools/${name}/build.env must set PACKAGE}"

go_version=$(go env GOVERSION)
# Everything that decides the binary: the module's files (go.mod, go.sum, build.env, sources).
key=$( (find . -type f -not -name '*_test.go' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; echo "${go_version}") \
  | sha256sum | cut -c1-16)
cache_root="${GPU_REMEDIATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-remediator}"
bin_dir="${cache_root}/tools/${name}-${key}"
# One build of a tool at a time: a second caller (`make test` reaching a tool that .ci/run is still
# building in the background) waits for it, then finds it cached.
mkdir -p "$(dirname "${bin_dir}")"
exec 9>"${bin_dir}.lock"
flock 9
if [ -x "${bin_dir}/${name}" ]; then
  echo "${bin_dir}/${name}"
  exit 0
fi

staging="${bin_dir}.partial.$$"
rm -rf "${staging}"
mkdir -p "${staging}"
trap 'rm -rf "${staging}"' EXIT
echo "building ${name} (${PACKAGE}) with ${go_version} into ${bin_dir}" >&2
start=${SECONDS}
CGO_ENABLED=0 go build -mod=readonly -trimpath -tags "${TAGS}" -ldflags "-s -w ${LDFLAGS}" \
  -o "${staging}/${name}" "${PACKAGE}"
for spec in ${MODULE_FILES}; do
  module_root=$(go list -mod=readonly -m -f '{{.Dir}}' "${spec%%:*}")
  # shellcheck disable=SC2086 # the glob is meant to expand
  cp ${module_root}/${spec#*:} "${staging}/"
done
echo "built ${name} in $((SECONDS - start)) s" >&2
rm -rf "${bin_dir}"
mv "${staging}" "${bin_dir}"
trap - EXIT
echo "${bin_dir}/${name}"
