#!/bin/bash
# The first node's container under an attached launch waits here for the job's supervisor, so
# that no `docker exec` (0.06 s, and a CLI and runc's CPU) stands between the launcher's word
# and the supervisor: launch/jobs/job.py runs this container as `docker run ... IMAGE bash -c
# "$(cat standby.sh)" dtrain-standby DIR` (the image's entrypoint starts sshd beside this; an
# image built before dtrain's entrypoint did that runs `sshd -e` first, which works as well).
# DIR: the job's directory (mounted), with two FIFOs the node made (host/prepare.sh):
#   sup.in   from host/supervise.sh (standby mode): a line of byte counts, then run.sh's argv
#            (each part counted; `bash -c RUNSH NAME ARGS...`, as `docker exec` would run it);
#            the rest is the supervisor's stdin, whose end (the launcher went away) stops the job
#   sup.out  the supervisor's output (stdout and stderr), after a first line `standby`
# The supervisor runs as this process's child; this one, the container's PID 1, reaps orphans.
# Once it ends: its exit code into DIR/sup.rc, then every other process of the container is
# killed (ssh masters the job left would hold sup.out open: the relay reads up to its end), then
# this closes its own sup.out (held until now, so the relay finds sup.rc at the end) and waits
# for the relay to close sup.in (10 s at most) before the container ends.
set -u
dir=$1 n=() parts=() i=0
exec 3<"$dir/sup.in" || exit 1
read -r -a n <&3 || exit 0  # the launch ended before its supervisor: nothing to run
for ((i = 0; i < ${#n[@]}; i++)); do
  LC_ALL=C IFS= read -r -N "${n[i]}" "parts[i]" <&3 || exit 1  # bytes: -N counts characters in UTF-8
done
exec 4>"$dir/sup.out" || exit 1
echo standby >&4
"${parts[@]}" <&3 >&4 2>&4 3<&- 4>&- &
child=$!
wait "$child"
rc=$?
printf '%s\n' "$rc" > "$dir/sup.rc"
# kill(-1) from a namespace's init reaches every other process in it, never the init itself
if [ "$$" = 1 ]; then kill -KILL -1 2>/dev/null; fi
exec 4>&-  # held until now: the relay's end of sup.out comes after sup.rc
while IFS= read -r -t 10 _ <&3; do :; done
exit "$rc"
