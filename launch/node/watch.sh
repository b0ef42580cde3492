#!/bin/bash
# The job's watchdog on one node, started by the launch and detached from its ssh session.
#   watch.sh CONTAINER IMAGE JOB_DIR KEY_DIR [IMDS_ENDPOINT [GRACE_S [HEARTBEAT_TIMEOUT_S [MODE]]]]
# Until the job's container on this node is gone:
# - a stopped container is removed (the supervisor stopped it at the job's end, or it died);
# - a running one is stopped when the supervisor's heartbeat, JOB_DIR/heartbeat (refreshed
#   from the first node every few seconds), is older than HEARTBEAT_TIMEOUT_S: the first node
#   or the way to it is gone, and nothing else would end this node's part of the job;
# - with IMDS_ENDPOINT (EC2's is http://169.254.169.254): the spot interruption notice is read
#   every 5 s (IMDSv2). On a notice the node is marked leaving (JOB_DIR/leaving: its heartbeat
#   to the supervisor says so within a second; the supervisor asks the job to checkpoint now,
#   then stops this node's container and swaps a spare in). Where the container still runs
#   GRACE_S later (no supervisor took it out), the job's processes in it get SIGTERM (time to
#   checkpoint) and it is removed 5 s after that.
# Then the node's copy of the job goes: KEY_DIR and JOB_DIR; for a detached job (MODE detach)
# except output.log and state.json (the first node's: `dtrain logs` and `dtrain status` read
# them; `dtrain stop` removes them). The node's lock of the job's name, JOB_DIR.lock
# (host/prepare.sh), is released then too.
set -u
c=$1 image=$2 dir=$3 keys=$4 imds=${5:-} grace=${6:-30} hb_timeout=${7:-90} keep=${8:-attach}
# Only a job's own directories (never $HOME, / or a store's root): absolute, the last part a
# job name (letters, digits, _ . -, first a letter or digit).
name=${dir##*/}
if [[ $dir != /?*/* || -z $name || $name != [A-Za-z0-9]* || $name == *[!A-Za-z0-9_.-]* ]]; then
  echo "watch.sh: bad job directory '$dir'" >&2; exit 2
fi
case $keys in /dev/shm/dtrain-?*) ;; *) echo "watch.sh: bad key directory '$keys'" >&2; exit 2 ;; esac

# The time by the shell's printf (UTC), not a `date` process: this starts on every node of every launch.
say() { local -x TZ=UTC0; printf '%(%FT%TZ)T watch: %s\n' -1 "$*" >> "$dir/watch.log"; }

remove_files() {
  # Not ours any more (the launcher's teardown, `dtrain stop` or a relaunch took the directory):
  # what is there now belongs to them. Where our pid file could not be written (a full disk),
  # the directory is still ours while no other watchdog's pid is in it and it is the same one.
  local owner
  owner=$(cat "$dir/watch.pid" 2>/dev/null)
  if [ -n "$owner" ] || [ "$pid_written" = 1 ]; then
    [ "$owner" = "$$" ] || return 0
  elif [ "$(stat -c %d:%i "$dir" 2>/dev/null)" != "$dir_id" ]; then
    return 0
  fi
  rm -rf "$keys"
  # The job may have written root-owned files in its working directory: where this user
  # cannot remove them, a throwaway container of the job's image (root) does.
  if ! rm -rf "$dir/workdir" 2>/dev/null; then
    docker run --rm --network none --entrypoint /bin/rm -v "$dir:/job" "$image" -rf /job/workdir \
      >/dev/null 2>&1
  fi
  if [ "$keep" = detach ]; then
    rm -f "$dir/plan.json" "$dir/builders.json" "$dir/env" "$dir/heartbeat" "$dir/leaving" "$dir/supervise.py" \
      "$dir/watch.sh" "$dir/watch.log" "$dir/spot.json" "$dir/watch.pid" "$dir/sup.in" "$dir/sup.out" "$dir/sup.rc"
    rmdir "$dir" 2>/dev/null  # only where nothing is kept (not the first node)
  else
    rm -rf "${dir:?}"
  fi
  rm -rf "${dir:?}.lock"  # the name is free on this node again
}

finish() {
  say "$1"
  # An engine that is down keeps the container (stopped) until it is back: keep trying.
  local out
  for _ in $(seq 720); do
    out=$(docker rm -f "$c" 2>&1) && break
    [[ $out == *"No such container"* ]] && break
    sleep 5
  done
  remove_files
  exit 0
}

spot_notice() {
  local token code
  token=$(curl -s -m 2 -X PUT "$imds/latest/api/token" \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300') || return 1
  code=$(curl -s -m 2 -o "$dir/spot.json" -w '%{http_code}' \
    -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/spot/instance-action") || return 1
  [ "$code" = 200 ]
}

touch "$dir/heartbeat"  # the supervisor must start within hb_timeout of the launch
dir_id=''
pid_written=1  # a relaunch of the job stops this watchdog first (host/prepare.sh)
if ! echo $$ 2>/dev/null > "$dir/watch.pid"; then
  pid_written=0  # a full disk: the key and env files still go when the job ends (remove_files)
  rm -f "$dir/watch.pid"
  dir_id=$(stat -c %d:%i "$dir")
fi
say "watching $c"
next_spot=0
while :; do
  # First a pause: the launch has just started the container (its first look would cost a
  # docker CLI call on every node while the launch's next steps need the CPU).
  sleep 2
  status=$(docker inspect -f '{{.State.Status}}' "$c" 2>&1)
  case $status in
    running) ;;
    *"No such"*|exited|dead) finish "container $c is $status" ;;
    *) ;;  # the engine does not answer: the heartbeat decides
  esac
  last=$(stat -c %Y "$dir/heartbeat" 2>/dev/null || echo 0)
  if [ $(( $(date +%s) - last )) -gt "$hb_timeout" ]; then
    finish "no heartbeat from the job's first node for over $hb_timeout s: stopping $c"
  fi
  if [ -n "$imds" ] && [ "$SECONDS" -ge "$next_spot" ]; then
    next_spot=$((SECONDS + 5))
    if spot_notice; then
      say "spot interruption notice: $(cat "$dir/spot.json" 2>/dev/null)"
      touch "$dir/leaving"
      for _ in $(seq "$grace"); do
        [ "$(docker inspect -f '{{.State.Status}}' "$c" 2>&1)" = running ] || finish "spot interruption: the supervisor took the node out"
        sleep 1
      done
      # the ranks (every process with DTRAIN_RESTART in its environment), not sshd or orted
      # shellcheck disable=SC2016
      docker exec "$c" sh -c 'for p in /proc/[0-9]*; do grep -qz "^DTRAIN_RESTART=" "$p/environ" 2>/dev/null && kill -TERM "${p#/proc/}"; done' >/dev/null 2>&1
      sleep 5
      finish "spot interruption: node left the job"
    fi
  fi
done
