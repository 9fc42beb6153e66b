#!/usr/bin/env bash
# ncu throughputs and the SM clock of d_act's 128 x 128 GEMM (6144 rows) on 33 and on 132 CTAs
# (bench/cta_scan.py's question: why a k-step slows as more SMs run; bench/NOTES.md v0.41).
# Usage (device, ~15 s): bash bench/ncu_cta_clocks.sh; logs under ${OUT:-/tmp}
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=/tmp/cupy_moe_cache
out=${OUT:-/tmp}
py="import sys, cupy as cp
from cupy_moe import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm
x = cp.random.standard_normal((6144, 4096), dtype=cp.float32).astype(bfloat16)
wd = cp.random.standard_normal((4096, 1408), dtype=cp.float32).astype(bfloat16)
o = cp.empty((6144, 1408), bfloat16)
for _ in range(int(sys.argv[1])):
    gemm(m=6144, n=1408, segments=[Segment(x, 4096, wd, 1408, k=4096)], a_kmajor=True, b_kmajor=False, out=o, ldc=1408, max_ctas=int(sys.argv[2]))
cp.cuda.Device().synchronize()"
for c in 33 132; do
  python3 -c "$py" 1 $c
  timeout 100 ncu --clock-control none --kernel-name gemm_sm90_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_op_read.sum,lts__average_t_sector_hit_rate_realtime.pct,lts__t_throughput.avg.pct_of_peak_sustained_elapsed,lts__d_sectors.sum,lts__xbar2lts_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__lts2xbar_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__cycles_active.avg.pct_of_peak_sustained_elapsed \
    python3 -c "$py" 2 $c > $out/ncu_ctas_$c.txt 2>&1
  echo "== $c CTAs"
  grep -E "Duration|SM Frequency|Memory Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache|Compute \(SM\)|lts__|l1tex__m|Mem Busy|Max Bandwidth|L2 Hit|Mem Pipes" $out/ncu_ctas_$c.txt | sed 's/  */ /g' | head -30
done
