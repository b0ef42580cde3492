#!/bin/bash
# Runs in a job's container, before the job's command (launch/jobs/job.py sends it with
# `docker exec NAME bash -c "$(cat run.sh)" dtrain-run OPTIONS -- COMMAND...`):
#   --env FILE         export the job's --env values: NAME=base64(value) lines (0600, in the
#                      job key mount); values never travel in argv or get printed
#   --host ADDR NAME   a node of the job (repeat); its hostname resolves to ADDR in each container
#   --fill-hosts       add the nodes to this container's /etc/hosts (torchrun: one per node)
#   --ready SECONDS    ssh to every node's container at once (filling its /etc/hosts), leaving a
#                      master connection per node that mpirun's daemon launch reuses; exits
#                      with --ready-code naming the node whose sshd does not answer within SECONDS
#   --ready-beside     with --ready: COMMAND starts at once, beside the check (its own start
#                      overlaps the handshakes), reading the check's exit code (0, or
#                      --ready-code) from its fd 3 ($DTRAIN_READY_FD) when it ends, then
#                      reaping its process ($DTRAIN_READY_PID)
#   --ready-skip ADDR  a --host the ready check leaves out: this container's own node, where the
#                      command starts nothing over ssh (mpirun's local ranks)
#   --ready-code N     that exit code (dtrain/contract.py READY_FAILED)
#   --ready-says TEXT  what starts the line naming that node (dtrain/contract.py READY_SAYS)
#   --port PORT        the containers' sshd port (--ready: ssh-connect.pl's socket, the error line)
#   --ssh WORD         the ssh argv, without host, of --ready (repeat: `--ssh ssh --ssh -p ...`;
#                      launch/jobs/container.py ready_ssh: the master connection's options too);
#                      none: plain `ssh`
#   --connect PROGRAM  with --ready and the master options: the text of launch/node/ssh-connect.pl;
#                      each node's master connection is made first, over a socket it opens with
#                      Nagle off (40 ms less a key exchange), then the session rides it. Ignored
#                      where the image has no perl or the address is IPv6.
#   --phase-says TEXT  with --ready: a line on stderr for each node once reached, TEXT then
#                      {"event": "phase", "phase": "ready", "node": ADDR, "at": EPOCH, "end": EPOCH}
#                      (the launch's timeline: launch/analysis/timeline.py)
# then execs COMMAND.
set -u
READY_FAILED=1 READY_SAYS=
envfile='' fill=0 ready='' beside=0 skip='' port=22 hosts=() ssh=() phase_says='' connect=''
while [ $# -gt 0 ]; do
  case $1 in
    --env) envfile=$2; shift 2 ;;
    --host) hosts+=("$2" "$3"); shift 3 ;;
    --fill-hosts) fill=1; shift ;;
    --ready) ready=$2; shift 2 ;;
    --ready-beside) beside=1; shift ;;
    --ready-skip) skip=$2; shift 2 ;;
    --ready-code) READY_FAILED=$2; shift 2 ;;
    --ready-says) READY_SAYS=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --ssh) ssh+=("$2"); shift 2 ;;
    --phase-says) phase_says=$2; shift 2 ;;
    --connect) connect=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

if [ -n "$envfile" ] && [ -s "$envfile" ]; then
  while IFS= read -r line; do
    name=${line%%=*}
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    value=$(printf '%s' "${line#*=}" | base64 -d && echo x)  # x: keeps trailing newlines
    export "$name=${value%x}"
  done < "$envfile"
fi

# The lines every container's /etc/hosts gets once (the node's own file is not touched).
list=$(mktemp)
{
  echo "# dtrain job nodes"
  for ((i = 0; i < ${#hosts[@]}; i += 2)); do printf '%s %s\n' "${hosts[i]}" "${hosts[i + 1]}"; done
} > "$list"
add_hosts='grep -qx "# dtrain job nodes" /etc/hosts || cat >> /etc/hosts'
if [ "$fill" = 1 ]; then bash -c "$add_hosts" < "$list"; fi

# reach HOST: the ssh session that fills HOST's /etc/hosts; with --connect (and perl here), first
# the master connection it then rides (ssh -f -N: back once authenticated), made by
# ssh-connect.pl over a socket with Nagle off.
reach() {
  if [ -n "$connect" ] && [[ $1 != *:* ]]; then
    perl -e "$connect" "$1" "$port" 3 "${ssh[@]}" -o ProxyCommand=- -o ControlMaster=auto -f -N "root@$1" || return
  fi
  "${ssh[@]}" "root@$1" "$add_hosts" < "$list" >/dev/null
}
[ "${#ssh[@]}" -gt 0 ] || ssh=(ssh)
command -v perl >/dev/null || connect=''

# ready_check: ssh to every --host but --ready-skip's at once; fails (--ready-code) naming a node
# whose sshd does not answer within --ready seconds.
ready_check() {
  local deadline pids=() p h since t
  deadline=$((SECONDS + ready))
  # the time with a fraction: bash 5's $EPOCHREALTIME (no process), else date
  stamp() { if [ -n "${EPOCHREALTIME:-}" ]; then t=${EPOCHREALTIME/,/.}; else t=$(date +%s.%N); fi; }
  stamp; since=$t
  for ((i = 0; i < ${#hosts[@]}; i += 2)); do
    h=${hosts[i]}
    [ "$h" != "$skip" ] || continue
    ( tries=0
      until reach "$h" 2>"/tmp/ssh-$h.err"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
          echo "${READY_SAYS}sshd on $h:$port not reachable: $(tail -1 "/tmp/ssh-$h.err")" >&2; exit 1
        fi
        # sshd not listening yet (its container just started): soon again, then less often
        case $((tries++)) in 0|1|2|3|4) sleep 0.02 ;; 5|6|7|8|9) sleep 0.05 ;; *) sleep 0.2 ;; esac
      done
      if [ -n "$phase_says" ]; then
        stamp
        printf '%s{"event": "phase", "phase": "ready", "node": "%s", "at": %s, "end": %s}\n' \
          "$phase_says" "$h" "$since" "$t" >&2
      fi ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || return "$READY_FAILED"; done
}

if [ -n "$ready" ] && [ "$beside" = 1 ]; then
  exec 3< <(ready_check; echo "$?"; rm -f "$list")
  export DTRAIN_READY_FD=3 DTRAIN_READY_PID=$!  # the check: the command's child now (to reap)
  exec "$@"
fi
if [ -n "$ready" ]; then ready_check || exit; fi
rm -f "$list"
exec "$@"
