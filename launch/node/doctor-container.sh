#!/bin/bash
# doctor-container.sh SSH... -- PEER...: run in a doctor's container: with the ssh argv SSH
# (without host: launch/jobs/container.py doctor_ssh), reach every peer's sshd (each gets ~10 s:
# the containers' sshd may still be starting); /dev/shm size, memlock, and how many EFA devices
# libfabric sees.
set -u
ssh=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do ssh+=("$1"); shift; done
[ $# -gt 0 ] && shift
try() {
  local i
  for i in $(seq 20); do
    out=$(timeout 15 "${ssh[@]}" "root@$1" 'command -v orted python' 2>&1) && return 0
    : "$i"
    sleep 0.5
  done
  return 1
}
for p in "$@"; do
  if try "$p"; then echo "peer $p=ok"; else echo "peer $p=$(echo "$out" | tail -1)"; fi
done
echo "shm_kb=$(df -Pk /dev/shm | awk 'NR==2 {print $2}')"
echo "memlock=$(ulimit -l)"
# EFA devices libfabric's EFA provider sees here (what aws-ofi-nccl can use); empty: no fi_info.
if command -v fi_info >/dev/null 2>&1; then
  echo "fi_efa=$(fi_info -p efa -t FI_EP_RDM 2>/dev/null | awk '/domain:/ {print $2}' | sort -u | wc -l)"
else
  echo "fi_efa="
fi
