#!/bin/bash
# cost.sh PORT N: 2 DDP ranks (ddp_train.py --width 512, OMP_NUM_THREADS=1) on 127.0.0.1; N dumps of rank 0
# in each mode, one after another; ms per dump (wall) and rank 0's step_ms median while each mode ran.
PY=${PY:-python} SPY=${SPY:-py-spy} d=cost
mkdir -p $d; rm -f $d/*
for r in 0 1; do OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 RANK=$r WORLD_SIZE=2 $PY ${ROOT:-.}/launch/node/examples/ddp_train.py --steps 100000 --width 512 > $d/out$r 2>&1 & echo $! > $d/pid$r; done
until grep -q "^step 20 " $d/out0; do sleep 0.5; done
p0=$(cat $d/pid0)
$SPY dump --native --nonblocking --pid $p0 > $d/nb_native.txt 2>&1; echo "native+nonblocking rc=$?: $(head -c 200 $d/nb_native.txt | tr '\n' ' ')"
for mode in "none" "--nonblocking" "" "--native"; do
  a=$(wc -l < $d/out0); t0=$(date +%s%N)
  for i in $(seq 1 $2); do
    if [ "$mode" = none ]; then sleep 0.2; else $SPY dump $mode --pid $p0 > /dev/null 2>&1; sleep 0.2; fi
  done
  t1=$(date +%s%N); b=$(wc -l < $d/out0)
  med=$(sed -n "$((a+1)),${b}p" $d/out0 | sed -n 's/.*step_ms //p' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)] ", max " v[NR]}')
  echo "mode [${mode:-blocking}]: $(( (t1 - t0) / 1000000 / $2 - 200 )) ms per dump, rank 0 step_ms median $med over $((b-a)) steps"
done
kill $(cat $d/pid0) $(cat $d/pid1); wait 2>/dev/null
