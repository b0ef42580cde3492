# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# image IMAGE PULL [CONTAINER]: inspect the image (and the job's stale container, removed if
# there), pull per policy (always|missing|never), then print `docker=ok` (or the engine's
# error, and stop) and `image=<min-driver> <openmpi-major> <id>`; sets $min_driver. Exits 1
# naming the image when it is neither on the node nor pullable. One `docker inspect` answers
# three questions: does the engine answer, is the image here (and its labels), is a container
# of this job left over; where this session's first round asked it already and the node held
# the image then (prepare: $inspected), that answer, and no second `docker inspect`.
image() {
  local ref=$1 pull=$2 name=${3:-} perr='' id om
  if [ -n "$inspected" ]; then inspected_scan; inspected=''; else inspect_image "$ref" "$name"; fi
  if [ -n "$img_err" ]; then echo "docker=$img_err"; exit 0; fi
  echo docker=ok
  [ -z "$img_stale" ] || docker rm -f "$name" >/dev/null 2>&1
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

# inspect_image IMAGE [CONTAINER]: one `docker inspect` of both; its output in $inspected, read
# by inspected_scan. Each image line: `ID MIN_DRIVER OPENMPI_MAJOR ["REPO@DIGEST",...]` (the
# labels `-` where unset); a container's: its bare hex ID and its image's labels.
inspect_image() {
  local fmt
  # `with`: an image without any label has no Labels map, and `index` of it fails the command.
  # RepoDigests only where the ID says image (sha256:...): a container has no such field.
  fmt="{{.Id}} {{with .Config.Labels}}{{or (index . \"$LABEL_MIN_DRIVER\") \"-\"}} "
  fmt+="{{or (index . \"$LABEL_OPENMPI_MAJOR\") \"-\"}}{{else}}- -{{end}}"
  fmt+='{{if eq (printf "%.7s" .Id) "sha256:"}} {{json .RepoDigests}}{{end}}'
  inspected=$(docker inspect -f "$fmt" "$1" ${2:+"$2"} 2>&1)
  inspected_scan
}

# inspected_scan: $inspected -> $img_line (the image's line; empty where the node lacks it),
# $img_stale (1 where a container of that name exists), $img_err (the engine's error, if any).
# Image IDs start with sha256:, container IDs are bare hex.
inspected=''
inspected_scan() {
  local l
  img_line='' img_stale='' img_err=''
  while IFS= read -r l; do
    case $l in
      sha256:*) [ -n "$img_line" ] || img_line=$l ;;
      'Error: No such object: '*|'') ;;
      *) if [[ $l =~ ^[0-9a-f]{64}\  ]]; then img_stale=1; else img_err=$l; fi ;;
    esac
  done <<< "$inspected"
}
