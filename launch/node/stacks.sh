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
# `sample` (--straggler-check's periodic sampling: the attempt goes on): no signal, ever.
# Native frames too (`py-spy dump --native`: a rank blocked in gloo's or NCCL's c10d work, such as
# DDP's gradient allreduce inside backward, shows only there; launch/jobs/stacks.py native_wait).
# py-spy reads native frames only with the process paused, and loads libtorch's symbols while it
# is (about 2 s, docs/benchmarks.md): when sampling, a process is read Python-only first (not
# paused) and natively only where its main thread is idle (blocked: a collective's wait, or I/O,
# a sleep), so a computing rank is never paused and a waiting one is paused while it waits. The
# processes are read all at once. Where the native read fails, the Python-only read stands; a
# stopped process (T) is read Python-only, as it is.
set -u
var=$1 attempt=$2 node=$3 sample=${4:-}
spy=$(command -v py-spy || true)
[ -n "$spy" ] || spy=/usr/local/bin/py-spy  # where the images put it (templates/Dockerfile.j2)
[ -x "$spy" ] || spy=""

env_of() {  # env_of PID NAME: the value of NAME in the process's starting environment
  tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p" | head -n 1
}

dump_one() {  # dump_one PID STATE LABEL: py-spy's lines of the process, each after LABEL
  local pid=$1 state=$2 label=$3 out mode=()
  [ "$state" != T ] || mode=(--nonblocking)
  [ -z "$sample" ] || mode=(--nonblocking)  # the Python-only read: the rank runs on
  local native=1 py=""
  [ "$state" != T ] || native=""
  if [ -n "$sample" ] && [ -n "$native" ]; then
    py=$(timeout 20 "$spy" dump "${mode[@]}" --pid "$pid" 2>&1)
    printf '%s\n' "$py" | grep -m 1 '^Thread .*"MainThread"' | grep -q ' (idle)' || native=""
  fi
  if [ -n "$native" ] && ! out=$(timeout 20 "$spy" dump --native --pid "$pid" 2>&1); then
    # said once per process: a collective's wait under C++ frames is not seen (docs/troubleshooting.md)
    why=$(printf '%s\n' "$out" | grep -m 1 -i 'error' | cut -c 1-200)
    echo "$label   (native frames not read: ${why:-py-spy --native failed})"
    native=""
  fi
  [ -n "$native" ] || out=${py:-$(timeout 20 "$spy" dump "${mode[@]}" --pid "$pid" 2>&1)}
  # py-spy's header (Process, Python version) and blank lines are left out
  printf '%s\n' "$out" | sed -e '/^Process [0-9]*: /d' -e '/^Python v/d' -e '/^ *$/d' -e "s/^/$label   /"
}

tmp=$(mktemp -d) || exit 0
trap 'rm -rf "$tmp"' EXIT
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
  echo "$label stack of pid $pid, state $state: ${cmd% }" > "$tmp/$found"
  if [ -n "$spy" ]; then
    dump_one "$pid" "$state" "$label" >> "$tmp/$found" &
  elif [ -n "$sample" ]; then
    echo "$label   (no py-spy in this image: not sampled)" >> "$tmp/$found"
  else
    echo "$label   (no py-spy in this image: SIGABRT to pid $pid; its stack follows in its own output where faulthandler is on)" >> "$tmp/$found"
    kill -ABRT "$pid" 2>/dev/null
    kill -CONT "$pid" 2>/dev/null
  fi
done < <(grep -lzx "$var=$attempt" /proc/[0-9]*/environ 2>/dev/null)
wait
for i in $(seq 1 "$found"); do cat "$tmp/$i"; done
[ "$found" -gt 0 ] || echo "[$node] no Python process of attempt $attempt here"
exit 0
