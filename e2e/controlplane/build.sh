#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from the Go module
# proxy at the versions pinned in go.mod, into a cache outside the repository keyed by the Kubernetes
# and Go versions. A warm cache builds nothing. Prints the binary directory on its last line.
# With --kubelet, the kubelet instead, from the same go.mod and with the same flags (so a Go build
# cache warm from the control plane's build is reused), into a directory of its own; with --pause,
# Kubernetes' pause (build/pause/linux/pause.c of the pinned k8s.io/kubernetes module, `cc -static
# -Os`, as its build/pause/Makefile), keyed by the Kubernetes and C compiler versions. Both are a real
# node's (docs/plans/real-node.md). Neither changes the control plane's cache or its key.
#
# Usage: build.sh            the suite's control plane (this directory's go.mod)
#        build.sh compat/v1.35   another supported minor's (its own versions.env, go.mod, go.sum;
#                            `cmd` and `tools.go` are this directory's, linked)
#        build.sh --kubelet [compat/v1.35]   the kubelet of that release
#        build.sh --pause [compat/v1.35]     pause of that release
#
# Environment: GPU_REMEDIATOR_CACHE (default ~/.cache/gpu-remediator) moves the cache.
set -euo pipefail
what=controlplane
case "${1:-}" in
  --kubelet) what=kubelet; shift ;;
  --pause) what=pause; shift ;;
esac
cd "$(dirname "$0")/${1:-.}"
source ./versions.env

go_version=$(go env GOVERSION)
cache_root="${GPU_REMEDIATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-remediator}"
case "${what}" in
  controlplane)
    bin_dir="${cache_root}/controlplane/k8s-${KUBERNETES_VERSION}-${go_version}"
    binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
    label="control plane ${KUBERNETES_VERSION} (${go_version})" ;;
  kubelet)
    bin_dir="${cache_root}/kubelet/k8s-${KUBERNETES_VERSION}-${go_version}"
    binaries=(kubelet)
    label="kubelet ${KUBERNETES_VERSION} (${go_version})" ;;
  pause)
    cc=$(go env CC)
    cc_version="$(basename "${cc}")$("${cc}" -dumpfullversion 2>/dev/null || "${cc}" -dumpversion)"
    bin_dir="${cache_root}/pause/k8s-${KUBERNETES_VERSION}-${cc_version}"
    binaries=(pause)
    label="pause of ${KUBERNETES_VERSION} (${cc_version})" ;;
esac

# One build of a version at a time: a second caller (`make test` reaching a control plane that
# .ci/run is still building in the background) waits for it, then finds it cached.
mkdir -p "$(dirname "${bin_dir}")"
exec 9>"${bin_dir}.lock"
flock 9

complete=true
for b in "${binaries[@]}"; do [ -x "${bin_dir}/${b}" ] || complete=false; done
if $complete; then
  echo "${label} is cached" >&2
  echo "${bin_dir}"
  exit 0
fi

staging="${bin_dir}.partial.$$"
rm -rf "${staging}"
mkdir -p "${staging}"
trap 'rm -rf "${staging}"' EXIT

if [ "${what}" = pause ]; then
  # No Go: the C file of the module the control plane builds from, with the version its Makefile
  # gives (TAG; REV, a git description, is the Kubernetes release here): `pause -v` prints it.
  kubernetes_dir=$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  pause_tag=$(sed -n 's/^TAG ?= //p' "${kubernetes_dir}/build/pause/Makefile")
  echo "building ${label} into ${bin_dir}" >&2
  "${cc}" -Os -Wall -Werror -static "-DVERSION=v${pause_tag}-${KUBERNETES_VERSION}" \
    -o "${staging}/pause" "${kubernetes_dir}/build/pause/linux/pause.c"
  rm -rf "${bin_dir}"
  mv "${staging}" "${bin_dir}"
  trap - EXIT
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

if [ "${what}" = kubelet ]; then
  echo "building ${label} into ${bin_dir}" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "${ldflags}" -o "${staging}/" k8s.io/kubernetes/cmd/kubelet
else
  echo "building control plane ${KUBERNETES_VERSION} with ${go_version} into ${bin_dir} (cold: many minutes)" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "${ldflags}" -o "${staging}/" \
    ./cmd/etcd \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
fi
rm -rf "${bin_dir}"
mv "${staging}" "${bin_dir}"
trap - EXIT
echo "${bin_dir}"
