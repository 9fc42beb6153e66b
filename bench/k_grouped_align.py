"""Why the layer's K-grouped weight gradients run at ~0.78 us per 128 x 256 x 64 k-step (the
per-tile trace, bench/sm_timeline.py --layer --tiles; dense 128 x 256 tiles reach ~0.59): the
same GEMM ([1408 x 4096] per expert, 128 experts, 65536 rows) with every expert's rows a multiple
of 64 (no partial k-tile to mask) against the random routing's sizes, and with 256 / 1024 rows
per expert (longer reductions per tile). TFLOP/s, L2 flushed, median of 20.
Usage (device): PYTHONPATH=. python bench/k_grouped_align.py"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp

    from cupy_moe import bfloat16
    from cupy_moe.gpu.gemm import Segment, gemm

    measure = timer(20)
    rng = np.random.default_rng(0)
    m, n, E = 1408, 4096, 128
    cases = []
    for rows in (32768, 65536, 131072):
        per = rows // E
        cases.append((f"{rows} rows, {per} each (64-aligned)", np.full(E, per)))
        sizes = rng.multinomial(rows, np.full(E, 1 / E))
        cases.append((f"{rows} rows, random routing", sizes))
        cases.append((f"{rows} rows, random sizes rounded to 64", np.maximum(64, (sizes + 32) // 64 * 64)))
    for name, sizes in cases:
        offs = cp.asarray(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
        rows = int(sizes.sum())
        A = cp.random.standard_normal((rows, m), dtype=cp.float32).astype(bfloat16)
        B = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(bfloat16)
        C = cp.empty((E, m, n), bfloat16)
        run = lambda: gemm(m=m, n=n, segments=[Segment(A, m, B, n, k=rows)], a_kmajor=False,
                           b_kmajor=False, out=C, ldc=n, c_group_stride=m * n, grouping="k",
                           group_offsets=offs, num_groups=E)
        us = measure(run)
        print(f"{name:<44} {us:8.1f} us {2 * rows * m * n / us / 1e6:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
