#!/usr/bin/env bash
# The router weight gradient inside the grad_[Wg; Wu] GEMM (sol080.FUSED_WGRAD) on the device, in
# one call (~7 min): the GPU tests it touches (three shards in parallel), then SOL-080's 16
# workloads with it on (base) and off (fwgrad=0) interleaved, then the tree in _old/ (an earlier
# commit: `git archive <rev> | tar -x -C _old`, carried) on the same machine for reference, then a
# timeline of T = 8192.
# Usage (device): bash bench/ab_fused_wgrad.sh; log ${OUT:-/tmp}/ab_fused_wgrad.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
{
  echo "== GPU tests"
  timeout 280 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_gemm.py \
    > "$out/t_gemm.txt" 2>&1 &
  timeout 280 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_layer.py \
    > "$out/t_layer.txt" 2>&1 &
  timeout 280 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_sol080.py \
    tests/test_gpu_router.py tests/test_determinism.py > "$out/t_sol.txt" 2>&1
  wait
  tail -n 4 "$out/t_gemm.txt" "$out/t_layer.txt" "$out/t_sol.txt"
  echo "== SOL-080: router wgrad fused (base) / its own GEMM (fwgrad=0)"
  timeout 200 python3 bench/ab_sol080_plans.py base fwgrad=0 2>&1
  if [ -d _old ]; then
    echo "== SOL-080 at the reference tree _old/"
    (cd _old && PYTHONPATH=. timeout 150 python3 bench/ab_sol080_plans.py base 2>&1)
  fi
  echo "== timeline T = 8192"
  timeout 60 python3 bench/profile_kernels.py sol080 8192 2>&1 | grep -v "^ *$" | tail -24
} > "$out/ab_fused_wgrad.txt" 2>&1
cat "$out/ab_fused_wgrad.txt"
