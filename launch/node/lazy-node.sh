#!/bin/bash
# A node that loads images lazily (issue 26, docs/launch.md "Lazy loading"): soci-snapshotter-grpc,
# containerd with it as a proxy snapshotter, then dockerd on the containerd image store with
# `soci` as its storage driver (exec'd: this program's pid becomes dockerd's).
#   lazy-node.sh DIR BIN [DOCKERD_ARG...]
#   DIR  the node's state: containerd.toml, soci.toml written by the caller (dtrain cluster up
#        --lazy: launch/infra/cluster.py; bench/bench_lazy.py); the two daemons' sockets and
#        logs stay under it (DIR/containerd/containerd.sock, DIR/soci/soci.sock)
#   BIN  a directory with containerd, containerd-shim-runc-v2, soci-snapshotter-grpc, dockerd,
#        docker-proxy (Debian 13's, unpacked); runc stays the machine's (Debian 13's needs
#        glibc 2.38)
#   DOCKERD_ARG  dockerd's own arguments (--config-file with {"features": {"containerd-snapshotter":
#        true}, "storage-driver": "soci"}, --containerd DIR/containerd/containerd.sock, ...)
# soci-snapshotter-grpc 0.4.1 keeps its artifact database under the fixed
# /var/lib/soci-snapshotter-grpc whatever its -root says: DIR/soci-lib is mounted there. Run it in a
# mount namespace of the node's own (the simulated cluster's node namespace; the bench's
# `unshare -m --propagation private`), so nodes do not share it and the host's stays untouched.
# The FUSE mounts the snapshotter makes live in that namespace too, where containerd and the
# containers see them.
set -eu
dir=$1
bin=$2
shift 2
export PATH="$bin:$PATH"

mkdir -p "$dir/soci" "$dir/soci-lib" /var/lib/soci-snapshotter-grpc
mount --bind "$dir/soci-lib" /var/lib/soci-snapshotter-grpc

soci-snapshotter-grpc -address "$dir/soci/soci.sock" -root "$dir/soci/root" \
  -config "$dir/soci.toml" >"$dir/soci.log" 2>&1 </dev/null &
containerd --config "$dir/containerd.toml" >"$dir/containerd.log" 2>&1 </dev/null &
for _ in $(seq 150); do
  if [ -S "$dir/containerd/containerd.sock" ] && [ -S "$dir/soci/soci.sock" ]; then
    exec dockerd "$@"
  fi
  sleep 0.2
done
echo "lazy-node.sh: containerd or soci-snapshotter-grpc did not start in 30 s: see $dir/containerd.log, $dir/soci.log" >&2
exit 1
