#!/usr/bin/env bash
# One prepared run on a lent GPU machine (at most ~5 minutes): builds the agent in release (unless
# AGENT_BIN names one), runs gpu-check.sh against the real GPUs, then prints the agent's inventory
# next to what nvidia-smi says of the same boards, then the NVLink links and fabric registration the
# agent reads next to nvidia-smi's, then the MIG devices. Exits with gpu-check.sh's verdict, or 1
# when the inventory and nvidia-smi disagree on a UUID's serial, on a GPU's count of NVLink links up
# or on the MIG devices, or when an NVLink, fabric or MIG read fails.
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

step "NVLink and fabric as the agent reads them (nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkErrorCounter, nvmlDeviceGetGpuFabricInfo)"
# Read-only. A failed NVLink or fabric call is a detector fault (the agent's bug or the driver's),
# so it fails the check; links down or a fabric not registered are reported, not failed on: the
# machine may be built that way (no NVSwitch, Fabric Manager not installed).
nvlink_verdict=0
summarise_links=$(cat <<'PY'
import json, sys
report = json.load(sys.stdin)
readings = report.get('readings', {})
failed = [call for call in readings.get('failedCalls', []) if 'NvLink' in call or 'Fabric' in call]
for gpu in readings.get('gpus', []):
    links = gpu.get('nvlinks', [])
    up = [link['link'] for link in links if link['active']]
    down = [link['link'] for link in links if not link['active']]
    totals = {}
    for link in links:
        for counter, value in link.get('errors', {}).items():
            if value is not None:
                totals[counter] = totals.get(counter, 0) + value
    fabric = gpu.get('fabric') or 'none (NOT_SUPPORTED)'
    print(f"GPU {gpu['index']} {gpu['uuid']}: {len(up)} of {len(links)} NVLink links up"
          + (f' (down: {down})' if down else '')
          + f"; error counters summed over links: {totals or 'none'}; fabric: {fabric}")
condition = report.get('condition', {})
print(f"condition: {condition.get('status')}/{condition.get('reason')}: {condition.get('message')}")
for call in failed:
    print(f'FAIL: NVLink/fabric read failed: {call}')
sys.exit(1 if failed else 0)
PY
)
printf '%s\n' "$report" | python3 -c "$summarise_links" || nvlink_verdict=1
if command -v nvidia-smi >/dev/null; then
  step "nvidia-smi nvlink --status and the fabric section, for comparison"
  nvidia-smi nvlink --status 2>&1 | head -80 || true
  nvidia-smi -q 2>/dev/null | grep -A4 -i "^ *fabric" | head -40 || true
  # Links up per GPU, as nvidia-smi counts them, against the agent's count.
  while IFS= read -r index; do
    smi_up=$(nvidia-smi nvlink --status -i "$index" 2>/dev/null | grep -c "Link [0-9]*: [0-9]" || true)
    agent_up=$(printf '%s\n' "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); print(sum(l['active'] for g in r['readings']['gpus'] if g['index']==$index for l in g.get('nvlinks',[])))")
    if [[ "$smi_up" == "$agent_up" ]]; then
      echo "ok: GPU $index has $agent_up NVLink links up, as nvidia-smi says"
    else
      echo "FAIL: GPU $index: nvidia-smi counts $smi_up NVLink links up, the agent $agent_up"; nvlink_verdict=1
    fi
  done < <(nvidia-smi --query-gpu=index --format=csv,noheader)
fi
if [[ $nvlink_verdict -ne 0 && $verdict -eq 0 ]]; then verdict=1; fi

step "MIG devices as the agent reads them (nvmlDeviceGetMigMode, nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId)"
# Read-only: a GPU not in MIG mode lists none. A failed MIG call is a detector fault and fails the
# check; the agent's MIG UUIDs must be the ones nvidia-smi -L lists.
mig_verdict=0
agent_migs=$(printf '%s\n' "$report" | python3 -c "
import json, sys
report = json.load(sys.stdin)
readings = report.get('readings', {})
for call in readings.get('failedCalls', []):
    if 'Mig' in call or 'InstanceId' in call:
        print('FAIL: ' + call, file=sys.stderr)
        sys.exit(1)
for gpu in readings.get('gpus', []):
    for mig in gpu.get('mig', []):
        print(mig['uuid'], 'GPU', gpu['index'], 'GPU instance', mig['gpuInstance'], 'compute instance', mig['computeInstance'], mig.get('name', ''))
") || mig_verdict=1
printf '%s\n' "${agent_migs:-none}"
if command -v nvidia-smi >/dev/null; then
  smi_migs=$(nvidia-smi -L 2>/dev/null | grep -o 'MIG-[0-9a-fA-F-]*' | sort || true)
  ours=$(printf '%s\n' "$agent_migs" | awk '/^MIG-/ {print $1}' | sort)
  if [[ "$smi_migs" == "$ours" ]]; then
    echo "ok: the agent reads the $(printf '%s' "$ours" | grep -c . || true) MIG devices nvidia-smi -L lists"
  else
    echo "FAIL: nvidia-smi -L lists MIG devices [$smi_migs], the agent [$ours]"; mig_verdict=1
  fi
fi
if [[ $mig_verdict -ne 0 && $verdict -eq 0 ]]; then verdict=1; fi

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
