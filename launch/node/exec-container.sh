#!/usr/bin/env bash
# dtrain exec --container: run a command inside the job container running on this node.
# Args: LABEL_JOB JOB CMD [ARG...]. The container is the one docker ps finds with the label
# LABEL_JOB (every container a launch starts has it; its value is the job's name): JOB's where
# JOB is given, else the only one running here. Exit 3 where there is none, or several.
set -euo pipefail
label=$1 job=$2
shift 2
filter="label=$label"
[ -z "$job" ] || filter="label=$label=$job"
if ! found=$(docker ps --filter "$filter" --format '{{.Names}}'); then
  echo "docker ps failed on $(hostname): the ssh user cannot reach docker here" >&2
  exit 3
fi
mapfile -t names <<<"$found"
if [ -z "$found" ]; then
  if [ -n "$job" ]; then
    echo "no container of job $job is running on $(hostname) (dtrain status lists the jobs)" >&2
  else
    echo "no dtrain job container is running on $(hostname)" >&2
  fi
  exit 3
fi
if [ "${#names[@]}" -gt 1 ]; then
  echo "${#names[@]} dtrain job containers run on $(hostname) (${names[*]}): give --job NAME" >&2
  exit 3
fi
exec docker exec "${names[0]}" "$@"
