#!/usr/bin/env bash
# SOL-080's d_act with the SwiGLU backward fused into its epilogue vs a plain GEMM + the
# elementwise kernel (CUPY_MOE_SOL080_FUSED_D_ACT), alternating twice on the same GPU, then each
# one's kernel timeline at T = 8192. Log under ${OUT:-/tmp}. Usage (device): bash bench/ab_fused_d_act.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
for round in 1 2; do
  for fused in 1 0; do
    echo "== round $round, CUPY_MOE_SOL080_FUSED_D_ACT=$fused"
    CUPY_MOE_SOL080_FUSED_D_ACT=$fused timeout 120 python3 bench/benchmark.py --sol080 --reps 20 2>&1 | tail -18
  done
done > "$out/ab_fused_d_act.txt" 2>&1
for fused in 1 0; do
  echo "== timeline, CUPY_MOE_SOL080_FUSED_D_ACT=$fused"
  CUPY_MOE_SOL080_FUSED_D_ACT=$fused timeout 60 python3 bench/profile_kernels.py sol080 8192 2>&1 | grep -v "^ *$"
done >> "$out/ab_fused_d_act.txt" 2>&1
cat "$out/ab_fused_d_act.txt"
