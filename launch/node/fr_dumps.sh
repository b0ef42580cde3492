#!/bin/bash
# The flight recorder's dumps of this container's ranks (launch/jobs/flightrec.py), for a hang
# (--hang-timeout) or a failed attempt of a torchrun job.
#   fr_dumps.sh PREFIX WAIT
# PREFIX: the ranks' TORCH_FR_DUMP_TEMP_FILE (<job dir>/flightrec_rank_). First each rank's debug
# pipe (PREFIX R.pipe, TORCH_NCCL_DEBUG_INFO_PIPE_FILE: NCCL's watchdog creates it and dumps
# when a line is written to it) is asked for a dump, then up to WAIT s for a dump per pipe.
# Prints `fr RANK BASE64` per dump (one line, its bytes), `fr-none` where there is none.
set -u
prefix=$1 wait=${2:-5}
asked=0 pids=()
# every pipe at once: the open blocks until the rank reads, and a dead rank's pipe has no reader
# (2 s each, one after another, would pass the supervisor's wait with 8 ranks a node)
for p in "$prefix"*.pipe; do
  [ -p "$p" ] || continue
  # shellcheck disable=SC2016 # "$1" is the inner shell's argument, not expanded here
  timeout 2 sh -c 'echo 1 > "$1"' sh "$p" 2>/dev/null &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" && asked=$((asked + 1)); done
deadline=$((SECONDS + wait))
while [ "$asked" -gt 0 ] && [ "$SECONDS" -lt "$deadline" ]; do
  n=0
  for f in "$prefix"*; do [ -f "$f" ] && [[ ${f#"$prefix"} =~ ^[0-9]+$ ]] && n=$((n + 1)); done
  [ "$n" -ge "$asked" ] && break
  sleep 0.5
done
[ "$asked" -eq 0 ] || sleep 0.5  # a dump being written: torch writes a temporary file, then renames it
found=0
for f in "$prefix"*; do
  [ -f "$f" ] || continue
  r=${f#"$prefix"}
  case $r in *[!0-9]*|"") continue ;; esac
  echo "fr $r $(head -c 67108864 "$f" | base64 -w 0)"
  mv -f "$f" "$f.read" 2>/dev/null  # read once: a later attempt's hang reads its own
  found=$((found + 1))
done
[ "$found" -gt 0 ] || echo "fr-none"
exit 0
