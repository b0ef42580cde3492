# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# remove NAME KEYDIR [REL]: remove a job's container, its key directory and its directory ~/REL
# (a detached job's log and state included: `invoke stop` is the end of it); fine if none is there.
remove() {
  [ -z "${3:-}" ] || stop_watch "$HOME/$3"
  docker rm -f "$1" >/dev/null 2>&1
  rm -rf "$2"
  [ -z "${3:-}" ] || rm -rf "${HOME:?}/$3"
  true
}

# stop_watch DIR: stop the watchdog of the job whose directory is DIR (its pid in DIR/watch.pid),
# before a relaunch or a removal takes the directory from it.
stop_watch() {
  local pid
  if pid=$(cat "$1/watch.pid" 2>/dev/null) && grep -qa watch.sh "/proc/$pid/cmdline" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$1/watch.pid"
}
