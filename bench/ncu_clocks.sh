#!/usr/bin/env bash
# The SM clock each kernel runs at (ncu's sm__cycles_elapsed per second, --clock-control none; ncu
# runs the kernels one at a time): the dgrad's 128 x 256 GEMM on 33 and on 132 CTAs, then every
# launch of an eager SOL-080 call at 1879 / 3072 / 8192 tokens. nvidia-smi's samples read 1980 MHz
# throughout such runs; these read 1.53-1.70 GHz for GEMMs on every SM (bench/NOTES.md v0.41).
# Usage (device, ~1 min): bash bench/ncu_clocks.sh; logs under ${OUT:-/tmp}
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=/tmp/cupy_moe_cache
out=${OUT:-/tmp}
sol="import sys, cupy as cp, cupy_moe
from cupy_moe.testing import make_sol080_inputs
for T in map(int, sys.argv[2].split(',')):
    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(T, seed=1).items()}
    for _ in range(int(sys.argv[1])):
        cupy_moe.sol080_backward(**a)
    cp.cuda.Device().synchronize()"
dg="import sys, cupy as cp
from cupy_moe import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm
a = cp.random.standard_normal((8192, 2944), dtype=cp.float32).astype(bfloat16)
w = cp.random.standard_normal((2944, 4096), dtype=cp.float32).astype(bfloat16)
o = cp.empty((8192, 4096), bfloat16)
for c in (33, 132, 33, 132):
    gemm(m=8192, n=4096, segments=[Segment(a, 2944, w, 4096, k=2944)], a_kmajor=True, b_kmajor=False, out=o, ldc=4096, max_ctas=c)
cp.cuda.Device().synchronize()"
m="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size"
python3 -c "$dg"
timeout 80 ncu --clock-control none --kernel-name gemm_sm90_kernel --launch-skip 2 --launch-count 2 --metrics $m python3 -c "$dg" > $out/ncu_clk_dg.txt 2>&1
echo "== the dgrad's shape, 8192 rows, on 33 then 132 CTAs"; grep -E "gpu__time|sm__cycles|launch__grid" $out/ncu_clk_dg.txt | sed 's/  */ /g'
for T in 1879 3072 8192; do
  CUPY_MOE_GRAPHS=0 python3 -c "$sol" 1 $T
  CUPY_MOE_GRAPHS=0 timeout 100 ncu --clock-control none --metrics $m python3 -c "$sol" 2 $T > $out/ncu_clk_$T.txt 2>&1
  echo "== SOL-080 T=$T, eager, the second call's launches"
  python3 - $out/ncu_clk_$T.txt <<'PY'
import re, sys
rows, cur = [], None
for line in open(sys.argv[1]):
    m = re.match(r"  (\S+) \((\d+), 1, 1\)x\((\d+)", line)
    if m:
        cur = {"name": m.group(1), "grid": m.group(2), "block": m.group(3)}
        rows.append(cur)
    elif cur is not None:
        for key in ("gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "sm__throughput.avg.pct_of_peak_sustained_elapsed"):
            if key in line:
                cur[key] = line.split()[-1]
for r in rows[len(rows) // 2:]:
    print(f"{r['name'][:28]:<28} grid {r['grid']:>5} x {r['block']:>4}: {r.get('gpu__time_duration.sum', '?'):>8} us "
          f"{r.get('sm__cycles_elapsed.avg.per_second', '?')} GHz, SM {r.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', '?')}%")
PY
done
