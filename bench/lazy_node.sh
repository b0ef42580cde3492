#!/bin/bash
# One simulated node of bench/bench_lazy.py: soci-snapshotter-grpc, containerd and dockerd,
# started in the node's network namespace and a mount namespace of its own (bench_lazy.py runs
# `nsenter --net=... unshare -m --propagation private bash lazy_node.sh DIR BIN`).
#   DIR  the node's state: containerd.toml, soci.toml, daemon.json written by bench_lazy.py;
#        everything the daemons write stays under it
#   BIN  a directory of the unpacked Debian 13 binaries (containerd, soci-snapshotter-grpc,
#        dockerd ...); runc stays Debian 12's (Debian 13's needs glibc 2.38)
# soci-snapshotter-grpc 0.4.1 keeps its artifact database and content store under the fixed
# /var/lib/soci-snapshotter-grpc whatever its -root says: the node's own DIR/varlib is mounted
# over /var/lib in this mount namespace, so nodes do not share it and the host's is untouched.
# The FUSE mounts the snapshotter makes live in this namespace too, where containerd and the
# containers see them; they end with the node.
set -eu
dir=$1
bin=$2
export PATH="$bin:$PATH"

mkdir -p "$dir/varlib/soci-snapshotter-grpc"
mount --bind "$dir/varlib" /var/lib

soci-snapshotter-grpc -address "$dir/soci/soci.sock" -root "$dir/soci/root" \
  -config "$dir/soci.toml" >"$dir/soci.log" 2>&1 </dev/null &
containerd --config "$dir/containerd.toml" >"$dir/containerd.log" 2>&1 </dev/null &
for _ in $(seq 150); do
  if [ -S "$dir/containerd/containerd.sock" ] && [ -S "$dir/soci/soci.sock" ]; then break; fi
  sleep 0.2
done
exec dockerd --config-file "$dir/daemon.json" --data-root "$dir/docker" --exec-root "$dir/exec" \
  --pidfile "$dir/docker.pid" -H "unix://$dir/docker.sock" \
  --containerd "$dir/containerd/containerd.sock" --containerd-namespace moby \
  --bridge none --iptables=false --ip6tables=false --userland-proxy=false >"$dir/dockerd.log" 2>&1 </dev/null
