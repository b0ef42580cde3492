#!/bin/bash
# The Python stack of every process of one attempt in this container (a hang: --hang-timeout).
#   stacks.sh VAR ATTEMPT NODE [sample [SEEN [KNOWN]]]
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
# `sample` (--straggler-check's periodic sampling: the attempt goes on): no signal, ever, and
# native frames too where they matter (`py-spy dump --native`: a rank blocked in gloo's or
# NCCL's c10d work, such as DDP's gradient allreduce inside backward, shows only there;
# launch/analysis/stacks.py native_wait). py-spy reads native frames only with the process
# paused, and loads libtorch's symbols while it is (about 2.4 s, docs/benchmarks.md): each
# process is read Python-only first (--nonblocking: not paused) and natively only where its main
# thread is idle (blocked: a collective's wait, I/O, a sleep), so a computing rank is never
# paused, and once per place it blocks at: KNOWN's lines, `PID FRAME` (the main thread's innermost
# Python frame), are the places read before (launch/analysis/straggler.py native_verdicts), whose
# verdict stands; a launcher's agent (no rank) and a rank's own workers (a DataLoader's: a child
# with its parent's rank) are never read natively, and at most NATIVE_AT_ONCE processes are read
# natively at a time (one that waits NATIVE_WAIT s for its turn is left to a later round). Where
# the native read fails, the Python-only read stands (said under the header).
# A hang's dump (no `sample`) reads Python frames only: it must come within seconds (the hang
# line waits for it), and a native read of every rank would take seconds each.
# The processes are read all at once.
set -u
var=$1 attempt=$2 node=$3 sample=${4:-} seen=${5:-} known=${6:-}
NATIVE_S=8  # s a native read may take (about 2.4 s on an idle core: docs/benchmarks.md)
NATIVE_AT_ONCE=4  # native reads at a time on this node (each about 1 CPU-s: docs/benchmarks.md)
NATIVE_WAIT=2  # s a native read waits for its turn; then the Python-only read stands this round
spy=$(command -v py-spy || true)
export NO_COLOR=1  # py-spy's lines as text: a colour code would hide `Thread`, `Python v` from the greps
unset CLICOLOR_FORCE
[ -n "$spy" ] || spy=/usr/local/bin/py-spy  # where the images put it (templates/Dockerfile.j2)
[ -x "$spy" ] || spy=""

env_of() {  # env_of PID NAME: the value of NAME in the process's starting environment
  tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p" | head -n 1
}

own_lines() {  # own_lines PID: py-spy's dump of PID (stdin) without its `Process PID: CMDLINE` line. The
  # command line is the process's own, its arguments joined by spaces: a newline in one would start
  # lines that read as py-spy's (a `Python v`, a `Thread`, a note); they go with it, counted from
  # /proc/PID/cmdline
  local nl
  nl=$(tr -cd '\n' < "/proc/$1/cmdline" 2>/dev/null | wc -c)
  awk -v head="Process $1: " -v more="${nl:-0}" 'NR == 1 && index($0, head) == 1 { skip = more; next }
    skip > 0 { skip--; next } { print }'
}

rank_of() {  # rank_of PID: the rank its environment gives (Open MPI's, torchrun's, horovodrun's), or nothing
  local r
  r=$(env_of "$1" OMPI_COMM_WORLD_RANK)
  [ -n "$r" ] || r=$(env_of "$1" RANK)
  [ -n "$r" ] || r=$(env_of "$1" HOROVOD_RANK)  # horovodrun's own (gloo) workers
  [[ $r =~ ^[0-9]{1,9}$ ]] && echo "$r"  # the process's own value: a number or none
}

