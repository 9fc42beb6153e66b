#!/usr/bin/env bash
# Hardware counters of every launch of one SOL-080 call at T (default 192), each kernel alone
# (one stream, eager, caches flushed by ncu before each): where the small-T chain's time goes.
# Needs a runtime where ncu reads counters (Firecracker, KINDS.md).
# Usage (device): [NCU_KERNELS=regex] bash bench/ncu_sol080.sh [T]; log ${OUT:-/tmp}/ncu_sol080_T.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} CUPY_MOE_GRAPHS=0 \
  CUPY_MOE_SOL080_STREAMS=0
T=${1:-192}
log=${OUT:-/tmp}/ncu_sol080_$T.txt
one_call="import cupy as cp, cupy_moe; from cupy_moe.testing import make_sol080_inputs as m
a = list(m($T, xp=cp, seed=1).values()); cupy_moe.sol080_backward(*a); cp.cuda.Device().synchronize()"
python3 -c "$one_call"  # compile outside the profiler
timeout ${NCU_TIMEOUT:-200} ncu --clock-control none --kernel-name regex:"${NCU_KERNELS:-gemm_sm90|sol080|sum_}" \
  --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section LaunchStats --section SchedulerStats python3 -c "$one_call" 2>&1 \
  | grep -v "^==PROF==" | grep -vE "^ *-+ *-+|^ *$" > "$log"
cat "$log"
