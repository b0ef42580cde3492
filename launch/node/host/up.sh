# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# up PORT REGISTRY USER IMAGE PULL TIMEOUT KEYDIR PUBLIC_KEY NAME NWATCH WATCH... NAHEAD AHEAD... NHEAD ARGV...:
# the whole launch on one node, in one ssh session. WATCH: NWATCH words, the node watchdog's
# argv (launch/node/watch.sh), started once the container runs (none where NWATCH is 0). AHEAD:
# NAHEAD words run in the container once it runs, detached (the lazy start's prefetch,
# launch/node/prefetch.py; none where NAHEAD is 0). stdin: the registry password line (where REGISTRY is set),
# the job's private key, its containers' host key, its env file (read_secrets). Prints the
# probe's facts and `image=...`; then, unless the node declines (gate), `started=1` and starts the container (start), and the timeline's
# phase lines (phase.sh): `container` from here to the container running, then `sshd`.
up() {
  local ssh_port=$1 registry=$2 user=$3 ref=$4 pull=$5 timeout=$6 kd=$7 pub=$8 name=$9
  shift 9
  now; t_up=$t  # the timeline's `container` phase: from here to the container running (start)
  watch=("${@:2:$1}")
  shift $(($1 + 1))
  ahead=("${@:2:$1}")
  shift $(($1 + 1))
  login "$registry" "$user"
  read_secrets
  image "$ref" "$pull"
  probe "$ssh_port" "$name"
  gate || exit 0
  start "$kd" "$pub" "$timeout" "$ssh_port" "$name" "$@"
}

# Where the node itself declines to start (the launcher then names every such node at once,
# job.check_driver): port taken, or a GPU driver older than the image's label.
gate() {
  [ -z "$port" ] || return 1
  if [ "$gpus" != 0 ] && [ -n "$driver" ] && [ "${min_driver:--}" != - ] &&
     [ "$(printf '%s\n' "$min_driver" "$driver" | sort -V | head -1)" != "$min_driver" ]; then
    return 1
  fi
}

# pull REGISTRY USER IMAGE PULL: login and image only (doctor).
pull() {
  login "$1" "$2"
  image "$3" "$4"
}
