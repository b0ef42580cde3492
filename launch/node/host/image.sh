# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# image IMAGE PULL: inspect the image, pull per policy (always|missing|never), then print
# `docker=ok` (or the engine's error, and stop) and `image=<min-driver> <openmpi-major> <id>`;
# sets $min_driver. Exits 1 naming the image when it is neither on the node nor pullable. One
# `docker image inspect` answers two questions: does the engine answer, is the image here (and
# its labels); where this session's first round asked it already and the node held the image
# then (prepare: $inspected), that answer, and no second one. A container of the job left from
# an earlier launch is not looked for here (an untyped `docker inspect` of both took 33 ms, the
# typed one of the image 17): up removes one that holds the port, start one whose name is taken.
image() {
  local ref=$1 pull=$2 perr='' id om
  if [ -n "$inspected" ]; then inspected_scan; inspected=''; else inspect_image "$ref"; fi
  if [ -n "$img_err" ]; then echo "docker=$img_err"; exit 0; fi
  echo docker=ok
  case $pull in
    always)
      perr=$(pull_image "$ref" 2>&1 >/dev/null) || echo "pull failed (${perr##*$'\n'}); using the local image" >&2
      inspect_image "$ref" ;;
    missing)
      if [ -z "$img_line" ]; then perr=$(pull_image "$ref" 2>&1 >/dev/null); inspect_image "$ref"; fi ;;
    never) ;;
    *) echo "image: bad pull policy $pull" >&2; exit 2 ;;
  esac
  login_done
  if [ -z "$img_line" ]; then
    printf 'image %s is not on this node and could not be pulled%s\n' "$ref" "${perr:+: ${perr##*$'\n'}}" >&2
    exit 1
  fi
  read -r id min_driver om _ <<< "$img_line"
  echo "image=$min_driver $om $id"
}

# inspect_image IMAGE: one `docker image inspect`; its output in $inspected, read by
# inspected_scan: `ID MIN_DRIVER OPENMPI_MAJOR ["REPO@DIGEST",...]` (the labels `-` where unset).
# Asked of the engine's socket by perl (holds.sh docker_api: 2-3 ms of CPU against the CLI's
# 18-21); the CLI where that program cannot answer (no perl, another DOCKER_HOST or context, an
# engine that does not answer: the CLI's error is the one to show).
inspect_image() {
  local fmt
  if inspected=$(docker_api image "$1" "$LABEL_MIN_DRIVER" "$LABEL_OPENMPI_MAJOR" 2>/dev/null); then
    inspected_scan
    return
  fi
  # `with`: an image without any label has no Labels map, and `index` of it fails the command.
  fmt="{{.Id}} {{with .Config.Labels}}{{or (index . \"$LABEL_MIN_DRIVER\") \"-\"}} "
  fmt+="{{or (index . \"$LABEL_OPENMPI_MAJOR\") \"-\"}}{{else}}- -{{end}} {{json .RepoDigests}}"
  inspected=$(docker_brief image inspect -f "$fmt" "$1" 2>&1)
  inspected_scan
}

# inspected_scan: $inspected -> $img_line (the image's line; empty where the node lacks it) and
# $img_err (the engine's error, if any). The CLI says a missing image as `Error: No such image:`
# (20.10) or `Error response from daemon: No such image:` (newer).
inspected=''
inspected_scan() {
  local l
  img_line='' img_err=''
  while IFS= read -r l; do
    case $l in
      sha256:*) [ -n "$img_line" ] || img_line=$l ;;
      *'No such image: '*|'') ;;
      *) img_err=$l ;;
    esac
  done <<< "$inspected"
}
