"""The layer's routed dgrad (M-grouped [dg | du] @ [Wg; Wu], T = 8192, K = 8) alone, L2 flushed,
median of 10: random routing with each expert's own weights, the same with one weight for all
experts (B always in L2: what the weights' DRAM traffic costs), and balanced counts (512 rows an
expert: no partial row tiles: what the experts' last, partial tiles cost). Session 33: 2200.5 /
2195.9 / 2107.4 us (687 / 689 / 717 TFLOP/s): the weights' traffic ~0.2%, the 571 row tiles of
random routing against 512 ~4.4% (a tile of <= 64 rows runs at ~60% of a full one's time: B's
shared-memory traffic stays whole).
Usage (device): PYTHONPATH=. python bench/m_grouped_alone.py"""
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402

from cupy_moe import bfloat16  # noqa: E402
from cupy_moe.gpu.gemm import Segment, gemm  # noqa: E402


def main():
    T, K, E, H, I = 8192, 8, 128, 4096, 1408
    N = T * K
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((T, E)), axis=1)[:, :K]
    counts_random = np.bincount(picks.ravel(), minlength=E)
    counts_balanced = np.full(E, N // E)
    bf = lambda *s: cp.asarray(rng.standard_normal(s, dtype=np.float32).astype(bfloat16))
    dg, du = bf(N, I), bf(N, I)
    wg, wu = bf(E, I, H), bf(E, I, H)
    out = cp.empty((N, H), bfloat16)
    measure = timer(10)
    flop = 2.0 * N * H * 2 * I
    cases = (("random, own weights", counts_random, I * H), ("random, one weight", counts_random, 0),
             ("balanced, own weights", counts_balanced, I * H), ("balanced, one weight", counts_balanced, 0))
    for name, counts, stride in cases:
        offs = cp.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        tiles = int(np.sum((counts + 127) // 128))

        def run():
            gemm(m=N, n=H, segments=[Segment(dg, I, wg, H, k=I, b_group_stride=stride),
                                     Segment(du, I, wu, H, k=I, b_group_stride=stride)],
                 a_kmajor=True, b_kmajor=False, out=out, ldc=H, grouping="m", group_offsets=offs, num_groups=E)
        us = measure(run)
        print(f"{name:>24}: {us:8.1f} us  {flop / us / 1e6:6.1f} TFLOP/s  row tiles {tiles}")


if __name__ == "__main__":
    main()
