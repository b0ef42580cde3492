# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# now: the time into $t, seconds since the epoch with a fraction ($EPOCHREALTIME, bash 5, no
# process; its decimal point as the locale writes it; else date).
now() {
  if [ -n "${EPOCHREALTIME:-}" ]; then t=${EPOCHREALTIME/,/.}; else t=$(date +%s.%N); fi
}

# phase NAME SINCE: a line for the launch's timeline (launch/analysis/timeline.py): this node's
# step NAME (dtrain/contract.py LAUNCH_PHASES) ran from SINCE (a `now`) until now.
phase() {
  now
  printf '%s{"event": "phase", "phase": "%s", "at": %s, "end": %s}\n' "$SUPERVISOR_EVENT" "$1" "$2" "$t"
}
