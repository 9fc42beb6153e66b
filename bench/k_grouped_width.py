"""Would dWg and dWu gain as one K-grouped GEMM? The layer runs them as two [1408 x 4096]-per-expert
weight gradients over the same rows of x; written as [dg | du]^T x they are one [2816 x 4096] GEMM
with twice the tiles per expert (each x row block shared by 22 row tiles instead of 11). This
times both forms (65536 rows over 128 experts, random routing and 512 each; rounds rotated; L2
flushed, median of 20) as TFLOP/s, the pair as the sum of its two launches.
Usage (device): PYTHONPATH=. python bench/k_grouped_width.py [--rounds 3]"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp

    from cupy_moe import bfloat16
    from cupy_moe.gpu.gemm import Segment, gemm

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    measure = timer(20)
    rng = np.random.default_rng(0)
    I, H, E, rows = 1408, 4096, 128, 65536
    x = cp.random.standard_normal((rows, H), dtype=cp.float32).astype(bfloat16)
    dgu = cp.random.standard_normal((rows, 2 * I), dtype=cp.float32).astype(bfloat16)
    dg, du = dgu[:, :I], dgu[:, I:]  # row stride 2 I: the layout one GEMM would read
    pair_out = [cp.empty((E, I, H), bfloat16) for _ in range(2)]
    one_out = cp.empty((E, 2 * I, H), bfloat16)

    def k_grouped(a, m, out, offs):
        gemm(m=m, n=H, segments=[Segment(a, 2 * I, x, H, k=rows)], a_kmajor=False, b_kmajor=False,
             out=out, ldc=H, c_group_stride=m * H, grouping="k", group_offsets=offs, num_groups=E)

    flop = 2 * rows * 2 * I * H
    for name, sizes in (("random", rng.multinomial(rows, np.full(E, 1 / E))), ("512 each", np.full(E, rows // E))):
        offs = cp.asarray(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
        forms = {"two [1408 x 4096] (shipped)": lambda: [k_grouped(a, I, o, offs) for a, o in zip((dg, du), pair_out)],
                 "one [2816 x 4096]": lambda: k_grouped(dgu, 2 * I, one_out, offs)}
        forms["two [1408 x 4096] (shipped)"]()
        forms["one [2816 x 4096]"]()
        same = all(bool((one_out[:, h * I:(h + 1) * I].view(cp.uint16) == o.view(cp.uint16)).all())
                   for h, o in enumerate(pair_out))
        print(f"{name}: one GEMM's results bitwise the pair's: {same}")
        labels = list(forms)
        for r in range(args.rounds):
            for label in np.roll(labels, -r):
                us = measure(forms[label])
                print(f"{name:<9} round {r}  {label:<28} {us:8.1f} us {flop / us / 1e6:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
