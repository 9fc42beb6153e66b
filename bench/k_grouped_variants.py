"""The K-grouped weight gradient's store path and consumer mode: the layer's [1408 x 4096]
per-expert wgrad (65536 rows, random routing and 512 each) as shipped (cooperative 128 x 256, bf16
through shared memory and TMA stores), with register stores (C_TMA off, 3 or 4 stages) and on
ping-pong 128 x 128 consumers, and in the static tile order or with claims (gemm.CONFIG_OVERRIDE
and gemm()'s dynamic / pingpong; times only, the suite checks the bits). Session 16 (random
routing): base 1285, static order 1286, claims 1357, register stores 1930, 4 stages 1924,
ping-pong 1482 us. The epilogue is not the lever: without it the GEMM is no faster
(bench/NOTES.md v0.16). "2 stages" and "cooperative 128, 5 st." (not yet run) ask whether
the loads in flight bound it: 96 KB and 160 KB a CTA against the shipped 144 KB (session 17:
1589-1708 and 1455-1619 us: no).
Usage (device): PYTHONPATH=. python bench/k_grouped_variants.py [variant label ...]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp
    from cupy_moe import bfloat16
    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import Segment, gemm

    measure = timer(20)
    rng = np.random.default_rng(0)
    m, n, E, rows = 1408, 4096, 128, 65536
    cases = [("random", rng.multinomial(rows, np.full(E, 1 / E))), ("512 each", np.full(E, rows // E))]
    A = cp.random.standard_normal((rows, m), dtype=cp.float32).astype(bfloat16)
    B = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(bfloat16)
    C = cp.empty((E, m, n), bfloat16)
    # (label, CONFIG_OVERRIDE, gemm() keywords)
    variants = (("base", {}, {}), ("static order", {}, dict(dynamic=False)),
                ("claims", {}, dict(dynamic=True)), ("C_TMA off", dict(C_TMA=False), {}),
                ("C_TMA off, 4 stages", dict(C_TMA=False, STAGES=4), {}),
                ("pingpong 128", {}, dict(pingpong=True)),
                # The stage count's pull (is the wgrad bound by loads in flight? NOTES v0.16):
                ("2 stages", dict(STAGES=2), {}),
                ("cooperative 128, 5 st.", dict(BN=128, STAGES=5), dict(pingpong=False)),
                ("stores at tile end", dict(DEFER_STORE=0), {}))  # (Sm90Config.DEFER_STORE off)
    only = sys.argv[1:]
    variants = [v for v in variants if not only or v[0] in only]
    if only:  # in the order asked (A/B rounds: name a variant more than once)
        variants = [next(v for v in variants if v[0] == label) for label in only]
    for label, over, kw in variants:
        G.CONFIG_OVERRIDE = over
        for name, sizes in cases:
            offs = cp.asarray(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
            run = lambda: gemm(m=m, n=n, segments=[Segment(A, m, B, n, k=rows)], a_kmajor=False,
                               b_kmajor=False, out=C, ldc=n, c_group_stride=m * n, grouping="k",
                               group_offsets=offs, num_groups=E, **kw)
            try:
                us = measure(run)
            except Exception as exc:
                print(f"{label:<22} {name:<10} failed: {str(exc)[:120]}", flush=True)
                continue
            print(f"{label:<22} {name:<10} {us:8.1f} us {2 * rows * m * n / us / 1e6:7.1f} TFLOP/s", flush=True)
    G.CONFIG_OVERRIDE = {}


if __name__ == "__main__":
    main()
