"""How fast the layer's memory-bound kernels (the backward's combine and the dy scatter) run on a
few SMs beside a persistent GEMM on the rest: the numbers that decide whether overlapping them
with the weight gradients pays. For S SMs left free, a K-grouped wgrad ([1408 x 4096] per expert,
65536 rows, the layer's shape) runs on 132 - S CTAs on the main stream and the kernel on a side
stream; both are timed by events on their own streams. L2 flushed, median of 20.
Usage (device): PYTHONPATH=. python bench/overlap_probe.py [S ...]   (default 0 16 24 32 48)"""
import statistics
import sys

import numpy as np


def main(free_sms):
    import cupy as cp

    from cupy_moe import bfloat16
    from cupy_moe.gpu import elementwise
    from cupy_moe.gpu.gemm import Segment, device_sms, gemm

    T, H, I, E, K = 8192, 4096, 1408, 128, 8
    N = T * K
    rng = np.random.default_rng(0)
    rand = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
    idx = np.argsort(rng.random((T, E)), axis=1)[:, :K]
    order = np.argsort(idx.reshape(-1), kind="stable")
    slot_rows = np.empty(N, np.int32)
    slot_rows[order] = np.arange(N, dtype=np.int32)
    slot_rows = cp.asarray(slot_rows)
    offs = cp.asarray(np.concatenate([[0], np.cumsum(np.bincount(idx.reshape(-1), minlength=E))]).astype(np.int32))
    dg, x_sorted, dx_sorted, dy = rand(N, I), rand(N, H), rand(N, H), rand(T, H)
    dx_rest = cp.random.standard_normal((T, H), dtype=cp.float32)
    out = cp.empty((E, I, H), bfloat16)
    sms = device_sms()

    def wgrad(ctas):
        gemm(m=I, n=H, segments=[Segment(dg, I, x_sorted, H, k=N)], a_kmajor=False, b_kmajor=False,
             out=out, ldc=H, c_group_stride=I * H, grouping="k", group_offsets=offs, num_groups=E,
             max_ctas=ctas)

    kernels = {"combine_backward": lambda: elementwise.combine_backward(dx_sorted, slot_rows, dx_rest, K),
               "scatter dy": lambda: elementwise.rows_by_expert(dy, slot_rows, K)}
    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    main_s = cp.cuda.Stream(non_blocking=True)
    side = cp.cuda.Stream(non_blocking=True)
    ev = [cp.cuda.Event() for _ in range(4)]

    def run(ctas, kernel, reps=20):
        """(gemm us, kernel us) medians; ctas = 0: the kernel alone; kernel None: the GEMM alone."""
        g, k = [], []
        for rep in range(reps + 3):
            with main_s:
                flush.fill(1.0)
                ev[0].record()
            side.wait_event(ev[0])
            with main_s:
                if ctas:
                    wgrad(ctas)
                ev[1].record()
            with side:
                ev[2].record()
                if kernel:
                    kernel()
                ev[3].record()
            main_s.synchronize()
            side.synchronize()
            if rep >= 3:
                g.append(cp.cuda.get_elapsed_time(ev[0], ev[1]) * 1e3)
                k.append(cp.cuda.get_elapsed_time(ev[2], ev[3]) * 1e3)
        return statistics.median(g), statistics.median(k)

    print(f"{'kernel':<18} {'free SMs':>8} {'GEMM us':>9} {'GEMM alone':>10} {'kernel us':>9}")
    for name, kernel in kernels.items():
        print(f"{name:<18} {'all':>8} {'':>9} {'':>10} {run(0, kernel)[1]:9.1f}", flush=True)
        for s in free_sms:
            g, k = run(sms - s, kernel if s else None)
            alone = run(sms - s, None)[0]
            print(f"{name:<18} {s:8d} {g:9.1f} {alone:10.1f} {k if s else float('nan'):9.1f}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [0, 16, 24, 32, 48])
