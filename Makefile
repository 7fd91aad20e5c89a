# gpu-remediator: every entry point a person or CI uses. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

# Builds (once, then cached outside the repo) and locates the pinned control plane binaries.
CONTROLPLANE_BIN = $(shell e2e/controlplane/build.sh)

.PHONY: help build test unit e2e e2e-real real-node-test sandbox-real real-node-smoke bench-peer crds crds-check lint modgraph fmt controlplane demo bench chaos images argocd-health-test chart-test chart-sync alerts-test mutants test-compat

help:
	@echo "make build         build every crate"
	@echo "make test          everything CI runs: lint, unit tests, CRD drift check, e2e on a real control plane"
	@echo "make unit          unit tests only (no control plane)"
	@echo "make e2e           end-to-end tests against a real local control plane"
	@echo "make e2e-real      replacement against upstream Karpenter (KWOK) and Cluster API, built from pinned modules (cached)"
	@echo "make real-node-test   real nodes (kubelet, containerd, runc, device plugin from pinned modules) run pods, our images (root)"
	@echo "make sandbox-real     gpu-sandbox up with REAL_NODES real nodes beside the simulated fleet (root)"
	@echo "make real-node-smoke  NVIDIA's device plugin (built from tools/nvidia-device-plugin) against the NVML stand-in (root)"
	@echo "make crds          regenerate crds/ from the Rust types (and the Helm chart's copies)"
	@echo "make chart-test    helm lint, and the Helm chart rendered equals kustomize manifests/ (part of test)"
	@echo "make chart-sync    refresh the chart's copies of the CRDs, alerts and dashboard"
	@echo "make alerts-test   promtool unit tests of the alerts (manifests/optional/alerts; part of test)"
	@echo "make lint          rustfmt check, clippy (pedantic, warnings are errors) and make modgraph"
	@echo "make modgraph      no import cycles between the modules of MODGRAPH_CRATES (crates/modgraph)"
	@echo "make controlplane  build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (cached)"
	@echo "make demo          run a remediation on a local control plane with a simulated GPU fleet"
	@echo "make images        build the release binaries the Dockerfiles copy (into target/images/)"
	@echo "make bench         benchmarks against kubectl drain on the sandbox (BENCH_ARGS=--full for the issue's sizes)"
	@echo "                   BENCH_ARGS=\"--scale 10000,50000\": bare-node scale fleets (see docs/benchmarks.md)"
	@echo "make bench-peer    Karpenter's node repair against the policy on two fleets (over 10 minutes)"
	@echo "make mutants       mutation testing of the decision modules (cargo-mutants; hours: MUTANTS_MODULES=cordon narrows it)"
	@echo "make chaos         the fault suite: API server restart, etcd pause, leader kill -9, flaky network, flaps, 30% down, nonsense edits"

build:
	$(CARGO) build --workspace --all-targets

# Crates whose module graph must have no cycles (`make modgraph` fails on one): within every
# module its children form a DAG (crates/modgraph/src/cycles.rs says why that is the rule).
MODGRAPH_CRATES ?= api agent controller sandbox modgraph nvml-standin nvml-unwrapped

lint: modgraph
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

modgraph:
	$(CARGO) run --quiet -p modgraph -- $(addprefix crates/,$(MODGRAPH_CRATES))

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run --quiet -p gpu-remediation-api --bin crdgen -- crds
	cp crds/gpuremediation*.yaml charts/gpu-remediator/crds/

unit:
	$(CARGO) test --workspace --exclude e2e

controlplane:
	@e2e/controlplane/build.sh

e2e:
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test --no-fail-fast -p e2e -- --test-threads=2

test: lint argocd-health-test chart-test alerts-test
	@echo "== the suite on $$("$(CONTROLPLANE_BIN)/kube-apiserver" --version)"
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test --workspace --no-fail-fast
	$(MAKE) --no-print-directory test-compat

# The compatibility runs: on each other supported minor's control plane (e2e/controlplane/compat/,
# pinned, built from the Go module proxy and cached like the suite's), the e2e tests of what changes
# between minors: eviction under budgets, the fence, agent and approval admission policies, node and
# device quarantine (the DeviceTaintRule version the minor serves), the ladder's GPU-scoped drain with
# DRA, other actors' node taints left alone, the CRDs' CEL validation and the Helm install.
COMPAT_MINORS ?= v1.35 v1.36
COMPAT_TESTS ?= --test controller_drain --test admission_fence --test admission_agent \
	--test admission_approval --test quarantine --test quarantine_dra --test device_taint_version \
	--test dra --test foreign_taints --test crd_validation --test install_chart
