# GENERATED FILE, DO NOT EDIT.
# Generated from images/pytorch-ddp.yaml (variant 2) and templates/ by `invoke render`.
# Image: dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12
# Build: invoke build --image pytorch-ddp --tag 2.13.0-cpu-py311-debian12
#   by hand, from the repository root (the context must hold launch/node/ and .wheelhouse/):
#   DOCKER_BUILDKIT=1 docker build -f dockerfiles/pytorch-ddp/2.13.0-cpu-py311-debian12/Dockerfile \
#     --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt .
# Secrets (CA bundle, pip config) are BuildKit secrets: mounted for one RUN, never in a layer.
ARG BASE_IMAGE=debian:bookworm-slim
ARG BUILDER_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------- builder
# Compilers, headers and build trees stay in this stage; the runtime copies /opt/venv only.
FROM ${BUILDER_IMAGE} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# dtrain-secrets, sourced by RUN steps that download: points pip, curl and apt at the BuildKit
# secrets when given (a TLS-intercepting proxy's CA, a private index). It holds no secret.
RUN printf '%s\n' \
      'if [ -s /run/secrets/ca ]; then' \
      '  export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca REQUESTS_CA_BUNDLE=/run/secrets/ca' \
      '  echo "Acquire::https::CAInfo \"/run/secrets/ca\";" > /tmp/dtrain-apt.conf && export APT_CONFIG=/tmp/dtrain-apt.conf' \
      'fi' \
      'if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi' \
      > /usr/local/bin/dtrain-secrets
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev g++ make cmake libopenmpi-dev openmpi-bin \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# PyTorch 2.13.0, CPU wheel. Wheels in .wheelhouse/
# (invoke build --wheelhouse DIR) are searched first: offline and air-gapped builds.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN --mount=type=secret,id=ca --mount=type=secret,id=pipconf --mount=type=bind,source=.wheelhouse,target=/wheelhouse . /usr/local/bin/dtrain-secrets \
 && pip install --no-cache-dir setuptools==69.5.1 wheel==0.43.0 \
 && if [ -n "$TORCH_INDEX_URL" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL"; fi \
 && pip install --no-cache-dir --find-links /wheelhouse torch==2.13.0 numpy==2.2.6

# ---------------------------------------------------------------- runtime
FROM ${BASE_IMAGE} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# Identical in every CPU family, so the three images share these layers. openssh-server's
# install makes host keys: removed in the same step, or they would stay in this layer.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 openmpi-bin openssh-server openssh-client iproute2 procps \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*
# sshd on 2022 (the host keeps 22). StrictModes off and known_hosts in /dev/null because the
# Kubeflow MPI operator mounts .ssh read-only with root-owned 0644 files. Host keys are made
# when a container starts (the entrypoint, or the sshd wrapper when sshd is started directly),
# never at build time; no user key is in the image.
RUN printf '%s\n' \
      'Port 2022' \
      'PermitRootLogin prohibit-password' \
      'PasswordAuthentication no' \
      'KbdInteractiveAuthentication no' \
      'PubkeyAuthentication yes' \
      'StrictModes no' \
      'UsePAM no' \
      'PrintMotd no' \
      'AcceptEnv LANG LC_*' \
      'Subsystem sftp /usr/lib/openssh/sftp-server' \
      'Include /etc/ssh/sshd_config.d/*.conf' \
      > /etc/ssh/sshd_config \
 && printf '%s\n' \
      'Host *' \
      '    Port 2022' \
      '    StrictHostKeyChecking no' \
      '    UserKnownHostsFile /dev/null' \
      '    LogLevel ERROR' \
      '    IdentityFile /run/dtrain-ssh/id_ed25519' \
      '    IdentityFile /run/dtrain-ssh/id_ecdsa' \
      '    IdentityFile /run/dtrain-ssh/id_rsa' \
      '    IdentityFile ~/.ssh/id_ed25519' \
      '    IdentityFile ~/.ssh/id_ecdsa' \
      '    IdentityFile ~/.ssh/id_rsa' \
      > /etc/ssh/ssh_config \
 && dpkg-divert --quiet --local --rename --divert /usr/sbin/sshd.real --add /usr/sbin/sshd \
 && printf '%s\n' \
      '#!/bin/sh' \
      '# dtrain: sshd started directly (as an MPI operator may: /usr/sbin/sshd -De) still gets' \
      '# host keys of its own, made here; none ship in the image.' \
      'ssh-keygen -A -q >/dev/null 2>&1' \
      'mkdir -p /run/sshd' \
      "exec /usr/sbin/sshd.real \"\$@\"" \
      > /usr/sbin/sshd \
 && chmod 755 /usr/sbin/sshd \
 && mkdir -p /run/sshd /root/.ssh /etc/ssh/sshd_config.d \
 && chmod 700 /root/.ssh \
 && rm -f /etc/ssh/ssh_host_*
# The environment of every process in the image, ssh sessions included.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openmpi/lib \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    GOTO_NUM_THREADS=1 \
    NCCL_SOCKET_IFNAME=^docker0,lo \
    NCCL_DEBUG=WARN
# Non-interactive ssh sessions (how mpirun starts orted) get the same variables, so orted and
# python are found on every node. Runtime additions (docker run -e) are added by the entrypoint.
RUN printf 'SetEnv' > /etc/ssh/sshd_config.d/00-image-env.conf \
 && printf ' %s' 'PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openmpi/lib' 'LANG=C.UTF-8' 'PYTHONUNBUFFERED=1' 'OMPI_ALLOW_RUN_AS_ROOT=1' 'OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1' 'OMPI_MCA_btl_vader_single_copy_mechanism=none' 'OMP_NUM_THREADS=1' 'OPENBLAS_NUM_THREADS=1' 'GOTO_NUM_THREADS=1' 'NCCL_SOCKET_IFNAME=^docker0,lo' 'NCCL_DEBUG=WARN' >> /etc/ssh/sshd_config.d/00-image-env.conf \
 && echo >> /etc/ssh/sshd_config.d/00-image-env.conf
COPY --from=builder /opt/venv /opt/venv
# Smoke test at build time: a broken image fails here, not on the cluster.
RUN ssh-keygen -A -q && /usr/sbin/sshd -t && rm -f /etc/ssh/ssh_host_* \
 && mpirun --version \
 && torchrun --help > /dev/null \
 && python -c "import torch, torch.distributed as dist; assert dist.is_available() and dist.is_gloo_available(); print('torch', torch.__version__)"

# Node-side scripts last: editing launch/node/ rebuilds only the layers below.
COPY launch/node/ /opt/dtrain/node/
EXPOSE 2022
ENTRYPOINT ["/opt/dtrain/node/entrypoint.sh"]
ARG DTRAIN_REVISION=unknown
ARG DTRAIN_CREATED=unknown
LABEL org.opencontainers.image.title="dtrain/pytorch-ddp" \
      org.opencontainers.image.description="PyTorch (torchrun/DDP) 2.13.0, CPU, Python 3.11, debian12" \
      org.opencontainers.image.version="2.13.0-cpu-py311-debian12" \
      org.opencontainers.image.vendor="dtrain" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dtrain.family="pytorch-ddp" \
      dtrain.kind="cpu" \
      dtrain.os="debian12" \
      dtrain.ssh-port="2022" \
      dtrain.openmpi-major="4" \
      dtrain.version.python="3.11" \
      dtrain.version.pytorch="2.13.0" \
      org.opencontainers.image.revision="${DTRAIN_REVISION}" \
      org.opencontainers.image.created="${DTRAIN_CREATED}"
