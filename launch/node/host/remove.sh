# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# remove NAME KEYDIR [REL]: remove a job's container and key directory, and its directory ~/REL
# but for output.log and state.json (what `invoke logs` and `invoke status` read); fine if none
# is there.
remove() {
  docker rm -f "$1" >/dev/null 2>&1
  rm -rf "$2"
  if [ -n "${3:-}" ] && [ -d "$HOME/$3" ]; then
    find "$HOME/$3" -mindepth 1 -maxdepth 1 ! -name output.log ! -name state.json -exec rm -rf {} + 2>/dev/null
    rmdir "$HOME/$3" 2>/dev/null
  fi
  true
}
