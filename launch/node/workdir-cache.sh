#!/usr/bin/env bash
# On a node, after the --workdir sync: the job's copy becomes the cache of the next launch
# (hard links: no data copied). Run by the launcher (launch/jobs/workdir.py refresh_cache_argv).
#
#   workdir-cache.sh JOB_DIR CACHE_DIR KEY
#
# JOB_DIR: the job's directory (its workdir/ in it); CACHE_DIR/KEY: this directory's cache.
set -e
cache="$2/$3"
rm -rf "$cache.new"
mkdir -p "$2"
cp -al "$1/workdir" "$cache.new"
rm -rf "$cache"
mv "$cache.new" "$cache"
