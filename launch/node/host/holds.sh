# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# holds IMAGE POLICY [DIGEST]: succeeds, printing the image ID, where this node already holds
# IMAGE as POLICY asks: missing - any image of that name; always - one pulled as DIGEST (the
# registry's manifest digest, which the launcher resolved once; none given: never held).
# One `docker image inspect`. Used by launch/node/pull.sh and by prepare (the launch's first
# round asks it, so a warm launch's pull step opens no session of its own).
holds() {
  local out
  out=$(docker image inspect --format '{{.Id}} {{json .RepoDigests}}' "$1" 2>/dev/null) || return 1
  # RepoDigests: ["repo@sha256:..."] for each registry name the image was pulled as
  if [ "$2" = missing ] || { [ -n "${3:-}" ] && [[ $out == *"@$3\""* ]]; }; then
    echo "${out%% *}"
    return 0
  fi
  return 1
}