test-compat:
	@set -e; for minor in $(COMPAT_MINORS); do \
	  bin="$$(e2e/controlplane/build.sh compat/$$minor)"; \
	  echo "== the compatibility runs on $$("$$bin/kube-apiserver" --version)"; \
	  GPU_REMEDIATOR_CONTROLPLANE="$$bin" $(CARGO) test --workspace --no-fail-fast $(COMPAT_TESTS) -- --test-threads=2; \
	  GPU_REMEDIATOR_CONTROLPLANE="$$bin" $(CARGO) test --workspace --test ladder -- --test-threads=2 \
	    a_reset_gpu_xid_on_gpu_3_evicts_only_its_dra_pod; \
	done

# The Argo CD health check (docs/argocd/health.lua) against sample policy statuses, in gopher-lua
# (the interpreter Argo CD embeds; tools/argocd-health, built from its pinned Go module and cached).
argocd-health-test:
	"$$(tools/build.sh argocd-health)" docs/argocd/health.lua docs/argocd/health_test.yaml

# The Helm chart: copies current, helm lint, and its rendering equals kustomize's (tools/chart-test.sh).
chart-test:
	tools/chart-test.sh

chart-sync:
	cp crds/gpuremediation*.yaml charts/gpu-remediator/crds/
	cp manifests/optional/dashboard/gpu-remediator.json charts/gpu-remediator/files/
	cp manifests/agent/admission-policy.yaml charts/gpu-remediator/files/agent-admission-policy.yaml
	cp manifests/approval/rbac.yaml charts/gpu-remediator/files/approval-rbac.yaml
	cp manifests/approval/admission-policy.yaml charts/gpu-remediator/files/approval-admission-policy.yaml
	cp manifests/controller/fence-policy.yaml charts/gpu-remediator/files/fence-policy.yaml
	cp manifests/controller/records-policy.yaml charts/gpu-remediator/files/records-policy.yaml
	cp manifests/controller/pod-notice-policy.yaml charts/gpu-remediator/files/pod-notice-policy.yaml
	cp manifests/controller/flow-schemas.yaml charts/gpu-remediator/files/flow-schemas.yaml
	cp manifests/optional/diagnostics/diagnostics.yaml charts/gpu-remediator/files/diagnostics.yaml
	cat manifests/optional/gpu-reset/rbac.yaml <(echo ---) manifests/optional/gpu-reset/admission-policy.yaml \
	  > charts/gpu-remediator/files/gpu-reset.yaml
	{ echo "# Generated by \`make chart-sync\` from manifests/optional/alerts/prometheusrule.yaml (its spec); do not edit."; \
	  "$$(tools/build.sh kube-objects)" rules manifests/optional/alerts/prometheusrule.yaml; } > charts/gpu-remediator/files/alerts.yaml

# The alerts' promtool unit tests: the PrometheusRule's spec is a plain rules file.
alerts-test:
	dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	"$$(tools/build.sh kube-objects)" rules manifests/optional/alerts/prometheusrule.yaml > "$$dir/gpu-remediator.rules.yaml" && \
	cp manifests/optional/alerts/alerts_test.yaml "$$dir/" && \
	promtool="$$(tools/build.sh promtool)" && \
	"$$promtool" check rules "$$dir/gpu-remediator.rules.yaml" && \
	"$$promtool" test rules "$$dir/alerts_test.yaml"

# Where cargo puts builds (honours CARGO_TARGET_DIR).
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
# Quiet by default: the demo prints its own story. Set RUST_LOG to see the sandbox's logs.
DEMO_LOG ?= warn,kube_client::client::builder=off,gpu_sandbox::fleet::heartbeat=error

