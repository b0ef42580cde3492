#!/bin/sh
# Mount the cluster's shared dataset volume on this node.
# Usage: volume-mount.sh ebs DEVICE PATH      read-only; the options that keep a non-cluster
#                                             filesystem shared by several nodes from being
#                                             written (ext4: noload, xfs: norecovery: no journal
#                                             replay, which would write)
#        volume-mount.sh efs DNS-NAME PATH    read-write NFS 4.1 with the options AWS recommends
# Idempotent: a PATH that already has this source mounted is left as it is.
# A 4th argument names the fstab to keep the mount in (default /etc/fstab; tests give their own).
set -eu

kind=${1:?usage: volume-mount.sh ebs|efs SOURCE PATH}
source=${2:?usage: volume-mount.sh ebs|efs SOURCE PATH}
path=${3:?usage: volume-mount.sh ebs|efs SOURCE PATH}
fstab=${4:-/etc/fstab}

case $kind in
    ebs)
        if [ ! -b "$source" ]; then
            echo "volume-mount: $source is not a block device on $(hostname) (is the volume attached?)" >&2
            exit 2
        fi
        fstype=$(blkid -o value -s TYPE "$source" || true)
        case $fstype in
            ext4) opts=ro,noload ;;
            xfs) opts=ro,norecovery ;;
            "") echo "volume-mount: $source has no filesystem (run volume-format.sh on one node)" >&2; exit 2 ;;
            *) opts=ro ;;
        esac
        what=$source ;;
    efs)
        fstype=nfs4
        opts=nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport
        what="$source:/" ;;
    *)
        echo "volume-mount: unknown kind $kind (ebs or efs)" >&2
        exit 2 ;;
esac

mkdir -p "$path"
if mountpoint -q "$path"; then
    current=$(findmnt -n -o SOURCE --mountpoint "$path" || true)
    if [ "$current" = "$what" ] || [ "$(readlink -f "$what")" = "$current" ]; then
        echo "volume-mount: $path already has $what on $(hostname)"
        exit 0
    fi
    echo "volume-mount: $path on $(hostname) already has $current mounted; pick another path" >&2
    exit 2
fi
mount -t "$fstype" -o "$opts" "$what" "$path"
echo "volume-mount: $what on $path ($opts) on $(hostname)"

# The same mount at every boot: an fstab line (nofail: a missing volume does not stop the boot),
# replacing any earlier dtrain line for this path.
if [ -w "$fstab" ]; then
    (   # one writer at a time
        flock 9
        tmp=$(mktemp)
        # every line but dtrain's for this path (compared as text, not as a pattern)
        P=$path awk '!($2 == ENVIRON["P"] && $NF == "dtrain" && $(NF-1) == "#")' "$fstab" > "$tmp"
        printf '%s %s %s %s,nofail,_netdev 0 0 # dtrain\n' "$what" "$path" "$fstype" "$opts" >> "$tmp"
        cat "$tmp" > "$fstab"
        rm -f "$tmp"
    ) 9>/tmp/dtrain-fstab.lock
    echo "volume-mount: $fstab mounts $what on $path at boot on $(hostname)"
fi
