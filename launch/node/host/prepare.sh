# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# prepare NAME OWNER [IMAGE POLICY DIGEST]: first the node's lock of the job's name
# (lock_job: refused, exit 3, where another launch holds it), then the job's directory on this
# node (job_path: this node's own, also where nodes share the home; made anew, 0700, with an
# empty workdir/; an earlier launch's watchdog of it stopped), and the node watchdog's program
# in it (launch/node/watch.sh, from stdin, up to a NUL or its end), and the FIFOs through which
# the first node's container takes its supervisor (supervise.sh relay, launch/node/standby.sh).
# With IMAGE: first a line `held ID` where the node already holds it as POLICY asks (held_as),
# so the launch pulls only elsewhere; the one `docker image inspect` that asks it is kept
# ($inspected) where the node holds the image: the start step in the same session (prepare_up,
# image) reads it instead of asking the engine again. Prints the directory's absolute path last
# (the launcher mounts it into the container, and sends --workdir there).
prepare() {
  local d prog
  d=$(job_path "$1") || exit 2
  lock_job "$d" "$2" || exit
  if [ -n "${3:-}" ]; then
    inspect_image "$3"
    if [ -z "$img_err" ] && held_as "$img_line" "$4" "${5:-}"; then echo "held ${img_line%% *}"; else inspected=''; fi
  fi
  stop_watch "$d"  # a watchdog of an earlier launch of this job would remove what this one puts here
  rm -rf "$d" 2>/dev/null
  { IFS= read -r -d '' prog || true; }
  if ! { mkdir -p "$d/workdir" && chmod 700 "$d" && printf '%s' "$prog" > "$d/watch.sh" &&
          mkfifo "$d/sup.in" "$d/sup.out"; }; then
    echo "cannot make $d" >&2
    exit 1
  fi
  cd "$d" && pwd -P
}

# prepare_up NAME OWNER [IMAGE POLICY DIGEST]: the launch's first round and its start step in one
# session (no second ssh session, program and shell per node). prepare (stdin: the watchdog's
# program, then a NUL), then a line `prepared=1`; then the launcher's word on stdin: a line
# `go N`, then up's N arguments, each ending in a NUL; the rest of stdin is up's (password
# line, key, host key, env file). The end of stdin, or another line: the launch ended before its
# containers (another node refused, a pull failed), nothing more happens here.
prepare_up() {
  local line n i a args=()
  prepare "$@"
  echo prepared=1
  IFS= read -r line || exit 0
  case $line in
    "go "[0-9]*) n=${line#go } ;;
    *) exit 0 ;;
  esac
  for ((i = 0; i < n; i++)); do
    IFS= read -r -d '' a || { echo "prepare_up: $i of $n arguments" >&2; exit 2; }
    args+=("$a")
  done
  cd "${HOME:-/}" || cd /
  up "${args[@]}"
}

# node_root: this node's own directory under the ssh user's home, into $nroot:
# ~/.dtrain/nodes/HOST, HOST the node's hostname as its kernel has it (anything but letters,
# digits, _ . - made _). Nodes may share one home (NFS /home: ParallelCluster, most Slurm
# clusters) and each makes its job's directory anew at the same moment: every file a node keeps
# under the home is under its own root, so no node makes, locks or removes another's. A job's
# nodes have hostnames of their own (the launcher refuses a shared one: Open MPI needs them).
node_root() {
  local h=
  { read -r h < /proc/sys/kernel/hostname; } 2>/dev/null || h=$(uname -n)
  h=${h//[!A-Za-z0-9_.-]/_}
  case $h in ''|.*) h=_$h ;; esac
  nroot=${HOME:?}/.dtrain/nodes/$h
}

# job_path NAME: the job's directory on this node, $nroot/jobs/NAME (its lock beside it:
# NAME.lock), where NAME is a job name (letters, digits, _ . -, first a letter or digit); else an
# error (never $HOME itself, nor anything above the job's directory).
job_path() {
  if [[ -z $1 || $1 != [A-Za-z0-9]* || $1 == *[!A-Za-z0-9_.-]* ]]; then
    echo "dtrain node program: bad job name '$1'" >&2
    return 1
  fi
  node_root
  printf '%s\n' "$nroot/jobs/$1"
}

