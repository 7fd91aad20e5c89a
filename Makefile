# gpu-remediator: every entry point a person or CI uses. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

# Builds (once, then cached outside the repo) and locates the pinned control plane binaries.
CONTROLPLANE_BIN = $(shell e2e/controlplane/build.sh)

.PHONY: help build test unit e2e crds crds-check lint fmt controlplane demo bench chaos images argocd-health-test

help:
	@echo "make build         build every crate"
	@echo "make test          everything CI runs: lint, unit tests, CRD drift check, e2e on a real control plane"
	@echo "make unit          unit tests only (no control plane)"
	@echo "make e2e           end-to-end tests against a real local control plane"
	@echo "make crds          regenerate crds/ from the Rust types"
	@echo "make lint          rustfmt check and clippy (pedantic, warnings are errors)"
	@echo "make controlplane  build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (cached)"
	@echo "make demo          run a remediation on a local control plane with a simulated GPU fleet"
	@echo "make images        build the release binaries the Dockerfiles copy (into target/images/)"
	@echo "make bench         benchmarks against kubectl drain on the sandbox (BENCH_ARGS=--full for the issue's sizes)"
	@echo "make chaos         the fault suite: API server restart, etcd pause, leader kill -9, flaky network, flaps, 30% down, nonsense edits"

build:
	$(CARGO) build --workspace --all-targets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run --quiet -p gpu-remediation-api --bin crdgen -- crds

unit:
	$(CARGO) test --workspace --exclude e2e

controlplane:
	@e2e/controlplane/build.sh

e2e:
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test --no-fail-fast -p e2e -- --test-threads=2

test: lint argocd-health-test
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test --workspace --no-fail-fast

# The Argo CD health check (docs/argocd/health.lua) against sample policy statuses, in gopher-lua
# (the interpreter Argo CD embeds; tools/argocd-health, built from its pinned Go module and cached).
argocd-health-test:
	"$$(tools/build.sh argocd-health)" docs/argocd/health.lua docs/argocd/health_test.yaml

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

# The binaries the Dockerfiles copy, into $(TARGET_DIR)/images/ (the Docker build context). No
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
	mkdir -p $(TARGET_DIR)/images
	cp $(TARGET_DIR)/$(IMAGE_TARGET)/release/gpu-remediator $(TARGET_DIR)/release/gpu-health-agent $(TARGET_DIR)/images/
	@file $(TARGET_DIR)/images/gpu-remediator $(TARGET_DIR)/images/gpu-health-agent 2>/dev/null || ls -l $(TARGET_DIR)/images

# Release builds of the controller and the harness; the controller runs as its own process.
bench:
	$(CARGO) build --release -p gpu-remediator --bin gpu-remediator -p gpu-sandbox --bin gpu-bench
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" target/release/gpu-bench $(BENCH_ARGS)

# Each fault test starts a control plane of its own and breaks it; minutes each, so not in `test`.
CHAOS_TESTS = --test chaos_control_plane --test chaos_leader --test chaos_network --test chaos_load
chaos:
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test -p e2e --no-fail-fast $(CHAOS_TESTS) -- --ignored --test-threads=2
