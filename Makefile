# gpu-remediator: every entry point a person or CI uses. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

# Builds (once, then cached outside the repo) and locates the pinned control plane binaries.
CONTROLPLANE_BIN = $(shell e2e/controlplane/build.sh)

.PHONY: help build test unit e2e crds crds-check lint fmt controlplane demo bench chaos

help:
	@echo "make build         build every crate"
	@echo "make test          everything CI runs: lint, unit tests, CRD drift check, e2e on a real control plane"
	@echo "make unit          unit tests only (no control plane)"
	@echo "make e2e           end-to-end tests against a real local control plane"
	@echo "make crds          regenerate crds/ from the Rust types"
	@echo "make lint          rustfmt check and clippy (pedantic, warnings are errors)"
	@echo "make controlplane  build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (cached)"
	@echo "make demo          run a remediation on a local control plane with a simulated GPU fleet"
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
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test -p e2e -- --test-threads=2

test: lint
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test --workspace

demo:
	@echo "make demo: not built yet (issue: Ship it)"; exit 1

# Release builds of the controller and the harness; the controller runs as its own process.
bench:
	$(CARGO) build --release -p gpu-remediator --bin gpu-remediator -p gpu-sandbox --bin gpu-bench
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" target/release/gpu-bench $(BENCH_ARGS)

# Each fault test starts a control plane of its own and breaks it; minutes each, so not in `test`.
CHAOS_TESTS = --test chaos_control_plane --test chaos_leader --test chaos_network --test chaos_load
chaos:
	GPU_REMEDIATOR_CONTROLPLANE="$(CONTROLPLANE_BIN)" $(CARGO) test -p e2e $(CHAOS_TESTS) -- --ignored --test-threads=2
