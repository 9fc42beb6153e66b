#!/usr/bin/env bash
# What claims (gemm(dynamic=True)) cost a dense GEMM: SOL-080's grad_Wd shape at T = 8192 (C [4096 x
# 1408] = g^T act, K = 8192, both operands MN-major) and d_act's (C [8192 x 1408] = g Wd, K = 4096,
# bf16 out), each with static tiles and with claims, under ncu: duration, L2 hit rate, DRAM bytes
# and SM throughput. It tests bench/persistent_plan.md's hypothesis: claiming CTAs drift apart and
# re-read shared operands from DRAM (a lower hit rate and more DRAM bytes with claims), rather than
# spending the time on instructions (the same bytes, a longer duration).
# Usage (device, ~1 min): bash bench/ncu_claims.sh; logs under ${OUT:-/tmp}
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
one_launch="import sys, cupy as cp
from cupy_moe import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm
T, H, I = 8192, 4096, 1408
g, act = (cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16) for s in ((T, H), (T, I)))
wd = cp.random.standard_normal((H, I), dtype=cp.float32).astype(bfloat16)
shape, dynamic = sys.argv[2], sys.argv[3] == 'claims'
for _ in range(int(sys.argv[1])):
    if shape == 'wd':  # grad_Wd = g^T act
        out = cp.empty((H, I), bfloat16)
        gemm(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False, out=out,
             ldc=I, dynamic=dynamic)
    else:  # d_act = g Wd, stored
        out = cp.empty((T, I), bfloat16)
        gemm(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False, out=out,
             ldc=I, dynamic=dynamic)
cp.cuda.Device().synchronize()"
metrics=gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
for shape in wd act; do
  for mode in static claims; do
    python3 -c "$one_launch" 1 $shape $mode  # compile outside the profiler
    timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --kernel-name gemm_sm90_kernel --launch-skip 1 \
      --launch-count 1 --metrics $metrics python3 -c "$one_launch" 2 $shape $mode > "$out/ncu_claims_${shape}_$mode.txt" 2>&1
    echo "== $shape $mode"
    grep -E "gpu__time_duration|lts__t_sector_hit_rate|dram__bytes_read|srcunit_tex|sm__throughput" "$out/ncu_claims_${shape}_$mode.txt"
  done
done
