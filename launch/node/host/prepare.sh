# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# prepare REL OWNER [IMAGE POLICY DIGEST]: first the node's lock of the job's name
# (lock_job: refused, exit 3, where another launch holds it), then the job's directory on this
# node, ~/REL (made anew, 0700, with an empty workdir/; an earlier launch's watchdog of it
# stopped), and the node watchdog's program in it (launch/node/watch.sh, from stdin, up to a NUL
# or its end), and the FIFOs through which the first node's container takes its supervisor
# (supervise.sh relay, launch/node/standby.sh). With IMAGE: first a line `held ID` where the node already holds it as POLICY asks
# (held_as), so the launch pulls only elsewhere; the one `docker image inspect` that asks it is
# kept ($inspected) where the node holds the image: the start step in the same session
# (prepare_up, image) reads it instead of asking the engine again. Prints the directory's absolute path last (the launcher mounts it into the container).
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

# prepare_up REL OWNER [IMAGE POLICY DIGEST]: the launch's first round and its start step in one
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

# job_path REL: ~/REL, where REL is .dtrain/.../NAME with NAME a job name (letters, digits,
# _ . -, first a letter or digit) and no `.` or `..` component; else an error (never $HOME
# itself, nor anything above the job's directory).
job_path() {
  local name=${1##*/}
  case /$1/ in
    */./*|*/../*|//*) echo "dtrain node program: bad job directory '$1'" >&2; return 1 ;;
  esac
  if [[ -z $name || $name != [A-Za-z0-9]* || $name == *[!A-Za-z0-9_.-]* || $1 != .dtrain/*/* ]]; then
    echo "dtrain node program: bad job directory '$1'" >&2
    return 1
  fi
  printf '%s\n' "${HOME:?}/$1"
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
