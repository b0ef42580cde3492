# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# remove NAME KEYDIR: remove a job's container and key directory; fine if neither is there.
remove() {
  docker rm -f "$1" >/dev/null 2>&1
  rm -rf "$2"
  true
}
