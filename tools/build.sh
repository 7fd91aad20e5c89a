#!/usr/bin/env bash
# Builds one of the project's Go tools from its own pinned Go module in tools/NAME (go.mod + go.sum,
# committed) into a cache outside the repository, and prints on its last line the path the caller
# uses: the binary's, for a tool of one binary (PACKAGE); the directory holding them, for a tool of
# several (PACKAGES). The cache key is a hash of the tool's directory and the Go version, so a pin
# bump rebuilds and a warm cache builds nothing.
#
# The tools `make test` uses (each prints its binary):
#   tools/build.sh helm       # helm.sh/helm/v3/cmd/helm
#   tools/build.sh promtool   # github.com/prometheus/prometheus/cmd/promtool, service discovery left out
#   tools/build.sh argocd-health   # the Argo CD health-check runner (gopher-lua), tools/argocd-health
#
#   tools/build.sh karpenter-kwok  # Karpenter with its KWOK cloud provider, and its CRDs (e2e on real controllers)
#   tools/build.sh capi-manager    # Cluster API's core manager, and its CRDs (e2e on real controllers)
#   tools/build.sh jobset          # JobSet's controller manager, and its CRD (e2e on real controllers)
#
# A real node's (docs/plans/real-node.md):
#   tools/build.sh containerd            # containerd, ctr, containerd-shim-runc-v2: prints the directory
#   tools/build.sh cni-plugins           # bridge, host-local, loopback: prints the directory
#   tools/build.sh runc                  # runc (cgo, seccomp against the host's libseccomp.so.2)
#   tools/build.sh nvidia-device-plugin  # the device plugin (cgo: dlopens libnvidia-ml.so.1)
#
# Each tools/NAME/build.env (sourced in tools/NAME, on every call) sets either PACKAGE (one import
# path, built as NAME) or PACKAGES (several `main` import paths, each built as its last path
# element into the one directory), and optionally:
#   CGO      1 to build with cgo (default 0: static, no C compiler needed)
#   TAGS     build tags
#   LDFLAGS  added to `-s -w`
#   MODULE_FILES  `MODULE:GLOB` words naming files of a required module (its pinned version) copied
#            beside the binary, e.g. the CRDs a controller needs, so they always match the binary
#   before_build  a shell function, run only when building, in tools/NAME, with a scratch
#            directory as $1, removed afterwards: it may write files there and export what `go
#            build` needs, e.g. tools/runc writes libseccomp's header there. The directory's path is
#            the same for the same cache key, so CGO_CFLAGS naming it key Go's build cache rightly
#            (pkg-config's answers do not enter that key: a cached cgo package keeps the flags of
#            the build that made it, so they must name nothing that goes away).
# Environment: GPU_REMEDIATOR_CACHE (default ~/.cache/gpu-remediator) moves the cache.
set -euo pipefail
name=${1:?usage: tools/build.sh NAME (a directory under tools/)}
tools_dir=$(cd "$(dirname "$0")" && pwd)
module_dir="${tools_dir}/${name}"
[ -f "${module_dir}/go.mod" ] || { echo "tools/build.sh: no Go module tools/${name}" >&2; exit 2; }
cd "${module_dir}"
PACKAGE=""
PACKAGES=""
CGO=0
TAGS=""
LDFLAGS=""
MODULE_FILES=""
# shellcheck source=/dev/null
source ./build.env
if [ -n "${PACKAGE}" ]; then
  [ -z "${PACKAGES}" ] || { echo "tools/${name}/build.env sets both PACKAGE and PACKAGES" >&2; exit 2; }
  binaries=("${name}")
else
  : "${PACKAGES:?tools/${name}/build.env must set PACKAGE or PACKAGES}"
  binaries=()
  for package in ${PACKAGES}; do binaries+=("${package##*/}"); done
fi

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
# What the caller uses: the one binary, or the directory of several.
if [ -n "${PACKAGE}" ]; then result="${bin_dir}/${name}"; else result="${bin_dir}"; fi
complete=true
for binary in "${binaries[@]}"; do [ -x "${bin_dir}/${binary}" ] || complete=false; done
if $complete; then
  echo "${result}"
  exit 0
fi

staging="${bin_dir}.partial.$$"
rm -rf "${staging}"
mkdir -p "${staging}"
scratch="${bin_dir}.scratch"
rm -rf "${scratch}"
mkdir -p "${scratch}"
trap 'rm -rf "${staging}" "${scratch}"' EXIT
echo "building ${name} (${PACKAGE:-${PACKAGES}}) with ${go_version} into ${bin_dir}" >&2
start=${SECONDS}
if declare -F before_build >/dev/null; then before_build "${scratch}"; fi
if [ -n "${PACKAGE}" ]; then
  output="${staging}/${name}"
  packages=("${PACKAGE}")
else
  output="${staging}/"
  # shellcheck disable=SC2206 # words: the import paths
  packages=(${PACKAGES})
fi
CGO_ENABLED="${CGO}" go build -mod=readonly -trimpath -tags "${TAGS}" -ldflags "-s -w ${LDFLAGS}" \
  -o "${output}" "${packages[@]}"
for spec in ${MODULE_FILES}; do
  module_root=$(go list -mod=readonly -m -f '{{.Dir}}' "${spec%%:*}")
  # shellcheck disable=SC2086 # the glob is meant to expand
  cp ${module_root}/${spec#*:} "${staging}/"
done
echo "built ${name} in $((SECONDS - start)) s" >&2
rm -rf "${bin_dir}" "${scratch}"
mv "${staging}" "${bin_dir}"
trap - EXIT
echo "${result}"
