"""Tile shapes and epilogues of the layer's n = 1408 GEMMs, side by side in one process: where the
fused SwiGLU dgrad (65536 x 1408 x 4096, M-grouped over 128 experts) and the dWd weight gradient
(K-grouped [4096 x 1408] per expert) lose time against a plain GEMM of the same shape.
Configs are forced through cupy_moe.gpu.gemm.CONFIG_OVERRIDE (benchmarks only).
Usage: PYTHONPATH=. python bench/tile_study.py [--reps 10]"""
import argparse

import cupy as cp
import numpy as np

from benchmark import timer
from cupy_moe import bfloat16
from cupy_moe.gpu import gemm as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ncu", action="store_true",
                    help="run the plain and the fused M-grouped GEMM once each, untimed (under ncu)")
    args = ap.parse_args()
    measure = timer(args.reps)
    rng = np.random.default_rng(0)
    E, rows, H, I = 128, 65536, 4096, 1408
    rand = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
    offs = cp.asarray(np.concatenate([[0], np.cumsum(rng.multinomial(rows, np.ones(E) / E))]).astype(np.int32))
    dy, wd = rand(rows, H), rand(E, H, I)
    gate, up, act, aw_in = rand(rows, I), rand(rows, I), rand(rows, I), rand(rows, I)
    weights = cp.random.random(rows, dtype=cp.float32)
    out = cp.empty((rows, I), bfloat16)
    dg, du, aw = (cp.empty((rows, I), bfloat16) for _ in range(3))
    dw = cp.empty(rows, cp.float32)
    grouped = dict(grouping="m", group_offsets=offs, num_groups=E)
    seg = [G.Segment(dy, H, wd, I, k=H, b_group_stride=H * I)]

    def plain(dense=False):
        kw = {} if dense else grouped
        return lambda: G.gemm(m=rows, n=I, segments=seg if not dense else [G.Segment(dy, H, wd, I, k=H)],
                              a_kmajor=True, b_kmajor=False, out=out, ldc=I, **kw)

    def fused():
        sw = G.SwigluBackward(gate=gate, up=up, dg=dg, du=du, act=act, weights=weights, aw=aw, dw=dw)
        return lambda: G.gemm(m=rows, n=I, segments=seg, a_kmajor=True, b_kmajor=False, out=None,
                              ldc=I, epilogue="swiglu_backward", swiglu=sw, **grouped)

    wgrad_out = cp.empty((E, H, I), bfloat16)

    def dwd():
        return lambda: G.gemm(m=H, n=I, segments=[G.Segment(dy, H, aw_in, I, k=rows)], a_kmajor=False,
                              b_kmajor=False, out=wgrad_out, ldc=I, c_group_stride=H * I,
                              grouping="k", group_offsets=offs, num_groups=E)

    flops = 2 * rows * H * I
    cases = [
        ("dense 65536x1408x4096 plain (auto)", plain(True), {}, True),
        ("M-grouped plain (auto: BN 128, 5 stages)", plain(), {}, True),
        ("M-grouped plain, 4 stages", plain(), dict(STAGES=4), True),
        ("M-grouped plain, BN 256, 3 stages", plain(), dict(BN=256, STAGES=3), True),
        ("M-grouped fused SwiGLU, staged on epilogue warps (auto)", fused(), {}, True),
        ("M-grouped fused SwiGLU, on the consumers, BN 128", fused(), {}, False),
        ("M-grouped fused SwiGLU, on the consumers, BN 256, 4 st", fused(), dict(BN=256, STAGES=4), False),
        ("K-grouped dWd (auto: cooperative 256, 3 st)", dwd(), {}, True),
        ("K-grouped dWd, cooperative BN 128, 6 st", dwd(), dict(PINGPONG=False, BN=128, STAGES=6), True),
        ("K-grouped dWd, cooperative BN 256, 3 st", dwd(), dict(PINGPONG=False, BN=256, STAGES=3), True),
        ("K-grouped dWd, coop BN 256, 4 st, direct stores", dwd(),
         dict(PINGPONG=False, BN=256, STAGES=4, C_TMA=False), True),
    ]
    if args.ncu:
        plain()()
        fused()()
        cp.cuda.Device().synchronize()
        return
    print(f"{'case':<52} {'us':>8} {'TFLOP/s':>8}")
    for name, fn, override, staged in cases:
        G.CONFIG_OVERRIDE.clear()
        G.CONFIG_OVERRIDE.update(override)
        G.STAGED_EPILOGUE = staged
        try:
            t = measure(fn, warmup=2)
            print(f"{name:<52} {t:8.1f} {flops / t / 1e6:8.1f}", flush=True)
        except Exception as exc:
            print(f"{name:<52} failed: {type(exc).__name__}: {exc}", flush=True)
    G.CONFIG_OVERRIDE.clear()


if __name__ == "__main__":
    main()
