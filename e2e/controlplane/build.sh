#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from the Go module
# proxy at the versions pinned in go.mod, into a cache outside the repository keyed by the Kubernetes
# and Go versions. A warm cache builds nothing. Prints the binary directory on its last line.
#
# Usage: build.sh            the suite's control plane (this directory's go.mod)
#        build.sh compat/v1.35   another supported minor's (its own versions.env, go.mod, go.sum;
#                            `cmd` and `tools.go` are this directory's, linked)
#
# Environment: GPU_REMEDIATOR_CACHE (default ~/.cache/gpu-remediator) moves the cache.
set -euo pipefail
cd "$(dirname "$0")/${1:-.}"
source ./versions.env

go_version=$(go env GOVERSION)
cache_root="${GPU_REMEDIATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-remediator}"
bin_dir="${cache_root}/controlplane/k8s-${KUBERNETES_VERSION}-${go_version}"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

# One build of a version at a time: a second caller (`make test` reaching a control plane that
# .ci/run is still building in the background) waits for it, then finds it cached.
mkdir -p "$(dirname "${bin_dir}")"
exec 9>"${bin_dir}.lock"
flock 9

complete=true
for b in "${binaries[@]}"; do [ -x "${bin_dir}/${b}" ] || complete=false; done
if $complete; then
  echo "control plane ${KUBERNETES_VERSION} (${go_version}) is cached" >&2
  echo "${bin_dir}"
  exit 0
fi

version_core=${KUBERNETES_VERSION#v}
major=${version_core%%.*}
minor_patch=${version_core#*.}
minor=${minor_patch%%.*}
ldflags="-s -w"
# The same variables Kubernetes' hack/lib/version.sh sets, so `--version` prints the real release.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=${KUBERNETES_VERSION}"
  ldflags+=" -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

staging="${bin_dir}.partial.$$"
rm -rf "${staging}"
mkdir -p "${staging}"
trap 'rm -rf "${staging}"' EXIT
echo "building control plane ${KUBERNETES_VERSION} with ${go_version} into ${bin_dir} (cold: many minutes)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "${ldflags}" -o "${staging}/" \
  ./cmd/etcd \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl
rm -rf "${bin_dir}"
mv "${staging}" "${bin_dir}"
trap - EXIT
echo "${bin_dir}"
