#!/usr/bin/env bash
# On a node: print a job's file (output.log, state.json) from its directory there, for
# `dtrain logs` and `dtrain status` of a detached job (launch/jobs/store.py node_file_argv).
#
#   job-file.sh JOB_DIR NAME FOLLOW
#
# JOB_DIR: relative to $HOME; FOLLOW: 1 keeps printing what is appended (tail -F), 0 prints it once.
f="${HOME:?}/$1/$2"
[ -f "$f" ] || { echo "no $2 of the job on this node" >&2; exit 1; }
if [ "$3" = 1 ]; then exec tail -n +1 -F "$f" 2>/dev/null; else exec cat "$f"; fi
