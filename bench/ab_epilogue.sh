#!/usr/bin/env bash
# The fused SwiGLU backward on the epilogue warps (staged accumulators) vs on the consumers
# (cupy_moe.gpu.gemm.STAGED_EPILOGUE), after its correctness tests: the layer's kernels, the layer
# and SOL-080 tables. Logs under ${OUT:-/tmp}. Usage (device): bash bench/ab_epilogue.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
{ timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu_gemm.py -k swiglu 2>&1 | tail -4
  timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu_sol080.py tests/test_gpu_layer.py 2>&1 | tail -4
} > "$out/ab_tests.txt" 2>&1
cat "$out/ab_tests.txt"
for mode in 0 1; do  # kernel by kernel both ways; the tables (peers in the same run) staged only
  echo "== CUPY_MOE_STAGED_EPILOGUE=$mode"
  CUPY_MOE_STAGED_EPILOGUE=$mode timeout 100 python3 bench/profile_kernels.py layer 8192 2>&1 | grep -A40 "moe_backward"
  CUPY_MOE_STAGED_EPILOGUE=$mode timeout 60 python3 bench/profile_kernels.py sol080 8192 2>&1
done > "$out/ab_epilogue.txt" 2>&1
timeout 150 python3 bench/benchmark.py --reps 20 --layer --T 8192 --sol080 >> "$out/ab_epilogue.txt" 2>&1
cat "$out/ab_epilogue.txt"
