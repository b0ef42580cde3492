# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# login REGISTRY USER: where REGISTRY is not empty, read the password line from stdin and log
# in to REGISTRY in a per-launch Docker config directory ($login_cfg, tmpfs, 0700), used for the
# pull only and removed after it (login_done): no registry credential stays on the node.
login_cfg=
login() {
  [ -n "$1" ] || return 0
  local pw
  IFS= read -r pw
  login_cfg=$(mktemp -d /dev/shm/dtrain-docker-XXXXXX) || { echo "cannot make a Docker config directory" >&2; exit 1; }
  trap login_done EXIT
  printf '%s\n' "$pw" | DOCKER_CONFIG=$login_cfg docker login -u "$2" --password-stdin "$1" >/dev/null \
    || { echo "docker login to $1 failed" >&2; exit 1; }
}

login_done() {
  [ -z "$login_cfg" ] || rm -rf "$login_cfg"
  login_cfg=
}

# docker pull -q IMAGE, with the login's credentials where there is one.
pull_image() {
  if [ -n "$login_cfg" ]; then DOCKER_CONFIG=$login_cfg docker pull -q "$1"; else docker pull -q "$1"; fi
}
