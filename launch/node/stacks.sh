#!/bin/bash
# The Python stack of every process of one attempt in this container (a hang: --hang-timeout).
#   stacks.sh VAR ATTEMPT NODE [sample]
# The attempt's processes are those whose environment has VAR=ATTEMPT (DTRAIN_RESTART: what the
# supervisor gives each attempt, launch/node/supervise.py KILL_ATTEMPT finds them the same way);
# each Python one among them (but launch/node/rank_output.py, which tags a rank's lines) is
# dumped with `py-spy dump` (it reads the process's memory, so a rank stuck in a collective or
# stopped with SIGSTOP is read too; the container needs CAP_SYS_PTRACE). Every line starts with
# `[NODE rRANK] ` (the rank from OMPI_COMM_WORLD_RANK, RANK or HOROVOD_RANK; `[NODE] ` for a launcher process
# such as torchrun's agent).
# Without py-spy (an image older than it): SIGABRT, then SIGCONT, to each such process: one that
# enabled faulthandler (PYTHONFAULTHANDLER=1 in its --env) writes its stack to its own stderr,
# which reaches the job's log through the launcher; the attempt is ending anyway.
# `sample` (--straggler-check's periodic sampling: the attempt goes on): no signal, ever, and the
# rank is not paused for the read (py-spy --nonblocking).
set -u
var=$1 attempt=$2 node=$3 sample=${4:-}
spy=$(command -v py-spy || true)
[ -n "$spy" ] || spy=/usr/local/bin/py-spy  # where the images put it (templates/Dockerfile.j2)
[ -x "$spy" ] || spy=""

env_of() {  # env_of PID NAME: the value of NAME in the process's starting environment
  tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p" | head -n 1
}

found=0
# one grep over every process's environment (a grep per process costs seconds on a busy host)
while IFS= read -r env; do
  p=${env%/environ}
  pid=${p#/proc/}
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  case ${exe##*/} in python*) ;; *) continue ;; esac
  # not the rank's output tagger (launch/node/rank_output.py, its text in its command line)
  grep -qza '^# dtrain-rank-output' "$p/cmdline" 2>/dev/null && continue
  rank=$(env_of "$pid" OMPI_COMM_WORLD_RANK)
  [ -n "$rank" ] || rank=$(env_of "$pid" RANK)
  [ -n "$rank" ] || rank=$(env_of "$pid" HOROVOD_RANK)  # horovodrun's own (gloo) workers
  label="[$node${rank:+ r$rank}]"
  # state: R running, S sleeping (waiting: a socket, a lock), D disk, T stopped (SIGSTOP)
  state=$(sed 's/^.*) \(.\).*$/\1/' "$p/stat" 2>/dev/null)
  cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null | cut -c 1-160)
  found=$((found + 1))
  echo "$label stack of pid $pid, state $state: ${cmd% }"
  if [ -n "$spy" ]; then
    # A running process is paused for the read (a consistent stack); a stopped one is read as
    # it is. py-spy's header (Process, Python version) and blank lines are left out.
    mode=()
    [ "$state" != T ] || mode=(--nonblocking)
    [ -z "$sample" ] || mode=(--nonblocking)  # sampling: the rank runs on (a read may be inconsistent)
    timeout 20 "$spy" dump "${mode[@]}" --pid "$pid" 2>&1 | sed -e '/^Process [0-9]*: /d' -e '/^Python v/d' \
      -e '/^ *$/d' -e "s/^/$label   /"
  elif [ -n "$sample" ]; then
    echo "$label   (no py-spy in this image: not sampled)"
  else
    echo "$label   (no py-spy in this image: SIGABRT to pid $pid; its stack follows in its own output where faulthandler is on)"
    kill -ABRT "$pid" 2>/dev/null
    kill -CONT "$pid" 2>/dev/null
  fi
done < <(grep -lzx "$var=$attempt" /proc/[0-9]*/environ 2>/dev/null)
[ "$found" -gt 0 ] || echo "[$node] no Python process of attempt $attempt here"
exit 0
