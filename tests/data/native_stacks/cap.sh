#!/bin/bash
# cap.sh PORT slow|even: 2 DDP ranks of ddp_train.py; slow: rank 1 throttled (SIGSTOP 40 ms / SIGCONT 10 ms)
# and only rank 0 dumped; even: both dumped. 8 rounds of py-spy dump --native and py-spy dump.
PY=${PY:-python} SPY=${SPY:-py-spy} d=cap-$2
mkdir -p $d; rm -f $d/*
for r in 0 1; do OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 RANK=$r WORLD_SIZE=2 $PY ${ROOT:-.}/launch/node/examples/ddp_train.py --steps 100000 --width 512 > $d/out$r 2>&1 & echo $! > $d/pid$r; done
until grep -q "^step 20 " $d/out0; do sleep 0.5; done
p0=$(cat $d/pid0) p1=$(cat $d/pid1)
if [ "$2" = slow ]; then ( while kill -0 $p1 2>/dev/null; do kill -STOP $p1; sleep 0.04; kill -CONT $p1; sleep 0.01; done ) & thr=$!; sleep 2; fi
for i in $(seq 1 8); do
  $SPY dump --native --pid $p0 > $d/r0_native_$i.txt 2>&1; $SPY dump --pid $p0 > $d/r0_py_$i.txt 2>&1
  [ $2 = even ] && $SPY dump --native --pid $p1 > $d/r1_native_$i.txt 2>&1
  sleep 0.3
done
[ -n "${thr:-}" ] && kill $thr; kill -CONT $p1; kill $p0 $p1; wait 2>/dev/null
