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
