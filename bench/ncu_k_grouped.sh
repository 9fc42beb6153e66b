#!/usr/bin/env bash
# Where the K-grouped weight gradient's warps stall, per SASS instruction: the layer's [1408 x
# 4096] x 128 experts wgrad (random routing, 65536 rows), one launch under ncu with stall sampling,
# then the instructions with the most samples and their reasons. Its tensor pipes idle a third
# of the time with neither L2 nor DRAM saturated, and without its epilogue it is no faster
# (bench/NOTES.md v0.16): this says which instruction the time sits on.
# Usage (device, ~1 min): bash bench/ncu_k_grouped.sh [k|m|f|d] (m: the routed dgrad, M-grouped, instead;
# f: the layer's fused SwiGLU dgrad, its staged epilogue warps beside the consumers; d: a dense
# 8192 x 4096 x 4096 reference); NCU_VIEW=sol prints throughputs (tensor pipes, clock, L1 / L2 /
# DRAM) instead of the stall table;
# logs under ${OUT:-/tmp}
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
out=${OUT:-/tmp}
one_launch="import sys, numpy as np, cupy as cp
from cupy_moe import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm
rng = np.random.default_rng(0)
m, n, E, rows = 1408, 4096, 128, 65536
offs = cp.asarray(np.concatenate([[0], np.cumsum(rng.multinomial(rows, np.full(E, 1 / E)))]).astype(np.int32))
A, B = (cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16) for s in ((rows, m), (rows, n)))
C = cp.empty((E, m, n), bfloat16)
for _ in range(int(sys.argv[1])):
    if sys.argv[2] == 'd':  # a dense reference in the same 128 x 256 tiles: 8192 x 4096 x 4096
        if _ == 0:
            X, W, Y = (cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16) for s in ((8192, n), (n, n), (8192, n)))
        gemm(m=8192, n=n, segments=[Segment(X, n, W, n, k=n)], a_kmajor=True, b_kmajor=True, out=Y, ldc=n)
    elif sys.argv[2] == 'k':
        gemm(m=m, n=n, segments=[Segment(A, m, B, n, k=rows)], a_kmajor=False, b_kmajor=False, out=C,
             ldc=n, c_group_stride=m * n, grouping='k', group_offsets=offs, num_groups=E)
    elif sys.argv[2] == 'f':  # the layer's fused SwiGLU dgrad: da' = dy Wd per expert, M-grouped 128 x 128
        if _ == 0:
            from cupy_moe.gpu.gemm import SwigluBackward
            T, K = rows // 8, 8
            Wd = cp.random.standard_normal((E, n, m), dtype=cp.float32).astype(bfloat16)
            gate, up, act = (cp.random.standard_normal((rows, m), dtype=cp.float32).astype(bfloat16) for _ in range(3))
            dg, du, aw = (cp.empty((rows, m), bfloat16) for _ in range(3))
            sw = SwigluBackward(gate=gate, up=up, dg=dg, du=du, act=act,
                                weights=cp.random.random((T, K), dtype=cp.float32),
                                row_index=cp.random.permutation(rows).astype(cp.int32), aw=aw,
                                dw=cp.empty(rows, cp.float32))
        gemm(m=rows, n=m, segments=[Segment(B, n, Wd, m, k=n, b_group_stride=n * m)], a_kmajor=True,
             b_kmajor=False, out=None, ldc=m, epilogue='swiglu_backward', swiglu=sw, grouping='m',
             group_offsets=offs, num_groups=E)
    else:  # the routed dgrad [dg | du] @ [Wg; Wu] per expert, M-grouped 128 x 256
        if _ == 0:
            W = cp.random.standard_normal((E, m, n), dtype=cp.float32).astype(bfloat16)
            X = cp.empty((rows, n), bfloat16)
        gemm(m=rows, n=n, segments=[Segment(A, m, W, n, k=m, b_group_stride=m * n)] * 2, a_kmajor=True,
             b_kmajor=False, out=X, ldc=n, grouping='m', group_offsets=offs, num_groups=E)
cp.cuda.Device().synchronize()"
case=${1:-k}  # k: the K-grouped wgrad; m: the M-grouped routed dgrad; f: the fused SwiGLU dgrad; d: dense
python3 -c "$one_launch" 1 $case  # compile outside the profiler
if [ "${NCU_VIEW:-stalls}" = sol ]; then  # throughputs only: the tensor pipes' share, clock, L1 / L2 / DRAM
  timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --kernel-name gemm_sm90_kernel --launch-skip 1 \
    --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis python3 -c "$one_launch" 2 $case \
    > "$out/ncu_sol_$case.txt" 2>&1
  grep -E "SM Frequency|Duration|Throughput|highest-utilized" "$out/ncu_sol_$case.txt" | sed 's/based on elapsed.*//'
  exit
fi
rm -f "$out/k_grouped.ncu-rep"
timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --kernel-name gemm_sm90_kernel --launch-skip 1 \
  --launch-count 1 --section WarpStateStats --section SourceCounters --section SchedulerStats \
  -o "$out/k_grouped" python3 -c "$one_launch" 2 $case > "$out/ncu_k_grouped.txt" 2>&1
ncu -i "$out/k_grouped.ncu-rep" --section WarpStateStats --section SchedulerStats --section SourceCounters \
  2>&1 | grep -vE "^ *$|----" | tail -n 60
ncu -i "$out/k_grouped.ncu-rep" --page source --csv --print-source sass > "$out/k_grouped_sass.csv" 2>&1
python3 - "$out/k_grouped_sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Source" in r)
cols, body = rows[head], rows[head + 1:]
src = cols.index("Source")
samples = [i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")]
reasons = [i for i, c in enumerate(cols) if c.startswith("stall_") or "Stall" in c and "Sampling" not in c]
key = samples[0] if samples else None
if key is None:
    print("no stall-sampling column; columns:", cols)
    sys.exit()
num = lambda v: float(v.replace(",", "") or 0)
total = sum(num(r[key]) for r in body if len(r) > key)
print(f"{total:.0f} samples; the 30 instructions with the most:")
for r in sorted((r for r in body if len(r) > key), key=lambda r: -num(r[key]))[:30]:
    top = sorted(((num(r[i]), cols[i]) for i in reasons if i < len(r) and num(r[i]) > 0), reverse=True)[:3]
    print(f"{100 * num(r[key]) / total:5.1f}%  {r[src][:70]:<70} " + ", ".join(f"{c} {v:.0f}" for v, c in top))
PY
