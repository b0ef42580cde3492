# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# doctor PORT [IMAGE]: the launch's probe, then what only the doctor asks (engine, runtimes,
# disk, instance type, clock, unpigz, the image's ID, size and labels).
doctor() {
  local info root id
  echo "t=$(date +%s.%N)"
  # the storage driver last: `soci` where the node loads images lazily (dtrain cluster up, lazy by default)
  if info=$(timeout 10 docker info --format '{{.ServerVersion}}|{{json .Runtimes}}|{{.DockerRootDir}}|{{.Driver}}' 2>&1); then
    echo "docker=ok"; echo "docker_info=$info"
  else
    echo "docker=$(echo "$info" | tail -1)"
  fi
  root=$(echo "${info:-}" | awk -F'|' 'NF == 4 {print $3}'); root=${root:-/var/lib/docker}
  echo "disk_kb=$(df -Pk "$root" 2>/dev/null | awk 'NR==2 {print $4}')"
  echo "instance_type=$(cat /sys/devices/virtual/dmi/id/product_name 2>/dev/null)"
  echo "ntp=$(timedatectl show -p NTPSynchronized --value 2>/dev/null)"
  echo "unpigz=$(command -v unpigz 2>/dev/null)"
  if [ -n "${2:-}" ]; then
    if id=$(timeout 20 docker image inspect -f '{{.Id}}' "$2" 2>/dev/null); then
      echo "image_id=$id"
      echo "image_size=$(docker image inspect -f '{{.Size}}' "$2")"
      echo "image_labels=$(docker image inspect -f '{{json .Config.Labels}}' "$2")"
    else
      echo "image_id="
    fi
  fi
  probe "$1"
}
