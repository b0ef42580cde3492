#!/bin/bash
# Run a rank's command with its node's own settings: `dtrain launch` writes node.env (KEY=VALUE
# lines, e.g. NCCL_SOCKET_IFNAME=eth0) into the job's key directory when nodes name their NICs
# differently, so one mpirun -x value cannot serve them all. No file: nothing changes.
set -euo pipefail
env_file=${DTRAIN_NODE_ENV:-/run/dtrain-job/node.env}
if [ -f "$env_file" ]; then
  while IFS='=' read -r name value; do
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    export "$name=$value"
  done < "$env_file"
fi
exec "$@"
