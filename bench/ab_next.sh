#!/usr/bin/env bash
# Branch wip/next (session 8's two unrun branches merged) on the device, in one call (~4-5 min):
# the GPU tests they touch, then SOL-080's 16 workloads with the shipped plan, with the split-K
# pieces summed through global memory instead of a cluster per tile (cluster=0), and with the
# wide d_act at T = 3072 / 6144 (wide=1), interleaved; then timelines. Every step under a
# timeout: a cluster barrier that never completes would hang its kernel.
# Usage (device): bash bench/ab_next.sh; log ${OUT:-/tmp}/ab_next.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
{
  echo "== GPU tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_gemm.py \
    -k "split" 2>&1 | tail -3 &
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_sol080.py \
    tests/test_determinism.py 2>&1 | tail -3
  wait
  echo "== SOL-080: base / cluster=0 / wide=1"
  timeout 150 python3 bench/ab_sol080_plans.py base cluster=0 wide=1 2>&1
  for v in "CUPY_MOE_SPLIT_CLUSTER=1 T=192" "CUPY_MOE_SPLIT_CLUSTER=0 T=192" \
           "CUPY_MOE_SOL080_WIDE_D_ACT=0 T=6144" "CUPY_MOE_SOL080_WIDE_D_ACT=1 T=6144"; do
    echo "== timeline $v"
    env ${v% *} timeout 60 python3 bench/profile_kernels.py sol080 ${v#*T=} 2>&1 | grep -v "^ *$"
  done
} > "${OUT:-/tmp}/ab_next.txt" 2>&1
cat "${OUT:-/tmp}/ab_next.txt"
