#!/usr/bin/env bash
# Hardware counters of the plain and the fused-SwiGLU M-grouped GEMM (65536 x 1408 x 4096, 128
# experts): where the fused epilogue's extra time goes. Needs a runtime where ncu reads counters
# (Firecracker, .library/device/KINDS.md). Log: ${OUT:-/tmp}/ncu.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
python3 bench/tile_study.py --ncu  # compile outside the profiler
timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --kernel-name gemm_sm90_kernel --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats \
  python3 bench/tile_study.py --ncu > "${OUT:-/tmp}/ncu.txt" 2>&1
echo "ncu exit $?" >> "${OUT:-/tmp}/ncu.txt"
