#!/bin/bash
# The EC2 user data of every node `dtrain nodes up` starts (launch/infra/ec2.py): cloud-init
# runs it once, as root, at first boot. It installs pigz: dockerd decompresses image layers
# with unpigz when it is on the node, and a cold pull took 1.4-1.5x as long without it
# (docs/benchmarks.md, "zstd layers on Docker 23+"). Nothing here may stop the node from
# booting: a failed install leaves a slower pull, which `dtrain doctor` reports (check docker).
set -u
command -v unpigz >/dev/null && exit 0
if command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  get() { apt-get -q -o DPkg::Lock::Timeout=300 "$@"; }  # cloud-init's own apt run may hold the lock
  get install -y pigz || { get update && get install -y pigz; }
elif command -v dnf >/dev/null; then
  dnf install -y -q pigz
fi
exit 0
