# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# supervise DIR MODE ARGV...: start the job's supervisor (launch/node/supervise.py) in the first
# node's container. stdin: a line of three byte counts, then as many bytes of each: supervise.py,
# the plan (JSON), the launcher's dtrain modules it imports (JSON: path -> text); all go into
# DIR, the job's directory (mounted in the container). Counts, not NUL-ended parts: `read -N`
# takes each part in a few reads, where `read -d ''` reads a pipe a byte at a time (~150 KB:
# 35 ms of CPU on the launch's path). ARGV: the `docker exec` that runs it there (its
# readiness check first).
#   attach  exec ARGV: the rest of stdin stays the supervisor's, whose end (the launcher went
#           away: kill -9, lost network) stops a foreground job.
#   detach  ARGV starts the supervisor in the background and returns; print DIR/output.log up
#           to the job running (or failing), and leave the job to the node.
#   standby ARGV (run.sh's, without `docker exec`) goes to the container that waits for it
#           (launch/node/standby.sh, the job's container on this node): see relay.
supervise() {
  local dir=$1 mode=$2 n=() sup plan builders
  shift 2
  umask 077
  read -r -a n || true
  # in bytes: `read -N` counts characters in a UTF-8 locale
  LC_ALL=C IFS= read -r -N "${n[0]:-0}" sup || true
  LC_ALL=C IFS= read -r -N "${n[1]:-0}" plan || true
  LC_ALL=C IFS= read -r -N "${n[2]:-0}" builders || true
  if ! { printf '%s' "$sup" > "$dir/supervise.py" && printf '%s' "$plan" > "$dir/plan.json" &&
          printf '%s' "$builders" > "$dir/builders.json" && : > "$dir/output.log"; }; then
    echo "cannot write the supervisor into $dir" >&2
    exit 1
  fi
  if [ "$mode" = attach ]; then exec "$@"; fi
  if [ "$mode" = standby ]; then relay "$dir" "$@"; fi
  "$@" || exit
  for _ in $(seq 1200); do
    if grep -qE "^${SUPERVISOR_EVENT}"'\{"event": "(running|failed)"' "$dir/output.log"; then
      cat "$dir/output.log"
      exit 0
    fi
    sleep 0.1
  done
  echo "the job's supervisor did not start within 120 s" >&2
  exit 1
}

# relay DIR ARGV...: the supervisor through the container's standby (launch/node/standby.sh),
# over DIR's FIFOs: ARGV counted into sup.in, then this session's stdin (its end stops the job),
# and sup.out to this session's stdout until the supervisor and all it started are gone; exits
# with its code (DIR/sup.rc; 137 where the container went without one, as `docker exec` says).
# Every FIFO is opened read-write first, which never blocks: a container that is gone, or has
# not reached its standby yet, cannot hang this; the standby's first line `standby` (STANDBY_WAIT
# s at most) says it holds sup.out, and only then this lets go of its own writer, so that the end of
# sup.out is the supervisor's.
STANDBY_WAIT=30
relay() {
  local dir=$1 line rc feeder a LC_ALL=C  # C: ${#a} counts bytes, as the standby's read -N does
  shift
  # shellcheck disable=SC2094 # a FIFO: this end writes (until the standby holds it), that one reads
  exec 3<>"$dir/sup.in" 5<>"$dir/sup.out" 4<"$dir/sup.out"
  { for a in "$@"; do printf '%s ' "${#a}"; done; echo; printf '%s' "$@"; } >&3
  if ! IFS= read -r -t "$STANDBY_WAIT" line <&4 || [ "$line" != standby ]; then
    echo "the job's container did not take its supervisor within $STANDBY_WAIT s" >&2
    exit 1
  fi
  exec 5>&-
  cat <&0 >&3 &
  feeder=$!
  exec 3>&-
  cat <&4
  rc=137
  read -r rc 2>/dev/null < "$dir/sup.rc"  # before the standby may end (the feeder's end): then the
  kill "$feeder" 2>/dev/null               # container stops, and its watchdog removes DIR
  exit "$rc"
}
