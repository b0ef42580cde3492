# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# probe PORT [CONTAINER]: what the launcher needs to know about this node, one key=value a line
# (launch/jobs/job.py facts_from_probe parses them). Sets $gpus $driver $efa $port $memlock for
# the steps after it in the same session. Builtins where they do: a node may run this with
# the launch's other steps on few cores. CONTAINER (up's: the job's): where the port is held, a
# container of that name (left running by an earlier launch of the job that could not clean
# up) is removed first and the port looked at again; a stopped one is start's.
probe() {
  local ssh_port=$1 stale=${2:-} h dpid a b c d e f dev
  # shellcheck disable=SC2086 # split SSH_CONNECTION into its four fields
  set -- ${SSH_CONNECTION:-}
  echo "addr=${3:-}"
  read -r h < /proc/sys/kernel/hostname; echo "hostname=$h"
  gpus=0 driver=
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    echo "gpus=$gpus"; echo "driver=$driver"
  fi
  efa=
  for dev in /dev/infiniband/uverbs*; do [ -e "$dev" ] && efa="$efa $dev"; done
  echo "efa=$efa"
  # ss filters in the kernel (reading /proc/net/tcp costs ~10x more); -p, slow (it reads every
  # process), only to name a holder.
  port=$(ss -Hltn "sport = :$ssh_port" 2>/dev/null)
  if [ -n "$port" ] && [ -n "$stale" ] && engine rm -f "$stale" >/dev/null 2>&1; then
    port=$(ss -Hltn "sport = :$ssh_port" 2>/dev/null)
  fi
  if [ -n "$port" ]; then
    port=$(ss -Hltnp "sport = :$ssh_port" 2>/dev/null | head -1)
    echo "port=$port"
    echo "port_jobs=$(docker ps --filter "label=$LABEL_JOB" --format "{{.Label \"$LABEL_JOB\"}}" 2>/dev/null | tr '\n' ' ')"
  fi
  # dockerd writes its pid without a newline: read fails at EOF but sets dpid.
  dpid=; read -r dpid 2>/dev/null < /var/run/docker.pid; [ -n "$dpid" ] || dpid=$(pgrep -o dockerd)
  memlock=
  while read -r a b c d e f; do
    [ "$a $b $c" != "Max locked memory" ] || memlock=$e
  done 2>/dev/null < "/proc/${dpid:-0}/limits"
  : "$d" "$f"
  echo "memlock=$memlock"
  echo "ipjson=$(ip -j addr 2>/dev/null)"
}
