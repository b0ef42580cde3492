#!/bin/sh
# Undo volume-mount.sh on this node after a failed `volume create`: unmount PATH and drop the
# fstab line volume-mount.sh wrote for it. Nothing mounted there is not an error.
# Usage: volume-umount.sh PATH [FSTAB]   (FSTAB default /etc/fstab)
set -u

path=${1:?usage: volume-umount.sh PATH [FSTAB]}
fstab=${2:-/etc/fstab}
if mountpoint -q "$path"; then
    umount "$path" || umount -l "$path"
fi
if [ -w "$fstab" ]; then
    (   # one writer at a time
        flock 9
        tmp=$(mktemp)
        # every line but dtrain's for this path (compared as text, not as a pattern)
        P=$path awk '!($2 == ENVIRON["P"] && $NF == "dtrain" && $(NF-1) == "#")' "$fstab" > "$tmp"
        cat "$tmp" > "$fstab"
        rm -f "$tmp"
    ) 9>/tmp/dtrain-fstab.lock
fi
echo "volume-umount: $path not mounted on $(hostname)"
