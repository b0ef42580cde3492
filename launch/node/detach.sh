#!/usr/bin/env bash
# In the first container: run ARGV... detached from the session's stdin, stdout and stderr (a
# detached job's supervisor, started under `setsid -f`: its output goes to its files only;
# launch/jobs/job.py).
#
#   detach.sh ARGV...
exec "$@" </dev/null >/dev/null 2>&1
