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

# docker_api ARGS...: launch/node/docker-api.pl ($docker_api_pl) with ARGS; exit 3 (the CLI's
# to answer) where there is no such program. Perl runs without the user's PERL5OPT, PERL5LIB and
# PERL_UNICODE (which could change how it reads its arguments: a value sent in another encoding).
docker_api() {
  [ -n "${docker_api_pl:-}" ] || return 3
  PERL5OPT='' PERL5LIB='' PERL_UNICODE=0 perl -e "$docker_api_pl" "$@"
}

# engine ARGS...: `docker run -d ...` or `docker rm -f NAME` asked of the engine's socket by perl
# (docker_api: 2-3 ms of CPU where the CLI takes about 20), with the CLI's exit codes and error
# lines; the CLI itself (docker_brief) wherever that program leaves it to it (exit 3: a flag it
# does not read; another DOCKER_HOST or context; an engine that refused) or cannot run (no perl:
# 127; perl's own failure: 255). A GPU or EFA node's run (--gpus, --device) goes to the CLI at once.
engine() {
  local e a
  for a in "$@"; do case $a in --gpus|--device) docker_brief "$@"; return ;; esac; done
  docker_api "$@"; e=$?
  case $e in
    3|127|255) docker_brief "$@" ;;
    *) return "$e" ;;
  esac
}