# Builds what is missing, then recycles one GPU node live: control plane, 10 GPU nodes with GPU
# workloads behind PDBs, manifests/ and config/policy-h100-replace.yaml applied, the controller
# as a process under its service account's RBAC. Leaves the cluster up until Ctrl-C;
# DEMO_EXIT=1 ends after the summary.
demo:
	$(CARGO) build --quiet -p gpu-remediator --bin gpu-remediator -p gpu-sandbox --bin gpu-sandbox
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" RUST_LOG="$${RUST_LOG:-$(DEMO_LOG)}" \
		$(TARGET_DIR)/debug/gpu-sandbox demo --controller $(TARGET_DIR)/debug/gpu-remediator --repo . $(if $(DEMO_EXIT),--exit-after)

# The binaries the Dockerfiles copy, into $(TARGET_DIR)/images/amd64/ (the Docker build context is
# $(TARGET_DIR)/images/, one directory per TARGETARCH; `make arm64` fills images/arm64/). No
# container engine runs here; with one:
#   docker build -f crates/controller/Dockerfile -t gpu-remediator:dev target/images
#   docker build -f crates/agent/Dockerfile -t gpu-health-agent:dev target/images
# The controller is linked statically (glibc, crt-static) for distroless/static. The agent stays
# dynamically linked against glibc: it dlopens the host's libnvidia-ml.so, which a static binary
# cannot do reliably; its image is distroless/cc (Debian 12, glibc 2.36), so build it on a host
# whose glibc is not newer.
IMAGE_TARGET ?= x86_64-unknown-linux-gnu
images:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release --locked --target $(IMAGE_TARGET) \
		-p gpu-remediator --bin gpu-remediator
	$(CARGO) build --release --locked -p gpu-health-agent --bin gpu-health-agent
	mkdir -p $(TARGET_DIR)/images/amd64
	cp $(TARGET_DIR)/$(IMAGE_TARGET)/release/gpu-remediator $(TARGET_DIR)/release/gpu-health-agent $(TARGET_DIR)/images/amd64/
	@file $(TARGET_DIR)/images/amd64/gpu-remediator $(TARGET_DIR)/images/amd64/gpu-health-agent 2>/dev/null || ls -l $(TARGET_DIR)/images/amd64

# Release builds of the controller and the harness; the controller runs as its own process.
bench:
	$(CARGO) build --release -p gpu-remediator --bin gpu-remediator -p gpu-sandbox --bin gpu-bench
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" target/release/gpu-bench $(BENCH_ARGS)

# Karpenter's own node repair (upstream, KWOK provider, NodeRepair gate) against the policy on two
# identical fleets (docs/benchmarks.md, "Karpenter's node repair as a peer"). Over 10 minutes:
# Karpenter's KWOK provider tolerates Ready=False for 10 minutes, hard-coded. Dev profile: the
# figures are timer-bound, and a release build of the workspace costs more than the run.
bench-peer:
	$(CARGO) build -p gpu-remediator --bin gpu-remediator -p gpu-sandbox --bin gpu-bench
	karpenter="$$(tools/build.sh karpenter-kwok)" && GPU_REMEDIATOR_KARPENTER="$$karpenter" \
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" \
		$(TARGET_DIR)/debug/gpu-bench --only karpenter-peer --out $(TARGET_DIR)/bench/peer.json $(BENCH_ARGS)

# What runs for real: DeleteNodeClaim and DeleteMachine against the real controllers (upstream
# Karpenter with its KWOK provider and Cluster API's core manager, tools/karpenter-kwok,
# tools/capi-manager), gang drains against upstream JobSet (tools/jobset), then the real-node tests
# (real-node-test below). All built from their pinned Go modules on first use and cached like the
# control plane. Not in `test`: their cold builds are heavy (about 6.5, 7.2 and 3.5 CPU-minutes cold
# for the controllers, 4.5-4.9 for a real node's pieces, see README), and the real nodes need root;
# .ci/run runs this target.
REAL_TESTS = --test real_karpenter --test real_capi --test real_jobset
e2e-real:
	karpenter="$$(tools/build.sh karpenter-kwok)" && capi="$$(tools/build.sh capi-manager)" && \
	jobset="$$(tools/build.sh jobset)" && \
	GPU_REMEDIATOR_KARPENTER="$$karpenter" GPU_REMEDIATOR_CAPI="$$capi" GPU_REMEDIATOR_JOBSET="$$jobset" \
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" \
		$(CARGO) test --workspace --no-fail-fast $(REAL_TESTS) -- --ignored --test-threads=2
	$(MAKE) --no-print-directory real-node-test

