#!/bin/sh
# Format a shared dataset volume, once, from one node; optionally copy a directory of this node
# onto it. Every node then mounts it read-only (volume-mount.sh): ext4 is not a cluster
# filesystem, so no node may write to it while others have it mounted.
# Usage: volume-format.sh DEVICE [SOURCE_DIR]   (root; run by `invoke volume create`)
# A device that already holds a filesystem (a volume made from a snapshot) is not formatted.
set -eu

dev=${1:?usage: volume-format.sh DEVICE [SOURCE_DIR]}
src=${2:-}

if [ ! -b "$dev" ]; then
    echo "volume-format: $dev is not a block device on $(hostname) (is the volume attached?)" >&2
    exit 2
fi
if grep -q "^$dev " /proc/mounts; then
    echo "volume-format: $dev is mounted on $(hostname); unmount it on every node first" >&2
    exit 2
fi
if [ -n "$src" ] && [ ! -d "$src" ]; then
    echo "volume-format: $src is not a directory on $(hostname)" >&2
    exit 2
fi

fstype=$(blkid -o value -s TYPE "$dev" || true)
if [ -z "$fstype" ]; then
    mkfs.ext4 -q -L dtrain-data "$dev"
    fstype=ext4
    echo "volume-format: formatted $dev (ext4) on $(hostname)"
else
    echo "volume-format: $dev already holds $fstype; not formatting"
fi

if [ -n "$src" ]; then
    tmp=$(mktemp -d)
    mount -t "$fstype" "$dev" "$tmp"
    trap 'umount "$tmp" && rmdir "$tmp"' EXIT
    cp -a "$src"/. "$tmp"/
    sync
    echo "volume-format: copied $src onto $dev"
fi
