#!/usr/bin/env bash
# Each launch of one SOL-080 call alone (ncu runs them one at a time, caches flushed before each),
# eager with the library's own plan and streams: its time, clock, DRAM bytes and L2 misses, per T.
# What an instrumented trace (bench/sm_timeline.py) can hide: at T = 449 against 512 the traces read
# alike while the timed graphs differed by 8 us; this named grad_Wd (17.6 / 13.6 us) and
# grad_[Wg; Wu] (27.1 / 22.4) at once (bench/NOTES.md v0.45).
# Usage (device): bash bench/ncu_kernel_times.sh [T ...]   (default 449 512); log ${OUT:-/tmp}/ncu_kernel_times.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_GRAPHS=0
log=${OUT:-/tmp}/ncu_kernel_times.txt
: > "$log"
for T in ${@:-449 512}; do
  one="import cupy as cp, cupy_moe; from cupy_moe.testing import make_sol080_inputs as m
a = list(m($T, xp=cp, seed=$T).values()); cupy_moe.sol080_backward(*a); cp.cuda.Device().synchronize()"
  python3 -c "$one"  # compile outside the profiler
  echo "== T=$T" >> "$log"
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --kernel-name regex:"gemm_sm90|sol080|sum_" \
    --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes.sum,lts__t_sectors_srcunit_tex_lookup_miss.sum \
    python3 -c "$one" 2>&1 | grep -v "^==PROF==" | grep -E "\(|duration|per_second|dram__bytes|lookup_miss" >> "$log"
done
cat "$log"
