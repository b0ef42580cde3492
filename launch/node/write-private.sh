#!/usr/bin/env bash
# On a node: write stdin to PATH, readable by its owner only (umask 077): each node's NIC
# settings, node.env in the job's key directory (launch/jobs/job.py _write_node_env).
#
#   write-private.sh PATH
umask 077
cat > "$1"
