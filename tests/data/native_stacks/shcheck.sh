#!/bin/bash
# shcheck.sh PORT: 2 DDP ranks (DTRAIN_RESTART=7), rank 1 throttled; launch/node/stacks.sh sample x4
PY=${PY:-python} d=shc; mkdir -p $d; rm -f $d/*
export PATH=$PATH
for r in 0 1; do DTRAIN_RESTART=7 OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 RANK=$r WORLD_SIZE=2 $PY ${ROOT:-.}/launch/node/examples/ddp_train.py --steps 100000 --width 512 > $d/out$r 2>&1 & echo $! > $d/pid$r; done
until grep -q "^step 20 " $d/out0; do sleep 0.5; done
p1=$(cat $d/pid1)
( while kill -0 $p1 2>/dev/null; do kill -STOP $p1; sleep 0.04; kill -CONT $p1; sleep 0.01; done ) & thr=$!
sleep 2
for i in 1 2 3 4; do /usr/bin/time -f "round %e s" bash ${ROOT:-.}/launch/node/stacks.sh DTRAIN_RESTART 7 node-1 sample > $d/round$i.txt; done
kill $thr; kill -CONT $p1; kill $(cat $d/pid0) $p1; wait 2>/dev/null