# A real node's binaries, built from their pinned modules (cached after the first build) and named
# in the environment of the command that follows `&&` (a failed build fails the target).
REAL_NODE_ENV = GPU_REMEDIATOR_KUBELET="$$(e2e/controlplane/build.sh --kubelet)" && \
	GPU_REMEDIATOR_PAUSE="$$(e2e/controlplane/build.sh --pause)" && \
	GPU_REMEDIATOR_CONTAINERD="$$(tools/build.sh containerd)" && GPU_REMEDIATOR_RUNC="$$(tools/build.sh runc)" && \
	GPU_REMEDIATOR_CNI_PLUGINS="$$(tools/build.sh cni-plugins)" && \
	export GPU_REMEDIATOR_KUBELET GPU_REMEDIATOR_PAUSE GPU_REMEDIATOR_CONTAINERD GPU_REMEDIATOR_RUNC \
		GPU_REMEDIATOR_CNI_PLUGINS

# The real-node tests (crates/sandbox/tests/real_node*.rs; kubelet, containerd, runc, CNI and pause
# built from pinned modules; each node in namespaces of its own). One node joins a control plane,
# runs a pod whose eviction waits for its budget and ends on SIGTERM, and runs the agent's and the
# controller's images, built here from their Dockerfiles with the debug binaries (real_node.rs);
# NVIDIA's device plugin runs as a DaemonSet over the NVML stand-in and withdraws a GPU after an
# XID 79 (real_node_gpus.rs); helm installs the chart with those images: the agent on two GPU nodes,
# the controller's fenced leader on a CPU-only one (real_node_chart.rs); and the issue's scenario:
# an XID 79's GPU-scoped drain, then the ladder's DeleteNode and a new real node from the node
# group (real_node_recycle.rs). Needs root. Part of e2e-real.
real-node-test:
	$(REAL_NODE_ENV) && GPU_REMEDIATOR_DEVICE_PLUGIN="$$(tools/build.sh nvidia-device-plugin)" && \
	GPU_REMEDIATOR_HELM="$$(tools/build.sh helm)" && export GPU_REMEDIATOR_DEVICE_PLUGIN GPU_REMEDIATOR_HELM && \
	$(CARGO) build -p gpu-health-agent --bin gpu-health-agent -p gpu-remediator --bin gpu-remediator && \
	$(CARGO) build -p nvml-standin && \
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" \
	GPU_REMEDIATOR_AGENT_BINARY="$(abspath $(TARGET_DIR))/debug/gpu-health-agent" \
	GPU_REMEDIATOR_CONTROLLER_BINARY="$(abspath $(TARGET_DIR))/debug/gpu-remediator" \
	GPU_REMEDIATOR_NVML_STANDIN="$(abspath $(TARGET_DIR))/debug/libnvml_standin.so" \
		$(CARGO) test -p gpu-sandbox --test real_node --test real_node_gpus --test real_node_chart \
		--test real_node_recycle -- --ignored --nocapture

# `gpu-sandbox up` with REAL_NODES real nodes (default 2) beside the simulated fleet, until Ctrl-C
# (root). SANDBOX_ARGS adds `gpu-sandbox up` flags.
REAL_NODES ?= 2
sandbox-real:
	$(CARGO) build --quiet -p gpu-sandbox --bin gpu-sandbox && $(REAL_NODE_ENV) && \
		GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(TARGET_DIR)/debug/gpu-sandbox up \
		--real-nodes $(REAL_NODES) $(SANDBOX_ARGS)

# NVIDIA's device plugin, built from its pinned module (tools/nvidia-device-plugin, about 1.5
# CPU-minutes cold), against the NVML stand-in with an XID 79 on GPU 1 and no kubelet: it must log
# that device unhealthy, with no NVML symbol missing (docs/plans/real-node.md, S2's smoke). Needs root
# (a mount namespace for the plugin's socket directory). Not in `test` nor in .ci/run (yet).
real-node-smoke:
	plugin="$$(tools/build.sh nvidia-device-plugin)" && GPU_REMEDIATOR_DEVICE_PLUGIN="$$plugin" \
		$(CARGO) test --workspace --test device_plugin_smoke -- --ignored --nocapture