is_rank_python() {  # is_rank_python PID: a Python process that is no rank's output tagger
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  case ${exe##*/} in python*) ;; *) return 1 ;; esac
  ! grep -qza '^# dtrain-rank-output' "/proc/$1/cmdline" 2>/dev/null
}

native_read() {  # native_read PID: py-spy's native dump in a free turn (exit 75: none within NATIVE_WAIT s)
  local i rc end=$((SECONDS + NATIVE_WAIT))
  command -v flock >/dev/null || { timeout "$NATIVE_S" "$spy" dump --native --pid "$1"; return; }
  while :; do  # NATIVE_AT_ONCE turns, each a lock file: the first one free
    for ((i = 0; i < NATIVE_AT_ONCE; i++)); do
      flock -n -E 75 "$tmp/native.$i" timeout "$NATIVE_S" "$spy" dump --native --pid "$1"
      rc=$?
      [ "$rc" = 75 ] || return "$rc"
    done
    [ "$SECONDS" -lt "$end" ] || return 75
    sleep 0.1
  done
}

running_of() {  # running_of PID: "R running of N", the process's threads but its main one
  awk -v main="$1" '{ s = $0; sub(/^.*\) /, "", s); if ($1 != main) { n++; if (substr(s, 1, 1) == "R") r++ } }
    END { printf "%d running of %d", r, n }' "/proc/$1/task/"*/stat 2>/dev/null
}

dump_one() {  # dump_one PID STATE LABEL RANK WORKER: py-spy's lines of the process, each after LABEL
  local pid=$1 state=$2 label=$3 rank=$4 worker=$5 out main inner native why rc minor by_state limit=20 mode=()
  [ "$state" != T ] || mode=(--nonblocking)  # a stopped process is read as it is
  # sampling: the rank runs on (a read may be inconsistent), and a round must end within the
  # supervisor's wait (launch/node/supervise.py sample_stragglers): reads bounded tighter
  [ -z "$sample" ] || { mode=(--nonblocking); limit=5; }
  out=$(timeout "$limit" "$spy" dump "${mode[@]}" --pid "$pid" 2>&1 | own_lines "$pid")
  # the main thread's line (py-spy names it where it can read the name, else it is listed first)
  main=$(printf '%s\n' "$out" | grep -m 1 '^Thread .*"MainThread"' || printf '%s\n' "$out" | grep -m 1 '^Thread ')
  # its innermost frame (the line after it): with the pid, the place a native read is known for
  inner=$(printf '%s\n' "$out" | grep -m 1 -A 1 -Fx -- "$main" | sed -n '2s/^ *//p')
  # Python 3.10 and older: py-spy tells a thread idle without pausing the process only from 3.11
  # (it needs the OS thread id); there the main thread's own kernel state stands for it: the
  # process's (/proc/PID/stat is its main thread's), S: asleep in the kernel (a collective's
  # wait, a lock, I/O). Said under the header, so that the place is read as idle too.
  # The state is read again after the dump: asleep before and after it, not only at the listing.
  minor=$(printf '%s\n' "$out" | sed -n 's/^Python v3\.\([0-9]\{1,3\}\)\..*/\1/p' | head -n 1)
  by_state=0
  if [ -n "$sample" ] && [ -n "$rank" ] && [ -n "$minor" ] && [ "$minor" -lt 11 ] && [ "$state" = S ] \
      && [[ $main != *" (idle)"* ]] && [ "$(sed 's/^.*) \(.\).*$/\1/' "/proc/$pid/stat" 2>/dev/null)" = S ]; then
    by_state=1
    echo "$label   (main thread idle by its state: Python 3.$minor)"  # launch/analysis/stacks.py Proc.main_idle
  fi
  # natively: a rank (not a launcher's agent) whose main thread is blocked; on a node under a CPU
  # quota (the straggler's own) a read takes ten times as long: NATIVE_S at most
  # and not where its Python frames show the wait already (SEEN: launch/analysis/stacks.py SEEN_IN_PYTHON)
  if [ -n "$sample" ] && [ -n "$rank" ] && [ "$worker" = 0 ] && [ "$state" != T ] \
      && { [[ $main == *" (idle)"* ]] || [ "$by_state" = 1 ]; } \
      && ! { [ -n "$seen" ] && printf '%s\n' "$out" | grep -qE -- "$seen"; } \
      && ! { [ -n "$known" ] && [ -n "$inner" ] && printf '%s\n' "$known" | grep -qFx -- "$pid $inner"; }; then
    native=$(native_read "$pid" 2>&1 | own_lines "$pid"; exit "${PIPESTATUS[0]}")  # rc: the read's
    rc=$?
    # py-spy's own error lines (a frame may say "error" too: c10::Error)
    why=$(printf '%s\n' "$native" | grep -m 1 '^Error' | cut -c 1-200)
    # under load py-spy can print the whole stack and then not exit within the bound: the stack
    # it printed stands (innermost frames first)
    if [ "$rc" = 75 ] && [ -z "$native" ]; then
      :  # no turn this round (NATIVE_AT_ONCE reads ran): a later round reads it, nothing to say
    elif [ -z "$why" ] && printf '%s\n' "$native" | grep -q '^Thread '; then
      out=$native
      echo "$label   (read natively)"  # launch/analysis/stacks.py Proc.native
    else  # said once per process: a collective's wait under C++ frames is not seen (docs/troubleshooting.md)
      [ "$rc" != 124 ] || why=${why:-no answer within $NATIVE_S s}
      echo "$label   (native frames not read: ${why:-py-spy --native failed, exit $rc})"
    fi
  fi
  # py-spy's header (Process, Python version) and blank lines are left out
  # (the label as awk's value, never as sed's script: RANK is the process's own environment)
  printf '%s\n' "$out" | sed -e '/^Process [0-9]*: /d' -e '/^Python v/d' -e '/^ *$/d' | awk -v p="$label   " '{ print p $0 }'
}

if ! tmp=$(mktemp -d 2>/dev/null); then  # a full /tmp: said, and the round names nobody
  echo "[$node] no stacks: cannot make a temporary directory (mktemp -d failed; /tmp full?)"
  exit 0
fi
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
  rank=$(rank_of "$pid")
  label="[$node${rank:+ r$rank}]"
  # state: R running, S sleeping (waiting: a socket, a lock), D disk, T stopped (SIGSTOP); then
  # the parent: a child of the rank's own Python process with its rank is its worker (a
  # DataLoader's); a rank under rank_output.py (mpirun's tagger, the same rank) is the rank
  read -r state ppid _ < <(sed 's/^.*) //' "$p/stat" 2>/dev/null)
  worker=0
  if [ -n "$rank" ] && [ "$(rank_of "${ppid:-0}")" = "$rank" ] && is_rank_python "$ppid"; then worker=1; fi
  # one line: a newline (any control character) in an argument would start a line of its own
  cmd=$(LC_ALL=C tr -c '[:print:]' ' ' < "$p/cmdline" 2>/dev/null | cut -c 1-160)
  found=$((found + 1))
  echo "$label stack of pid $pid, state $state: ${cmd% }" > "$tmp/$found"
  # sampling: how many of a rank's other threads run (state R, a quota's throttled ones too): a
  # rank blocked in its collective while its own threads do the collective's work waits for
  # itself, not for a peer (launch/analysis/straggler.py ranks_waiting)
  [ -z "$sample" ] || [ -z "$rank" ] || echo "$label   (other threads: $(running_of "$pid"))" >> "$tmp/$found"
  if [ -n "$spy" ]; then
    dump_one "$pid" "$state" "$label" "$rank" "$worker" >> "$tmp/$found" &
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
