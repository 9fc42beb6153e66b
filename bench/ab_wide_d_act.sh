#!/usr/bin/env bash
# Branch wip/wide-d-act on the device: the knob's GPU test, then SOL-080 at the two workloads it
# changes (T = 3072, 6144: the router kernel beside a plain 128 x 256 d_act instead of first),
# interleaved with the shipped plan, and each one's T = 6144 timeline.
# Usage (device): bash bench/ab_wide_d_act.sh; log ${OUT:-/tmp}/ab_wide_d_act.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
{
  echo "== GPU test"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_sol080.py \
    -k "wide" 2>&1 | tail -3
  echo "== SOL-080 at the changed workloads"
  timeout 90 python3 bench/ab_sol080_plans.py --T 3072,6144 --rounds 3 base wide=1 2>&1
  for w in 0 1; do
    echo "== timeline T = 6144, CUPY_MOE_SOL080_WIDE_D_ACT=$w"
    CUPY_MOE_SOL080_WIDE_D_ACT=$w timeout 60 python3 bench/profile_kernels.py sol080 6144 2>&1 | grep -v "^ *$"
  done
} > "${OUT:-/tmp}/ab_wide_d_act.txt" 2>&1
cat "${OUT:-/tmp}/ab_wide_d_act.txt"
