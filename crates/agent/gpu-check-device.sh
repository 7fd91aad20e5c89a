#!/usr/bin/env bash
# One prepared run on a lent GPU machine (at most ~5 minutes): builds the agent in release (unless
# AGENT_BIN names one), runs gpu-check.sh against the real GPUs, then prints the agent's inventory
# next to what nvidia-smi says of the same boards. Exits with gpu-check.sh's verdict, or 1 when the
# inventory and nvidia-smi disagree on a UUID's serial.
#
# Usage (repository root): crates/agent/gpu-check-device.sh
#        AGENT_BIN=path/to/gpu-health-agent crates/agent/gpu-check-device.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
step() { echo; echo "### $* (t=$((SECONDS - started))s)"; }

step "machine"
uname -srm
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"

agent="${AGENT_BIN:-}"
if [[ -z "$agent" ]]; then
  step "cargo build --release -p gpu-health-agent"
  timeout 200 cargo build --quiet --release -p gpu-health-agent
  agent=target/release/gpu-health-agent
fi
export AGENT_BIN="$agent"

step "gpu-check.sh"
verdict=0
timeout 60 crates/agent/gpu-check.sh || verdict=$?

step "the agent's inventory (gpuremediation.dev/gpu-inventory) of this machine"
report=$(timeout 30 "$agent" --probe nvml --once --print)
printf '%s\n' "$report" | sed -n '/"inventory"/,/^  \]/p'

if command -v nvidia-smi >/dev/null; then
  step "nvidia-smi, for comparison"
  nvidia-smi --query-gpu=index,uuid,serial,pci.bus_id,vbios_version --format=csv
  while IFS=', ' read -r uuid serial; do
    [[ -z "$uuid" ]] && continue
    if [[ "$serial" == "[N/A]" ]]; then
      echo "ok: $uuid has no serial (nvidia-smi [N/A])"
    # The inventory's keys are sorted: each GPU's "serial" line comes right before its "uuid".
    elif printf '%s\n' "$report" | grep -A1 "\"serial\": \"$serial\"" | grep -q "\"uuid\": \"$uuid\""; then
      echo "ok: inventory has $uuid with serial $serial"
    else
      echo "FAIL: nvidia-smi says $uuid has serial $serial; the inventory does not"; verdict=1
    fi
  done < <(nvidia-smi --query-gpu=uuid,serial --format=csv,noheader)
fi

step "the kernel log's NVRM lines (what --kernel-log=/dev/kmsg parses; read-only, last 40)"
# dmesg only reads the ring buffer (no --clear); where kernel.dmesg_restrict=1 it needs root or
# CAP_SYSLOG, as the agent does. Informational: the verdict does not depend on it.
echo "kernel.dmesg_restrict=$(cat /proc/sys/kernel/dmesg_restrict 2>/dev/null || echo '?')"
if nvrm=$(timeout 10 dmesg --kernel 2>&1); then
  printf '%s\n' "$nvrm" | grep -E 'NVRM: (Xid|GPU at)' | tail -n 40 || echo "no NVRM Xid lines since boot"
else
  echo "dmesg cannot read the kernel log here: $nvrm"
fi

step "done, verdict $verdict"
exit "$verdict"