# old_job_path NAME: where dtrain before per-node directories kept the job, into $old
# (~/.dtrain/node-jobs/NAME, one for nodes that share the home): read and removed only where it
# exists (logs, status and stop of a job such a dtrain started).
old_job_path() {
  old=${HOME:?}/.dtrain/node-jobs/$1
}

# job_file NAME FILE FOLLOW: print FILE (output.log, state.json) of the job's directory on this
# node (`dtrain logs` and `status` of a detached job); FOLLOW 1: and what is appended (tail -F).
job_file() {
  local d f old
  d=$(job_path "$1") || exit 2
  case $2 in output.log|state.json) ;; *) echo "dtrain node program: no job file '$2'" >&2; exit 2 ;; esac
  f=$d/$2
  [ -f "$f" ] || { old_job_path "$1"; f=$old/$2; }
  [ -f "$f" ] || { echo "no $2 of the job on this node" >&2; exit 1; }
  if [ "$3" = 1 ]; then exec tail -n +1 -F "$f" 2>/dev/null; else exec cat "$f"; fi
}

# keep_workdir NAME KEY: after --workdir's sync, the job's copy (its workdir/) becomes this
# node's cache of that directory for the next launch, $nroot/workdir-cache/KEY (rsync's
# --link-dest: ../../../workdir-cache/KEY/ from the job's workdir/), by hard links (no data
# copied). Made aside and renamed in: another launch from the same directory at the same time
# keeps its own, or this one. Copies aside left by a launch killed meanwhile go after an hour.
keep_workdir() {
  local d c new
  d=$(job_path "$1") || exit 2
  [[ $2 =~ ^[0-9a-f]{16}$ ]] || { echo "dtrain node program: bad workdir cache key '$2'" >&2; exit 2; }
  node_root
  c=$nroot/workdir-cache/$2
  if ! { mkdir -p "${c%/*}" && new=$(mktemp -d "$c.new.XXXXXX") && cp -al "$d/workdir/." "$new/"; }; then
    [ -z "${new:-}" ] || rm -rf "$new"
    echo "cannot keep the workdir in $c" >&2
    exit 1
  fi
  find "${c%/*}" -maxdepth 1 -name "$2.new.*" -mmin +60 -exec rm -rf {} + 2>/dev/null
  rm -rf "$c"
  mv -T "$new" "$c" 2>/dev/null || rm -rf "$new"
}

# lock_job DIR OWNER: the node's lock of the job's name, DIR.lock (mkdir: atomic), OWNER (the
# launch: host, pid, a token of its own) in DIR.lock/owner. Taken where free, already this
# launch's, or stale: no watchdog of the job alive (watch.sh, DIR/watch.pid) and older than
# LOCK_GRACE s (a launch between its first round and its containers: pulls). Released by
# remove (teardown, `dtrain stop`) and by the job's watchdog when the container is gone.
LOCK_GRACE=1800
lock_job() {
  local lock=$1.lock holder age
  mkdir -p "${1%/*}" || { echo "cannot make ${1%/*}" >&2; return 1; }
  if ! mkdir -m 700 "$lock" 2>/dev/null; then
    holder=$(cat "$lock/owner" 2>/dev/null)
    if [ "$holder" != "$2" ]; then
      age=$(( $(date +%s) - $(stat -c %Y "$lock" 2>/dev/null || echo 0) ))
      if watch_alive "$1" || [ "$age" -lt "$LOCK_GRACE" ]; then
        echo "job ${1##*/} is already running on this node (launched by ${holder:-an unknown launcher}," \
          "${age} s ago); give this launch another --name, or stop that one: dtrain stop --job ${1##*/}" >&2
        return 3
      fi
      rm -rf "$lock"
      mkdir -m 700 "$lock" || { echo "cannot take the lock $lock" >&2; return 1; }
    fi
  fi
  printf '%s\n' "$2" > "$lock/owner"
}

# watch_alive DIR: the job's watchdog runs (its pid in DIR/watch.pid is a watch.sh).
watch_alive() {
  local pid
  pid=$(cat "$1/watch.pid" 2>/dev/null) && grep -qa watch.sh "/proc/$pid/cmdline" 2>/dev/null
}
