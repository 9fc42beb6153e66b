#!/usr/bin/env bash
# Ping-pong vs cooperative consumer warpgroups (cupy_moe.gpu.gemm.PINGPONG) on the GEMM table and
# the layer's kernels; logs under ${OUT:-/tmp}. Usage (device): bash bench/ab_pingpong.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
for mode in 0 1 auto; do
  [ "$mode" = auto ] && m= || m=$mode
  echo "== CUPY_MOE_PINGPONG=$mode"
  CUPY_MOE_PINGPONG=$m python3 bench/benchmark.py --gemm --reps 20 2>&1 | tail -14
  CUPY_MOE_PINGPONG=$m python3 bench/profile_kernels.py layer 8192 2>&1 | grep -A16 "moe_backward"
done > "$out/ab_pingpong.txt" 2>&1
cat "$out/ab_pingpong.txt"
