#!/usr/bin/env bash
# Pull an image on this node, only when needed, reporting progress as lines on stdout.
#
#   pull.sh IMAGE POLICY [DIGEST [REGISTRY USER]]
#
# POLICY: always  - pull unless the node already holds DIGEST (the registry's manifest digest,
#                   resolved once by the launcher); without DIGEST, always pull
#         missing - pull only when the node has no image of that name
# DIGEST: sha256:... as the registry's Docker-Content-Digest header gave it, or empty.
# REGISTRY USER: log in first (login, from host/login.sh sent before this file: the password
#                line on stdin, a Docker config of its own removed on exit).
#
# stdout, one event a line (dtrain.launch.jobs.pull parses them):
#   present ID               nothing pulled: the node has it (image ID)
#   pulling                  the pull has started
#   progress DL TOTAL UNPACKED   bytes downloaded, bytes to download, compressed bytes unpacked
#                            (sums over the layers the engine fetches; from the docker CLI's
#                            progress, which it prints only to a terminal: hence `script`)
#   storage DRIVER           Docker's storage driver, after `pulling` (soci: the node loads lazily)
#   lazy N                   a lazy node only, before `pulled`: N layers were mounted lazily (FUSE
#                            mounts of the SOCI snapshotter the pull added; 0: it pulled in full,
#                            the image has no SOCI index the snapshotter could read)
#   pulled ID                done (image ID)
# Errors go to stderr, exit 1. The image is passed to `script` in the environment, never
# spliced into its command text.
set -uo pipefail
shopt -s lastpipe  # the read loop below runs in this shell: $msg outlives it

image=${1:?usage: pull.sh IMAGE always|missing [DIGEST]}
policy=${2:?usage: pull.sh IMAGE always|missing [DIGEST]}
digest=${3:-}
if [ -n "${4:-}" ]; then
  login "$4" "${5:-}"
  # shellcheck disable=SC2154 # login_cfg: set by login (host/login.sh)
  export DOCKER_CONFIG=$login_cfg
fi
case $policy in always|missing) ;; *) echo "pull.sh: policy must be always or missing, got $policy" >&2; exit 2 ;; esac

image_id() { docker image inspect --format '{{.Id}}' "$image" 2>/dev/null; }

# holds: host/holds.sh, sent before this file
if id=$(holds "$image" "$policy" "$digest"); then
  echo "present $id"
  exit 0
fi

echo pulling
# Only where it pulls (a warm launch returned above): the driver says whether the node is lazy.
driver=$(docker info --format '{{.Driver}}' 2>/dev/null)
echo "storage ${driver:-unknown}"
soci_mounts() { awk '$0 ~ / - fuse[^ ]* / && /soci/ {n++} END {print n + 0}' /proc/self/mountinfo; }
[ "$driver" != soci ] || mounts_before=$(soci_mounts)
export DTRAIN_PULL_IMAGE=$image
# The docker CLI under a pty (`script`): progress as it draws it, cursor moves and \r included.
# Sizes are the CLI's (decimal units, 4 significant digits): about 0.1% off.
# shellcheck disable=SC2016 # $DTRAIN_PULL_IMAGE is for the shell `script` starts
script -qfec 'exec docker pull -- "$DTRAIN_PULL_IMAGE"' /dev/null </dev/null | awk '
function bytes(s,   n, u) {
  n = s + 0; u = s; sub(/^[0-9.]+/, "", u)
  if (u == "kB") n *= 1e3; else if (u == "MB") n *= 1e6; else if (u == "GB") n *= 1e9; else if (u == "TB") n *= 1e12
  return n
}
function report(   d, t, x, id) {
  d = t = x = 0
  for (id in tot) { t += tot[id]; d += dl[id]; x += ex[id] }
  if (d != ld || t != lt || x != lx) { printf "progress %d %d %d\n", d, t, x; fflush(); ld = d; lt = t; lx = x }
}
BEGIN { RS = "[\r\n]+"; ld = lt = lx = -1 }
{
  gsub(/\033\[[0-9;]*[A-Za-z]/, "")
  if (!match($0, /^[0-9a-f]+: /)) { if ($0 ~ /[A-Za-z]/) last = $0; next }
  id = substr($0, 1, RLENGTH - 2); st = substr($0, RLENGTH + 1)
  if (st ~ /^Already exists/) next
  # "Downloading [==>  ]  12.35MB/45.62MB 3s": the bar only on wide terminals, time left while < 50%
  n = split(st, f, " "); cur = 0; all = 0
  for (i = 1; i <= n; i++) if (f[i] ~ /^[0-9.]+[kMGT]?B\/[0-9.]+[kMGT]?B$/) { split(f[i], ct, "/"); cur = bytes(ct[1]); all = bytes(ct[2]) }
  if (!(id in tot)) { tot[id] = 0; dl[id] = 0; ex[id] = 0 }
  if (st ~ /^Downloading/) { if (all > 0) tot[id] = all; dl[id] = cur }
  else if (st ~ /^(Verifying Checksum|Download complete)/) dl[id] = tot[id]
  else if (st ~ /^Extracting/) { if (all > 0) tot[id] = all; dl[id] = tot[id]; ex[id] = cur }
  else if (st ~ /^Pull complete/) { dl[id] = tot[id]; ex[id] = tot[id] }
  report()
}
END { if (last != "") print "last " last }
' | while IFS= read -r line; do
  case $line in
    "last "*) msg=${line#last } ;;
    *) printf '%s\n' "$line" ;;
  esac
done
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "docker pull $image failed (exit $rc): ${msg:-no output}" >&2
  exit 1
fi
id=$(image_id) || { echo "docker pull $image: image not on the node after the pull" >&2; exit 1; }
[ "$driver" != soci ] || echo "lazy $(( $(soci_mounts) - mounts_before ))"
echo "pulled $id"
