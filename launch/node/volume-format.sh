#!/bin/sh
# Format a shared dataset volume, once, from one node; optionally copy a directory of this node
# onto it. Every node then mounts it read-only (volume-mount.sh): ext4 is not a cluster
# filesystem, so no node may write to it while others have it mounted.
# Usage: volume-format.sh DEVICE [SOURCE]   (root; run by `dtrain volume create`)
# SOURCE: a directory on this node, or s3://BUCKET/PREFIX copied with the AWS CLI
# (`aws s3 sync`) and this node's own role (the instance profile `nodes up` gives it).
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
case $src in
    "") ;;
    s3://*)
        if ! command -v aws >/dev/null; then
            echo "volume-format: no aws command on $(hostname) to copy $src (the Deep Learning AMI has it)" >&2
            exit 2
        fi ;;
    *)
        if [ ! -d "$src" ]; then
            echo "volume-format: $src is not a directory on $(hostname)" >&2
            exit 2
        fi ;;
esac

fstype=$(blkid -p -o value -s TYPE "$dev" || true)  # -p: the device itself, not blkid's cache (a loop or EBS device reused)
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
    case $src in
        s3://*) aws s3 sync --only-show-errors "$src" "$tmp"/ ;;
        *) cp -a "$src"/. "$tmp"/ ;;
    esac
    sync
    echo "volume-format: copied $src onto $dev"
fi
