"""SOL-080's d_act = g Wd ([T, 4096] x [4096, 1408]) alone, in each layout and epilogue, so the
main loop's rate per operand layout shows apart from the call's DAG: the fused 128 x 128 form
(staged SwiGLU epilogue warps), plain 128 x 128 and 128 x 256 (bf16 stores), the transposed
product Wd^T g^T plain (bf16 stores of d_act^T), in the default and in row-fastest tile order. (Branch wip/interleaved-swiglu adds the
transposed product with the SwiGLU contract on its consumers: bench/NOTES.md v0.12.)
TFLOP/s at 2 T H I FLOPs, L2 flushed, median of --reps.
Usage (device): PYTHONPATH=. python bench/d_act_layouts.py [--T 2048,6144,8192] [--reps 20]"""
import argparse

import cupy as cp

from benchmark import timer
from cupy_moe import bfloat16
from cupy_moe.gpu import gemm as G
from cupy_moe.gpu.gemm import Segment, SwigluBackward, gemm


def rows_fastest(run):
    """run with the tiles in row-fastest order (Sm90Config.M_FASTEST: CTAs running together share
    g's column block and sweep the 11 row tiles of Wd^T, which stay in L2)."""
    def go():
        G.CONFIG_OVERRIDE = {"M_FASTEST": True}
        try:
            run()
        finally:
            G.CONFIG_OVERRIDE = {}
    return go


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="2048,6144,8192")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    measure = timer(args.reps)
    H, I = 4096, 1408
    rand = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
    print(f"{'T':>6} " + " ".join(f"{n:>14}" for n in ("fused128", "plain128", "plain256", "T-plain256",
                                                          "T-plain256-M")))
    for T in (int(t) for t in args.T.split(",")):
        g, wd, gate, up = rand(T, H), rand(H, I), rand(T, I), rand(T, I)
        out, outT = cp.empty((T, I), bfloat16), cp.empty((I, T), bfloat16)
        dg, du = cp.empty((T, I), bfloat16), cp.empty((T, I), bfloat16)
        seg, segT = [Segment(g, H, wd, I, k=H)], [Segment(wd, I, g, H, k=H)]
        sw = SwigluBackward(gate=gate, up=up, dg=dg, du=du, contract_rounding=True)
        runs = [
            lambda: gemm(m=T, n=I, segments=seg, a_kmajor=True, b_kmajor=False, out=None, ldc=I,
                         epilogue="swiglu_backward", swiglu=sw, engine="sm90"),
            lambda: gemm(m=T, n=I, segments=seg, a_kmajor=True, b_kmajor=False, out=out, ldc=I, engine="sm90"),
            lambda: gemm(m=T, n=I, segments=seg, a_kmajor=True, b_kmajor=False, out=out, ldc=I, engine="sm90",
                         wide=True),
            lambda: gemm(m=I, n=T, segments=segT, a_kmajor=False, b_kmajor=True, out=outT, ldc=T, engine="sm90",
                         wide=True),
            rows_fastest(lambda: gemm(m=I, n=T, segments=segT, a_kmajor=False, b_kmajor=True, out=outT, ldc=T,
                                      engine="sm90", wide=True)),
        ]
        flops = 2 * T * H * I
        print(f"{T:>6} " + " ".join(f"{flops / measure(r) / 1e6:>8.0f} TF/s" for r in runs), flush=True)


if __name__ == "__main__":
    main()
