#!/bin/bash
# doctor-container.sh PORT PEER...: run in a doctor's container: ssh to every peer's sshd on
# PORT (each gets ~10 s: the containers' sshd may still be starting), /dev/shm size, memlock.
set -u
port=$1
shift
try() {
  local i
  for i in $(seq 20); do
    out=$(timeout 15 ssh -p "$port" -o BatchMode=yes -o ConnectTimeout=5 "root@$1" 'command -v orted python' 2>&1) && return 0
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
