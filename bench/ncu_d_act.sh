#!/usr/bin/env bash
# Hardware counters of SOL-080's two n = 1408 GEMMs at T (default 8192): d_act (its first
# gemm_sm90_kernel launch) and grad_Wd (its second), with the SwiGLU backward fused into d_act's
# epilogue and without (CUPY_MOE_SOL080_FUSED_D_ACT=0), and the cuBLAS kernels PyTorch picks for
# the same dense shapes. Needs a runtime where ncu reads counters (Firecracker, KINDS.md).
# Usage (device): bash bench/ncu_d_act.sh [T]; log ${OUT:-/tmp}/ncu_d_act.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} CUPY_MOE_GRAPHS=0
T=${1:-8192}
log=${OUT:-/tmp}/ncu_d_act.txt
one_call="import cupy as cp, cupy_moe; from cupy_moe.testing import make_sol080_inputs as m
a = list(m($T, xp=cp, seed=1).values()); cupy_moe.sol080_backward(*a); cp.cuda.Device().synchronize()"
{
  for fused in 1 0; do
    CUPY_MOE_SOL080_FUSED_D_ACT=$fused python3 -c "$one_call"  # compile outside the profiler
    echo "== CUPY_MOE_SOL080_FUSED_D_ACT=$fused, T=$T: d_act, then grad_Wd"
    CUPY_MOE_SOL080_FUSED_D_ACT=$fused timeout ${NCU_TIMEOUT:-150} ncu --clock-control none \
      --kernel-name gemm_sm90_kernel --launch-count 2 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section LaunchStats python3 -c "$one_call" 2>&1 | grep -v "^==PROF==" \
      | grep -E "gemm_sm90|Duration|Throughput|Hit Rate|Warp Cycles|Stall|Issue|Eligible|Active Warps|Block Size|Grid Size|Registers|Shared Memory Config|Bandwidth|Busy|One or More|No Eligible|^    [A-Z]"
  done
  echo "== cuBLAS (torch.matmul) kernels for the dense shapes"
  python3 - <<'PY'
import torch
from torch.profiler import profile, ProfilerActivity
shapes = [(8192, 1408, 4096, "d_act AK BN"), (4096, 1408, 8192, "grad_Wd AM BN"),
          (8192, 4096, 2944, "dgrad AK BN"), (2816, 4096, 8192, "grad_WgWu AM BN")]
for m, n, k, what in shapes:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) if "AK" in what else \
        torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3): a @ b
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): a @ b
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type.name == "CUDA"]
    names = {e.name for e in ev}
    us = sum(e.device_time for e in ev) / 5
    print(f"{what} {m}x{n}x{k}: {us:.1f} us, {2*m*n*k/us/1e6:.0f} TFLOP/s; kernels: {sorted(names)}")
PY
} > "$log" 2>&1
cat "$log"
