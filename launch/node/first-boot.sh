#!/bin/bash
# The EC2 user data of every node `dtrain nodes up` starts (launch/infra/ec2.py): cloud-init
# runs it once, as root, at first boot. Nothing here may stop the node from booting: a failed
# step is left for `dtrain doctor` to report.
#
# 1. pigz: dockerd decompresses image layers with unpigz when it is on the node, and a cold
#    pull took 1.4-1.5x as long without it (docs/benchmarks.md, "zstd layers on Docker 23+").
# 2. With `nodes up --efs`, the stack puts DTRAIN_EFS_ID and DTRAIN_EFS_REGION (AWS ids, not
#    user text) above this script: the cluster's EFS is mounted at /efs now and at every boot
#    (an fstab line, nofail), and EFS_MOUNT=/efs goes to /etc/environment (seed 002).
set -u

install_pigz() {
  command -v unpigz >/dev/null && return 0
  if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    get() { apt-get -q -o DPkg::Lock::Timeout=300 "$@"; }  # cloud-init's own apt run may hold the lock
    get install -y pigz || { get update && get install -y pigz; }
  elif command -v dnf >/dev/null; then
    dnf install -y -q pigz
  fi
  return 0
}

mount_efs() {
  [ -n "${DTRAIN_EFS_ID:-}" ] || return 0
  local path=${DTRAIN_EFS_PATH:-/efs} fstab=${DTRAIN_FSTAB:-/etc/fstab} envfile=${DTRAIN_ENVIRONMENT:-/etc/environment}
  local what="$DTRAIN_EFS_ID.efs.$DTRAIN_EFS_REGION.amazonaws.com:/"
  mkdir -p "$path"
  grep -q " $path nfs4 " "$fstab" 2>/dev/null ||
    echo "$what $path nfs4 nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev,nofail 0 0 # dtrain" >> "$fstab"
  grep -q '^EFS_MOUNT=' "$envfile" 2>/dev/null || echo "EFS_MOUNT=$path" >> "$envfile"
  # the mount target's DNS name can take a minute after the stack made it
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12; do
    mount "$path" && return 0
    sleep "${DTRAIN_EFS_RETRY_S:-10}"
  done
  return 0
}

install_pigz
mount_efs
exit 0
