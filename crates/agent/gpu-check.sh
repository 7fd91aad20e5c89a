#!/usr/bin/env bash
# The real-GPU check of gpu-health-agent, for a machine with NVIDIA GPUs and the driver.
#
# Runs the agent's NVML probe once against the GPUs of this machine (no API server involved) and
# prints the readings and the GpuHealthy condition the agent would write, twice:
#   1. expecting as many GPUs as NVML counts: must be True/GpusHealthy, naming every UUID that
#      nvidia-smi lists (when nvidia-smi is there);
#   2. expecting one GPU more: must be False/GpuMissing.
# Exits 0 only if both hold.
#
# Usage: crates/agent/gpu-check.sh            (builds the agent with cargo)
#        AGENT_BIN=path/to/gpu-health-agent crates/agent/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

agent="${AGENT_BIN:-}"
if [[ -z "$agent" ]]; then
  cargo build --quiet --release -p gpu-health-agent
  agent=target/release/gpu-health-agent
fi

field() { sed -n "s/^  *\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1; }

# NVML alone: --print also reads the kernel log by default, whose past XIDs (or whose refusal to be
# read) would speak for the machine's history, not for this NVML check. gpu-check-device.sh prints
# the kernel log's NVRM lines on their own.
nvml=(--probe nvml --once --print --kernel-log=)

echo "== 1. one read, no expected count =="
plain=$("$agent" "${nvml[@]}")
echo "$plain"
count=$(printf '%s\n' "$plain" | field deviceCount)
if [[ -z "$count" ]]; then
  echo "FAIL: NVML gave no device count (see the readings above)"; exit 1
fi

echo "== 2. expecting the $count GPUs NVML counts =="
right=$("$agent" "${nvml[@]}" --expected-gpus "$count")
echo "$right"
status=$(printf '%s\n' "$right" | sed -n '/"condition"/,/}/p' | field status)
reason=$(printf '%s\n' "$right" | sed -n '/"condition"/,/}/p' | field reason)
verdict=0
if [[ "$status" == True && "$reason" == GpusHealthy ]]; then
  echo "ok: GpuHealthy=True/GpusHealthy with $count GPUs"
else
  echo "FAIL: expected True/GpusHealthy, got $status/$reason"; verdict=1
fi
if command -v nvidia-smi >/dev/null; then
  for uuid in $(nvidia-smi --query-gpu=uuid --format=csv,noheader); do
    if printf '%s\n' "$right" | grep -q "\"uuid\": \"$uuid\""; then
      echo "ok: NVML reading names $uuid (as nvidia-smi does)"
    else
      echo "FAIL: nvidia-smi lists $uuid, the agent's readings do not"; verdict=1
    fi
  done
fi

echo "== 3. expecting one GPU more ($((count + 1))) =="
high=$("$agent" "${nvml[@]}" --expected-gpus "$((count + 1))")
printf '%s\n' "$high" | sed -n '/"condition"/,/}/p'
status=$(printf '%s\n' "$high" | sed -n '/"condition"/,/}/p' | field status)
reason=$(printf '%s\n' "$high" | sed -n '/"condition"/,/}/p' | field reason)
if [[ "$status" == False && "$reason" == GpuMissing ]]; then
  echo "ok: GpuHealthy=False/GpuMissing when one GPU more is expected"
else
  echo "FAIL: expected False/GpuMissing, got $status/$reason"; verdict=1
fi
exit "$verdict"
