# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# image IMAGE PULL [CONTAINER]: inspect the image (and the job's stale container, removed if
# there), pull per policy (always|missing|never), then print `docker=ok` (or the engine's
# error, and stop) and `image=<min-driver> <openmpi-major> <id>`; sets $min_driver. Exits 1
# naming the image when it is neither on the node nor pullable. One `docker inspect` answers
# three questions: does the engine answer, is the image here (and its labels), is a container
# of this job left over. Image IDs start with sha256:, container IDs are bare hex.
image() {
  local ref=$1 pull=$2 name=${3:-} fmt out line stale err perr='' id om
  # `with`: an image without any label has no Labels map, and `index` of it fails the command.
  fmt="{{.Id}} {{with .Config.Labels}}{{or (index . \"$LABEL_MIN_DRIVER\") \"-\"}} "
  fmt+="{{or (index . \"$LABEL_OPENMPI_MAJOR\") \"-\"}}{{else}}- -{{end}}"
  inspect() { out=$(docker inspect -f "$fmt" "$@" 2>&1); }
  # the image's line (sha256:...), a stale container's (bare hex id), or the engine's error
  scan() {
    local l
    line='' stale='' err=''
    while IFS= read -r l; do
      case $l in
        sha256:*) [ -n "$line" ] || line=$l ;;
        'Error: No such object: '*|'') ;;
        *) if [[ $l =~ ^[0-9a-f]{64}\  ]]; then stale=1; else err=$l; fi ;;
      esac
    done <<< "$out"
  }
  if [ -n "$name" ]; then inspect "$ref" "$name"; else inspect "$ref"; fi
  scan
  if [ -n "$err" ]; then echo "docker=$err"; exit 0; fi
  echo docker=ok
  [ -z "$stale" ] || docker rm -f "$name" >/dev/null 2>&1
  case $pull in
    always)
      perr=$(pull_image "$ref" 2>&1 >/dev/null) || echo "pull failed (${perr##*$'\n'}); using the local image" >&2
      inspect "$ref"; scan ;;
    missing)
      if [ -z "$line" ]; then perr=$(pull_image "$ref" 2>&1 >/dev/null); inspect "$ref"; scan; fi ;;
    never) ;;
    *) echo "image: bad pull policy $pull" >&2; exit 2 ;;
  esac
  login_done
  if [ -z "$line" ]; then
    printf 'image %s is not on this node and could not be pulled%s\n' "$ref" "${perr:+: ${perr##*$'\n'}}" >&2
    exit 1
  fi
  read -r id min_driver om <<< "$line"
  echo "image=$min_driver $om $id"
}
