#!/usr/bin/env bash
# In a Ray job's container, before `ray start`: Ray Train's default storage_path (~/ray_results,
# expanded in the driver's container and used as that path by every worker) made a link to DIR,
# a directory every node shares (a --mount: EFS, FSx, the simulated cluster's shared directory),
# so a TorchTrainer without RunConfig(storage_path) runs across nodes. Then runs the rest.
#
#   ray-storage.sh DIR COMMAND [ARGS...]
set -eu
dir=$1
shift
mkdir -p "$dir"
link="$HOME/ray_results"
if [ -L "$link" ] || [ ! -e "$link" ]; then
  ln -sfn "$dir" "$link"
else
  echo "[launch] ray: $link is a directory of the image, left as it is: Ray Train's default storage stays per node" >&2
fi
exec "$@"
