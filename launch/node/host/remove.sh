# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# remove NAME KEYDIR [REL]: remove a job's container, its key directory and its directory ~/REL
# (a detached job's log and state included: `invoke stop` is the end of it); fine if none is there.
remove() {
  docker rm -f "$1" >/dev/null 2>&1
  rm -rf "$2"
  [ -z "${3:-}" ] || rm -rf "${HOME:?}/$3"
  true
}
