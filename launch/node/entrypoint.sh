#!/bin/bash
# Entrypoint of every dtrain image.
#   no arguments: sshd on port 2022 in the foreground (a node of a job), one `sshd -i` per
#                 connection behind sshd-listen.pl (Nagle off: no 40 ms stalls in key exchanges)
#   arguments:    the same listener in the background, then exec the arguments
#   train:        a SageMaker training job (`docker run IMAGE train`): the job key from the
#                 `dtrain` channel, sshd, then sagemaker_train.py (reads /opt/ml, runs the job)
# Host keys are never baked into the image: each container makes its own here, or under
# `dtrain launch` takes its job's (below).
set -euo pipefail

# Until sshd listens this script is on every launch's path (a node's sshd answering, the first
# node's standby starting): builtins where a program would cost 1-2 ms each (no install, stat,
# mkdir where the image has the directory).
umask_was=0022  # the container's, which everything else here and the command keep
while read -r k v; do [ "$k" != Umask: ] || { umask_was=$v; break; }; done < /proc/self/status

# copy SRC DEST MODE: SRC's bytes into a new file DEST (one already there, of an image or a
# link, removed first: it would keep its mode), MODE 600 or 644, by the shell alone.
copy() {
  local data=
  [ -r "$1" ] || { echo "entrypoint: cannot read $1" >&2; return 1; }
  IFS= read -r -d '' data < "$1" || [ -n "$data" ] || [ ! -s "$1" ] ||
    { echo "entrypoint: cannot read $1" >&2; return 1; }  # status 1 at the end of the file (no NUL)
  if [ -e "$2" ] || [ -L "$2" ]; then rm -f -- "$2"; fi
  if [ "$3" = 600 ]; then umask 077; else umask 022; fi
  printf '%s' "$data" > "$2"
  umask "$umask_was"
}

# `dtrain launch` mounts the job's key pair read-only at /run/dtrain-job (a 0700 directory in
# the node's /dev/shm, owned by whoever ran ssh there): installed as root's, 0600, before sshd
# starts, so a node whose sshd answers already trusts the job's key. Beside it the host key of
# the job's containers, made by the launcher with the pair (the clients check no host key:
# ssh_config; one per job saves each container's ssh-keygen); elsewhere one of its own.
job=/run/dtrain-job installed=
hostkey=/etc/ssh/ssh_host_ed25519_key
if [ ! -f "$hostkey" ]; then
  if [ -s "$job/ssh_host_ed25519_key" ]; then
    copy "$job/ssh_host_ed25519_key" "$hostkey" 600
  else
    ssh-keygen -q -t ed25519 -N "" -f "$hostkey"
  fi
fi
if [ -f "$job/id_ed25519" ]; then
  [ -d /root/.ssh ] || mkdir -m 700 /root/.ssh
  copy "$job/id_ed25519" /root/.ssh/id_ed25519 600
  copy "$job/authorized_keys" /root/.ssh/authorized_keys 644
  installed=/root/.ssh/id_ed25519
fi

# SageMaker has no way to hand a secret to a container at launch: `dtrain sagemaker run` puts
# the job's private key in the `dtrain` input channel (S3, never a hyperparameter); every
# instance gets the same copy and trusts its public half.
if [ "$#" -eq 1 ] && [ "$1" = train ]; then
  sm_key=/opt/ml/input/data/dtrain/id_ed25519
  if [ -f "$sm_key" ]; then
    install -d -m 700 -o root -g root /root/.ssh
    install -m 600 -o root -g root "$sm_key" /root/.ssh/id_ed25519
    ssh-keygen -y -f /root/.ssh/id_ed25519 > /root/.ssh/authorized_keys
    chmod 644 /root/.ssh/authorized_keys
  fi
  set -- python3 /opt/dtrain/node/sagemaker_train.py
fi

# A private key mounted read-only and readable by others (a Kubernetes Secret without
# defaultMode 0600, as the MPI operator may mount it) is ignored by the ssh client
# ("UNPROTECTED PRIVATE KEY FILE!"): use a private copy, listed first in ssh_config.
for key in /root/.ssh/id_rsa /root/.ssh/id_ecdsa /root/.ssh/id_ed25519; do
  if [ ! -f "$key" ] || [ "$key" = "$installed" ]; then continue; fi
  case "$(stat -c %a "$key")" in
    600|400) ;;
    *) install -d -m 700 /run/dtrain-ssh && install -m 600 "$key" "/run/dtrain-ssh/${key##*/}" ;;
  esac
done

# sshd gives non-interactive sessions (mpirun's orted) the environment in SetEnv: the image's
# ENV plus anything `docker run -e` added. Values holding a double quote or a newline cannot be
# expressed there (a newline would end the line, and sshd refuse the file). A launch's --env
# values are not in this environment: mpirun forwards them by name (launch/node/run.sh).
conf=/etc/ssh/sshd_config.d/00-image-env.conf
line="SetEnv"
while IFS= read -r -d '' kv; do
  name=${kv%%=*}
  case "$name" in
    HOSTNAME|HOME|PWD|OLDPWD|SHLVL|_|TERM|SSH_*|BASH_FUNC_*) continue ;;
  esac
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
  if [[ "$kv" == *'"'* || "$kv" == *$'\n'* ]]; then
    echo "entrypoint: not forwarding $name to ssh sessions (value holds a double quote or a newline)" >&2
    continue
  fi
  line+=" \"$kv\""
done < <(env -0)
printf '%s\n' "$line" > "$conf"

[ -d /run/sshd ] || mkdir -p /run/sshd
# sshd-listen.pl accepts on sshd's port with Nagle off and runs sshd -i per connection: the
# image's sshd itself (sshd.real), its wrapper's work (host key, /run/sshd) being done above.
port=22 sshd=/usr/sbin/sshd
[ ! -x /usr/sbin/sshd.real ] || sshd=/usr/sbin/sshd.real
while read -r k v _; do [ "${k,,}" != port ] || { port=$v; break; }; done < /etc/ssh/sshd_config
listen=(perl "${0%/*}/sshd-listen.pl" "$port" "$sshd" -e)
if [ "$#" -eq 0 ]; then exec "${listen[@]}"; fi
# With a command (the first node's standby under an attached launch, SageMaker's `train`): the
# listener in the background, its readiness not waited for (whoever connects retries), and the
# command in front at once.
"${listen[@]}" &
exec "$@"
