"""SCRATCH (bench/NOTES.md v0.48): the small-T dgrad [d_up | d_gate | hi] @ [Wu; Wg; Wr] alone: ungrouped 128-row tiles
against an M-grouped form of 64-row groups sharing B (b_group_stride 0): one warpgroup a tile,
half of A a k-step, more CTAs."""
import sys
sys.path.insert(0, "bench")
import numpy as np
import cupy as cp
from cupy_moe._arrays import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm, launch_tiles
from cupy_moe.gpu import sol080
from benchmark import timer

H, I, E = 4096, 1408, 128
measure = timer(30)
rng = np.random.default_rng(0)
wu, wg = (cp.asarray((0.02 * rng.standard_normal((I, H))).astype(bfloat16)) for _ in range(2))
wr = cp.asarray((0.02 * rng.standard_normal((E, H))).astype(bfloat16))
acts = sol080._Acts(I, E)
for T in [int(t) for t in sys.argv[1].split(",")]:
    ws = cp.asarray(rng.standard_normal((T, acts.ld)).astype(bfloat16))
    segs = acts.dgrad_segments(ws, acts.at(ws, acts.hi), acts.ld, wu, wg, wr, H)
    outs = {}
    res = []
    for rows in (0, 64, 96):
        out = cp.full((T, H), np.nan, bfloat16)
        kw = dict(m=T, n=H, segments=segs, a_kmajor=True, b_kmajor=False, out=out, ldc=H)
        if rows:
            offs = list(range(0, T, rows)) + [T]
            kw.update(grouping="m", group_offsets=cp.asarray(offs, cp.int32), num_groups=len(offs) - 1)
        tiles = launch_tiles(**kw)
        gemm(**kw)
        cp.cuda.Device().synchronize()
        outs[rows] = out
        t = min(measure(lambda: gemm(**kw)) for _ in range(3))
        res.append(f"rows={rows or 128}: {tiles} tiles {t:6.1f} us")
    same = [bool(cp.array_equal(outs[r].view(cp.uint16), outs[0].view(cp.uint16))) for r in (64, 96)]
    print(T, " | ".join(res), "bitwise", same, "nan", bool(cp.isnan(outs[64].astype(cp.float32)).any()), flush=True)