# Mutation testing of the controller's decision modules: cargo-mutants (built once from crates.io at
# the pinned version into the cache, like the Go tools) changes their code one mutant at a time and
# runs the library's unit tests against each; a mutant no test fails is a behaviour nothing checks.
# Not part of `test`: each mutant rebuilds the controller (about half a minute here), and the seven
# modules hold about 1,300 mutants. MUTANTS_MODULES narrows it (a file `crates/controller/src/M.rs`
# and its folder); the report lands in target/mutants/ (mutants.out/outcomes.json, missed.txt).
MUTANTS_VERSION = 27.1.0
MUTANTS_MODULES ?= budget cordon quarantine fleet lifecycle detect drain
mutants:
	root="$${GPU_REMEDIATOR_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/gpu-remediator}/tools/cargo-mutants-$(MUTANTS_VERSION)" && \
	{ [ -x "$$root/bin/cargo-mutants" ] || $(CARGO) install --locked --version $(MUTANTS_VERSION) --root "$$root" cargo-mutants; } && \
	"$$root/bin/cargo-mutants" mutants --package gpu-remediator --output $(TARGET_DIR)/mutants \
		$(foreach m,$(MUTANTS_MODULES),--file 'crates/controller/src/$(m).rs' --file 'crates/controller/src/$(m)/**/*.rs') \
		--exclude '**/*tests*.rs' --exclude '**/test_fixtures.rs' --cargo-test-arg=--lib

# Each fault test starts a control plane of its own and breaks it; minutes each, so not in `test`.
# This target, test-compat and e2e-real select their tests with `--workspace --test NAME`, not
# `-p e2e`: the same package selection as `make test`'s run resolves the same features, so they
# reuse its build instead of rebuilding kube, the controller and the sandbox (80 s in a cold CI run).
CHAOS_TESTS = --test chaos_control_plane --test chaos_leader --test chaos_network --test chaos_load
chaos:
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test --workspace --no-fail-fast $(CHAOS_TESTS) -- --ignored --test-threads=2

# arm64 (Grace nodes: GH200, GB200): both binaries cross-built for aarch64-unknown-linux-gnu into
# $(TARGET_DIR)/images/arm64/, beside images/amd64/ from `make images` (the multi-arch Dockerfiles
# copy $TARGETARCH/), then the arm64 binaries run under qemu-user: the agent with the file probe,
# printing the condition it would write. Not part of `make test`: it needs the Rust target
# (`rustup target add aarch64-unknown-linux-gnu`) and Debian's gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user-static and file. With a container engine, after both targets:
#   docker buildx build --platform linux/amd64,linux/arm64 -f crates/agent/Dockerfile \
#     -t REGISTRY/gpu-health-agent:TAG --push target/images
ARM64_TARGET = aarch64-unknown-linux-gnu
ARM64_CROSS = CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
ARM64_PROBE ?= crates/agent/tests/fixtures/h100-gpu1-lost.json
.PHONY: arm64
arm64:
	@for tool in aarch64-linux-gnu-gcc qemu-aarch64-static file; do command -v $$tool >/dev/null || \
		{ echo "make arm64 needs $$tool (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static file)" >&2; exit 1; }; done
	$(ARM64_CROSS) CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
		$(CARGO) build --release --locked --target $(ARM64_TARGET) --target-dir $(TARGET_DIR)/arm64-static \
		-p gpu-remediator --bin gpu-remediator
	$(ARM64_CROSS) $(CARGO) build --release --locked --target $(ARM64_TARGET) -p gpu-health-agent --bin gpu-health-agent
	mkdir -p $(TARGET_DIR)/images/arm64
	cp $(TARGET_DIR)/arm64-static/$(ARM64_TARGET)/release/gpu-remediator \
		$(TARGET_DIR)/$(ARM64_TARGET)/release/gpu-health-agent $(TARGET_DIR)/images/arm64/
	file $(TARGET_DIR)/images/arm64/gpu-remediator $(TARGET_DIR)/images/arm64/gpu-health-agent
	qemu-aarch64-static $(TARGET_DIR)/images/arm64/gpu-remediator --version
	qemu-aarch64-static -L /usr/aarch64-linux-gnu $(TARGET_DIR)/images/arm64/gpu-health-agent \
		--probe file --probe-file $(ARM64_PROBE) --expected-gpus 8 --print
