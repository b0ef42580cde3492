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
# 3. With `nodes up` (lazy by default; not with --no-lazy), DTRAIN_LAZY=1 above this script: lazy loading with SOCI (issue 26,
#    docs/launch.md "Lazy loading"). soci-snapshotter from the node's own apt sources (Debian 13,
#    Ubuntu 24.04 have the package), run by a unit of its own before containerd; containerd gets
#    it as the proxy snapshotter `soci`; Docker moves to the containerd image store with storage
#    driver soci (daemon.json merged: the AMI's nvidia runtime stays). Where the package cannot
#    be had the node stays as it was: `dtrain doctor` (lazy-load) says "full pulls".
# 4. With an Elastic IP per node (several network interfaces, no public IPv4 from AWS), the stack
#    puts DTRAIN_WAIT_ADDRESS=1 above this script: the node has no way out until `nodes up`
#    associates the address once the instances run, so the steps that fetch packages wait until
#    the instance metadata shows a public address (at most DTRAIN_ADDRESS_WAIT_S, 900 s).
# 5. With `nodes up --idle-down MINUTES`, the stack puts DTRAIN_IDLE_DOWN_S (seconds),
#    DTRAIN_STACK, DTRAIN_REGION (AWS values) and DTRAIN_IDLE_PROGRAM (launch/node/idle_down.py,
#    gzip + base64) above this script: the program goes to /usr/local/lib/dtrain/idle_down.py,
#    its settings to /etc/dtrain/idle-down.env, and the service dtrain-idle-down runs it at
#    every boot: once no dtrain job container has run for that long, it deletes the stack.
set -u

wait_address() {
  [ "${DTRAIN_WAIT_ADDRESS:-}" = 1 ] || return 0
  local imds=${DTRAIN_IMDS:-http://169.254.169.254} end=$((SECONDS + ${DTRAIN_ADDRESS_WAIT_S:-900})) token
  while [ "$SECONDS" -lt "$end" ]; do
    token=$(curl -sf -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$imds/latest/api/token") &&
      curl -sf -m 2 -o /dev/null -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/public-ipv4" &&
      return 0
    sleep "${DTRAIN_ADDRESS_RETRY_S:-5}"
  done
  return 0
}

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

SOCI_UNIT='[Unit]
Description=SOCI snapshotter (lazy image loading; dtrain nodes up)
Before=containerd.service

[Service]
ExecStart=/usr/bin/soci-snapshotter-grpc
Restart=always
Type=simple

[Install]
WantedBy=multi-user.target
'
SOCI_PROXY='
[proxy_plugins.soci]
  type = "snapshot"
  address = "/run/soci-snapshotter-grpc/soci-snapshotter-grpc.sock"
'

# soci 0.4.1's own HTTP client: two retries, not eight (an image without an index costs ~8 s per
# layer otherwise; launch/infra/cluster.py soci_config, the simulated nodes' copy of this file)
SOCI_CONFIG='[background_fetch]
disable = false

[http]
MaxRetries = 2
MinWaitMsec = 20

[blob]
max_retries = 8
min_wait_msec = 30
'

configure_lazy() {
  [ "${DTRAIN_LAZY:-}" = 1 ] || return 0
  local conf=${DTRAIN_CONTAINERD_CONF:-/etc/containerd/config.toml} daemon=${DTRAIN_DAEMON_JSON:-/etc/docker/daemon.json}
  local units=${DTRAIN_UNIT_DIR:-/etc/systemd/system}
  if ! command -v soci-snapshotter-grpc >/dev/null; then
    local off="dtrain first boot: lazy loading off, full pulls (nodes up --no-lazy says so)"
    command -v apt-get >/dev/null || { echo "$off: no apt-get on this AMI to install soci-snapshotter" >&2; return 0; }
    export DEBIAN_FRONTEND=noninteractive
    get() { apt-get -q -o DPkg::Lock::Timeout=300 "$@"; }
    get install -y soci-snapshotter || { get update && get install -y soci-snapshotter; } \
      || { echo "$off: this node's apt sources have no soci-snapshotter package (Debian 13 and Ubuntu 25.04 do)" >&2; return 0; }
  fi
  local soci_conf=${DTRAIN_SOCI_CONF:-/etc/soci-snapshotter-grpc/config.toml}
  mkdir -p "${conf%/*}" "${daemon%/*}" "$units" "${soci_conf%/*}"
  printf '%s' "$SOCI_UNIT" > "$units/dtrain-soci.service"
  if [ -e "$soci_conf" ]; then
    echo "dtrain first boot: keeping $soci_conf as it is (dtrain's lazy nodes retry soci's own HTTP requests twice)" >&2
  else
    printf '%s' "$SOCI_CONFIG" > "$soci_conf"
  fi
  grep -q '^\[proxy_plugins.soci\]' "$conf" 2>/dev/null || printf '%s' "$SOCI_PROXY" >> "$conf"
  python3 -c '
import json, sys
path = sys.argv[1]
try:
    with open(path) as f:
        d = json.load(f)
except (OSError, ValueError):
    d = {}
d.setdefault("features", {})["containerd-snapshotter"] = True
d["storage-driver"] = "soci"
with open(path, "w") as f:
    json.dump(d, f, indent=2)
' "$daemon" || return 0
  systemctl daemon-reload
  systemctl enable --now dtrain-soci.service
  systemctl restart containerd docker
  return 0
}

IDLE_UNIT='[Unit]
Description=dtrain idle-down: delete the cluster stack once no dtrain job has run for a while
After=docker.service network-online.target
Wants=network-online.target

[Service]
EnvironmentFile=/etc/dtrain/idle-down.env
ExecStart=/usr/bin/python3 /usr/local/lib/dtrain/idle_down.py
Restart=on-failure
RestartSec=60

[Install]
WantedBy=multi-user.target
'

install_idle_down() {
  [ -n "${DTRAIN_IDLE_DOWN_S:-}" ] && [ -n "${DTRAIN_IDLE_PROGRAM:-}" ] || return 0
  local lib=${DTRAIN_IDLE_LIB:-/usr/local/lib/dtrain} etc=${DTRAIN_IDLE_ETC:-/etc/dtrain}
  local units=${DTRAIN_UNIT_DIR:-/etc/systemd/system}
  mkdir -p "$lib" "$etc" "$units"
  printf '%s' "$DTRAIN_IDLE_PROGRAM" | base64 -d | gunzip > "$lib/idle_down.py" || return 0
  printf 'DTRAIN_STACK=%s\nDTRAIN_REGION=%s\nDTRAIN_IDLE_DOWN_S=%s\n' \
    "${DTRAIN_STACK:-}" "${DTRAIN_REGION:-}" "$DTRAIN_IDLE_DOWN_S" > "$etc/idle-down.env"
  printf '%s' "$IDLE_UNIT" > "$units/dtrain-idle-down.service"
  if command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl enable --now dtrain-idle-down.service
  fi
  return 0
}

wait_address
install_idle_down
install_pigz
mount_efs
configure_lazy
exit 0
