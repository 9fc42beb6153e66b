#!/usr/bin/env bash
# Dynamic tile claims (gemm.DYNAMIC_TILES) on the device, in one call (~8 min): the GPU tests of
# the GEMM engine, the layer, SOL-080 and determinism (three shards in parallel), then SOL-080's 16
# workloads with claims on and off interleaved (the outputs must be the same bits), then the GEMM
# and layer tables with claims on and off.
# Usage (device): bash bench/ab_dynamic.sh; log ${OUT:-/tmp}/ab_dynamic.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
{
  echo "== GPU tests"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_gemm.py \
    > "$out/t_gemm.txt" 2>&1 &
  timeout 280 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_layer.py \
    > "$out/t_layer.txt" 2>&1 &
  timeout 280 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_sol080.py \
    tests/test_gpu_router.py tests/test_determinism.py > "$out/t_sol.txt" 2>&1
  wait
  tail -n 4 "$out/t_gemm.txt" "$out/t_layer.txt" "$out/t_sol.txt"
  echo "== SOL-080: claims on (base) / off (dyn=0)"
  timeout 200 python3 bench/ab_sol080_plans.py dyn=all dyn=none 2>&1
  for d in grouped none; do
    echo "== GEMM and layer tables, CUPY_MOE_DYNAMIC_TILES=$d"
    CUPY_MOE_DYNAMIC_TILES=$d timeout 150 python3 bench/benchmark.py --reps 20 --gemm --layer --T 8192 2>&1 | tail -28
  done
} > "$out/ab_dynamic.txt" 2>&1
cat "$out/ab_dynamic.txt"
