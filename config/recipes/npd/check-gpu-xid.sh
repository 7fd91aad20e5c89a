#!/bin/sh
# node-problem-detector custom plugin: turns fatal NVIDIA XID lines of the kernel log into the
# node condition GpuFatalXid (see gpu-xid-monitor.json).
#
#   check-gpu-xid.sh [KERNEL_LOG]
#
# Reads KERNEL_LOG (e.g. /var/log/kern.log) or, without it, the kernel ring buffer (`dmesg`: the
# NPD container needs CAP_SYSLOG, which NPD's privileged DaemonSet has). The ring buffer lasts until
# the next boot, so a fatal XID keeps the condition True until the node is rebooted or replaced,
# which is what a fatal XID needs.
#
# NPD's custom-plugin protocol: exit 0 = OK (condition False), 1 = problem (condition True, with
# what this prints as the message), 2 = unknown. FATAL_XIDS lists the XIDs that count; the default
# is the fatal set of gpu-health-agent's catalog (config/xid-catalog.yaml).
FATAL_XIDS="${FATAL_XIDS:-46 48 54 62 64 74 79 95 110 119 120 136 140 143 154 155 158}"

if [ -n "$1" ]; then
  log=$(cat -- "$1" 2>/dev/null) || { echo "cannot read $1"; exit 2; }
else
  log=$(dmesg 2>/dev/null) || { echo "cannot read the kernel log (dmesg)"; exit 2; }
fi

# Kernel lines look like: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
found=""
for xid in $(printf '%s\n' "$log" | sed -n 's/.*NVRM: Xid ([^)]*): \([0-9][0-9]*\),.*/\1/p'); do
  for fatal in $FATAL_XIDS; do
    if [ "$xid" = "$fatal" ]; then
      found="$xid"
    fi
  done
done
if [ -z "$found" ]; then
  echo "no fatal NVIDIA XID in the kernel log"
  exit 0
fi
# The last line of that XID, as "XID 79 on PCI:0000:3b:00: pid=..., GPU has fallen off the bus."
printf '%s\n' "$log" | grep "NVRM: Xid ([^)]*): $found," | tail -n 1 |
  sed 's/.*NVRM: Xid (\([^)]*\)): \([0-9][0-9]*\), */XID \2 on \1: /'
exit 1
