# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# booted: whether this node has finished starting, for a node that came while a job runs (an Auto
# Scaling group's replacement, made a spare: launch/jobs/joining.py). Prints one word: `booting`
# while cloud-init (the instance's first boot: launch/node/first-boot.sh, which restarts the
# docker engine) has not ended, `no-docker` where the engine does not answer yet, else `ready`.
booted() {
  local s
  if command -v cloud-init >/dev/null 2>&1; then
    s=$(cloud-init status 2>/dev/null)
    case $s in *running*|*"not started"*|*not?run*) echo booting; return 0 ;; esac
  fi
  if ! docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then
    echo no-docker
    return 0
  fi
  echo ready
}
