# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# holds IMAGE POLICY [DIGEST]: succeeds, printing the image ID, where this node already holds
# IMAGE as POLICY asks (held_as). One `docker image inspect`. Used by launch/node/pull.sh; the
# launch's first round (prepare) asks the same with the inspect the start step reads again
# (image.sh inspect_image), so a warm launch's pull step opens no session of its own.
holds() {
  local out
  out=$(docker_brief image inspect --format '{{.Id}} {{json .RepoDigests}}' "$1" 2>/dev/null) || return 1
  held_as "$out" "$2" "${3:-}" || return 1
  echo "${out%% *}"
}

# held_as LINE POLICY [DIGEST]: whether an image, LINE `ID ... ["REPO@DIGEST",...]` (its
# RepoDigests: one for each registry name it was pulled as), is held as POLICY asks: missing -
# any image of that name; always - one pulled as DIGEST (the registry's manifest digest, which
# the launcher resolved once; none given: never held).
held_as() {
  [ -n "$1" ] || return 1
  [ "$2" = missing ] || { [ -n "${3:-}" ] && [[ $1 == *"@$3\""* ]]; }
}

# docker_brief ARGS...: a docker CLI call that is over in tens of ms (image inspect, run -d, rm
# -f): Go's runtime on one thread and without its garbage collector, 18-21 ms of CPU instead of
# 23-25 (docs/benchmarks.md, "Issue 52: the warm launch's CPU"). Not for pull, exec or logs, which may run long.
docker_brief() {
  GOMAXPROCS=1 GOGC=off docker "$@"
}
