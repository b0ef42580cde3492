#!/bin/bash
# What NCCL chose for its network in this container, and what the container has (issue 51).
#   nccl_net.sh DIR WAIT_S [NAME...]
# Waits (at most WAIT_S seconds) until a rank's NCCL debug file (DIR/nccl.HOST.PID: the
# NCCL_DEBUG_FILE the launcher gives every rank, launch/jobs/nccl_net.py debug_env) says which
# network it uses, 2 s more for the node's other ranks, then prints, one key=value a line:
# itype (the EC2 instance type: DMI's product name), uverbs (the EFA devices the container sees),
# memlock (`ulimit -l`), `env NAME=VALUE` for each NAME set in a rank's environment, then
# `file=NAME` and that file's INIT/NET lines for each rank. The supervisor
# (launch/node/supervise.py check_nccl) runs it in every container and judges the lines
# (launch/jobs/nccl_net.py judge_node).
set -u
dir=$1 wait=$2
shift 2
said() { grep -lsE 'Using network|Initialized NET plugin' "$dir"/nccl.* 2>/dev/null | head -n 1; }
end=$((SECONDS + wait))
first=$(said)
while [ -z "$first" ] && [ "$SECONDS" -lt "$end" ]; do
  sleep 0.5
  first=$(said)
done
[ -z "$first" ] || sleep 2
itype=
read -r itype 2>/dev/null < /sys/devices/virtual/dmi/id/product_name
echo "itype=$itype"
n=0
for d in /dev/infiniband/uverbs*; do [ -e "$d" ] && n=$((n + 1)); done
echo "uverbs=$n"
echo "memlock=$(ulimit -l)"
files=("$dir"/nccl.*)
if [ -n "$first" ]; then
  pid=${first##*.}
  for name in "$@"; do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -m 1 "^$name=" | sed 's/^/env /'
  done
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  echo "file=${f##*/}"
  grep -sE 'NET/|Using network|Initialized NET plugin|NCCL version|NCCL WARN' "$f" | head -n 200
done
exit 0
