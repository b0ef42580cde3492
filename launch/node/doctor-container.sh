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
  # ~10 s per peer, whatever fails: a refused connection (sshd still starting) is tried again
  # every 0.5 s; a dropped one costs its 5-s connect timeout, so two tries, not twenty (a
  # count of tries made a firewalled peer cost 20 x 5.5 s).
  local end=$((SECONDS + 10))
  while :; do
    out=$(timeout 15 "${ssh[@]}" "root@$1" 'command -v orted python' 2>&1) && return 0
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.5
  done
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
