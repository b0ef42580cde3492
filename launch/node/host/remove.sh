# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# remove CONTAINER KEYDIR [NAME]: remove a job's container, its key directory and this node's
# directory of job NAME (job_path; a detached job's log and state included: `dtrain stop` is the
# end of it), and release the node's lock of the name (its .lock beside it); fine if none is
# there. A job that dtrain before per-node directories started (old_job_path) goes too.
remove() {
  local d='' old=''
  if [ -n "${3:-}" ]; then
    d=$(job_path "$3") || exit 2
    stop_watch "$d"
    old_job_path "$3"
    if [ -d "$old" ] || [ -d "$old.lock" ]; then stop_watch "$old"; else old=''; fi
  fi
  engine rm -f "$1" >/dev/null 2>&1
  case $2 in /dev/shm/dtrain-?*) rm -rf "$2" ;; esac
  [ -z "$d" ] || rm -rf "${d:?}" "${d:?}.lock"
  [ -z "$old" ] || rm -rf "${old:?}" "${old:?}.lock"
  true
}

# stop_watch DIR: stop the watchdog of the job whose directory is DIR (its pid in DIR/watch.pid),
# before a relaunch or a removal takes the directory from it. Its whole process group (start.sh
# starts it with setsid): the `sleep` or docker call it is waiting on goes with it, not left
# running on its own (a cluster teardown right after a launch found them).
stop_watch() {
  local pid
  if pid=$(cat "$1/watch.pid" 2>/dev/null) && grep -qa watch.sh "/proc/$pid/cmdline" 2>/dev/null; then
    kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$1/watch.pid"
}
