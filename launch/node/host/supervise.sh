# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# supervise DIR MODE ARGV...: start the job's supervisor (launch/node/supervise.py) in the first
# node's container. stdin: supervise.py, a NUL, the plan (JSON), a NUL, the launcher's dtrain
# modules it imports (JSON: path -> text), a NUL; all go into DIR, the job's directory (mounted
# in the container). ARGV: the `docker exec` that runs it there (its
# readiness check first).
#   attach  exec ARGV: the rest of stdin stays the supervisor's, whose end (the launcher went
#           away: kill -9, lost network) stops a foreground job.
#   detach  ARGV starts the supervisor in the background and returns; print DIR/output.log up
#           to the job running (or failing), and leave the job to the node.
supervise() {
  local dir=$1 mode=$2 sup plan builders
  shift 2
  umask 077
  IFS= read -r -d '' sup || true
  IFS= read -r -d '' plan || true
  IFS= read -r -d '' builders || true
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
