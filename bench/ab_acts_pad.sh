#!/usr/bin/env bash
# One call (~5 min): the grouped and new GEMM tests, then SOL-080's 16 workloads for the workspace
# row padding (sol080.ACTS_PAD) and the fused router wgrad, interleaved, then the tree in _old/.
# Usage (device): bash bench/ab_acts_pad.sh; log ${OUT:-/tmp}/ab_acts_pad.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
{
  echo "== GPU tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_gemm.py \
    -k "m_grouped or k_grouped or dynamic or f32_head or more_tiles" > "$out/t_gemm.txt" 2>&1 &
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_sol080.py \
    > "$out/t_sol.txt" 2>&1
  wait
  tail -n 3 "$out/t_gemm.txt" "$out/t_sol.txt"
  echo "== SOL-080: pad 64 fused (base) / pad 0 / pad 64 own wgrad / pad 0 own wgrad"
  timeout 240 python3 bench/ab_sol080_plans.py --rounds 1 base pad=0 fwgrad=0 pad=0,fwgrad=0 2>&1
  if [ -d _old ]; then
    echo "== SOL-080 at the reference tree _old/"
    (cd _old && PYTHONPATH=. timeout 100 python3 bench/ab_sol080_plans.py --rounds 1 base 2>&1)
  fi
} > "$out/ab_acts_pad.txt" 2>&1
cat "$out/ab_acts_pad.txt"
