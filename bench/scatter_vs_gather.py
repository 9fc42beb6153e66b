"""Token rows into the experts' sorted order, the layer's shape (T = 8192, K = 8, H = 4096, random
routing): gather_rows (reads each token row K times) against rows_by_expert (a scatter: reads it
once, writes it K times). us, L2 flushed, median of 20; GB/s of the bytes each must move.
Usage (device): PYTHONPATH=. python bench/scatter_vs_gather.py [--T 8192]"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp

    from cupy_moe import bfloat16
    from cupy_moe.gpu.elementwise import gather_rows, rows_by_expert

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    args = ap.parse_args()
    T, K, H, E = args.T, 8, 4096, 128
    rng = np.random.default_rng(0)
    experts = np.stack([rng.choice(E, K, replace=False) for _ in range(T)])  # [T, K]
    sorted_slots = np.argsort(experts.reshape(-1), kind="stable").astype(np.int32)
    slot_rows = np.empty_like(sorted_slots)
    slot_rows[sorted_slots] = np.arange(T * K, dtype=np.int32)
    x = cp.random.standard_normal((T, H), dtype=cp.float32).astype(bfloat16)
    ss, sr = cp.asarray(sorted_slots), cp.asarray(slot_rows)
    assert (gather_rows(x, ss, K).view(cp.uint16) == rows_by_expert(x, sr, K).view(cp.uint16)).all()
    measure = timer(20)
    written = T * K * H * 2
    for name, fn in (("gather_rows", lambda: gather_rows(x, ss, K)),
                     ("rows_by_expert (scatter)", lambda: rows_by_expert(x, sr, K))):
        us = measure(fn)
        print(f"{name:<26} {us:8.1f} us   {2 * written / us / 1e3:6.0f} GB/s if every row is read "
              f"from DRAM, {(written + T * H * 2) / us / 1e3:6.0f} if each token row once")


if __name__ == "__main__":
    main()
