# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# The job's secrets, the rest of the session's stdin (after a login's password line): the
# private key (up to its END line) into $key, the containers' host key (the same) into
# $hostkey, then the job's env file (NAME=base64(value) lines) into $envs. Builtins only.
read_secrets() {
  read_key key
  read_key hostkey
  envs=
  IFS= read -r -d '' envs || true
}

# read_key VAR: stdin's lines up to an OpenSSH private key's END line (or the end) into VAR.
read_key() {
  local l k=
  while IFS= read -r l; do
    k+=$l$'\n'
    [[ $l != *"END OPENSSH PRIVATE KEY"* ]] || break
  done
  printf -v "$1" '%s' "$k"
}

# node_flags: docker run's flags that depend on this node, from the probe's $gpus (a count),
# $efa (device paths) and $memlock (dockerd's hard limit in bytes; anything else: unlimited),
# into the array $flags. Their one definition: a program that starts such a container on its own
# machine gets them from here too (launch/jobs/node_programs.py node_flags).
node_flags() {
  local d
  case ${memlock:-} in
    ''|*[!0-9]*) flags=(--ulimit memlock=-1) ;;
    *) flags=(--ulimit "memlock=$memlock:$memlock") ;;
  esac
  case ${gpus:-0} in ''|0|*[!0-9]*) ;; *) flags+=(--gpus all) ;; esac
  for d in ${efa:-}; do flags+=(--device "$d"); done
}

# start KEYDIR PUBLIC_KEY TIMEOUT PORT NAME NHEAD ARGV...: write the job's key pair, the
# containers' host key and the env file to KEYDIR (0700, tmpfs), run ARGV
# (commands.docker_run_parts: its head's NHEAD words, then node_flags, then the rest), wait
# until the container's sshd
# listens on PORT. Fails with the container's last log lines if it exits, or after TIMEOUT s.
# Phase lines for the timeline (phase.sh): `container` (since up's $t_up), then `sshd`.
watch=() ahead=()
start() {
  local kd=$1 pub=$2 timeout=$3 port=$4 name=$5 nhead=$6 i=0 err run
  shift 6
  [ -n "${t_up:-}" ] || { now; t_up=$t; }
  echo started=1  # from here on, the launcher removes what may be on this node
  umask 077
  { rm -rf "$kd" && mkdir "$kd" && printf '%s' "$key" > "$kd/id_ed25519" &&
    printf '%s\n' "$pub" > "$kd/authorized_keys" && printf '%s' "$hostkey" > "$kd/ssh_host_ed25519_key" &&
    printf '%s' "$envs" > "$kd/env"; } \
    || { echo "cannot write the job key to $kd" >&2; exit 1; }
  node_flags
  run=("${@:1:nhead}" "${flags[@]}" "${@:nhead+1}")
  # A stopped container of the job left by an earlier launch takes the name: removed, once.
  # (run's head is `docker run`: its words after `docker` go to engine)
  if ! err=$(engine "${run[@]:1}" 2>&1 >/dev/null); then
    if [[ $err != *"is already in use by container"* ]] || ! engine rm -f "$name" >/dev/null 2>&1 ||
       ! err=$(engine "${run[@]:1}" 2>&1 >/dev/null); then
      printf '%s\n' "$err" >&2
      exit 1
    fi
  fi
  # The job's watchdog (up's $watch): detached from this session, it outlives the launcher
  # (setsid: a session of its own and no terminal, so no hangup reaches it; no nohup needed).
  if [ "${#watch[@]}" -gt 0 ]; then setsid bash "${watch[@]}" </dev/null >/dev/null 2>&1 & fi
  # The lazy start's prefetch (up's $ahead), in the container beside the job's start.
  if [ "${#ahead[@]}" -gt 0 ]; then docker exec -d "$name" "${ahead[@]}" </dev/null >/dev/null 2>&1 & fi
  phase container "${t_up:-$t}"; t_run=$t
  echo run=1  # the launcher may go on now; this session still reports sshd (or a crash)
  # ss asks the kernel for just this socket: polling /proc/net/tcp cost ~40 ms a look. The first
  # look after a pause too: the container's entrypoint has only begun, and a look costs ~4 ms of
  # the kernel's walk of its listening sockets (docs/benchmarks.md, "Issue 52: the warm launch's CPU").
  SECONDS=0
  while sleep 0.1; [ -z "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]; do
    i=$((i + 1))
    if [ $((i % 10)) = 0 ] && [ "$(docker_brief inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
      echo "container $name exited: $(docker logs --tail 3 "$name" 2>&1 | tr '\n' ' ')" >&2; exit 1
    fi
    if [ "$SECONDS" -ge "$timeout" ]; then
      echo "sshd in $name not listening on $port after $timeout s" >&2; exit 1
    fi
  done
  phase sshd "$t_run"
}
