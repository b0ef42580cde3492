# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# prepare REL [IMAGE POLICY DIGEST]: the job's directory on this node, ~/REL (made anew, 0700,
# with an empty workdir/; an earlier launch's watchdog of it stopped), and the node watchdog's
# program in it (launch/node/watch.sh, from stdin). With IMAGE: first a line `held ID` where
# the node already holds it as POLICY asks (holds), so the launch pulls only elsewhere. Prints
# the directory's absolute path last (the launcher mounts it into the container).
prepare() {
  local d="$HOME/$1" id
  if [ -n "${2:-}" ] && id=$(holds "$2" "$3" "${4:-}"); then echo "held $id"; fi
  stop_watch "$d"  # a watchdog of an earlier launch of this job would remove what this one puts here
  rm -rf "$d" 2>/dev/null
  if ! { mkdir -p "$d/workdir" && chmod 700 "$d" && cat > "$d/watch.sh"; }; then
    echo "cannot make $d" >&2
    exit 1
  fi
  cd "$d" && pwd -P
}
