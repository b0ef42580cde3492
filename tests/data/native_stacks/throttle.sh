#!/bin/bash
# (cgroup v1: mkdir /sys/fs/cgroup/cpu/jtest; echo 10000 > /sys/fs/cgroup/cpu/jtest/cpu.cfs_quota_us first)
# once rank 1 of the DDP pair printed step 30: into a cgroup with cpu.max 10 ms per 100 ms (0.1 CPU, as docker update --cpus 0.1)
until grep -q "^step 30 rank 1/2" run/output.log 2>/dev/null; do sleep 0.2; done
for p in /proc/[0-9]*; do grep -qz "^OMPI_COMM_WORLD_RANK=1$" $p/environ 2>/dev/null && grep -qa ddp_train $p/cmdline && echo ${p#/proc/} > /sys/fs/cgroup/cpu/jtest/cgroup.procs && echo "throttled ${p#/proc/} at $(date +%s)"; done
