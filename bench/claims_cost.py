"""What claimed tiles (gemm(dynamic=True)) cost one GEMM against the static order, at SOL-080's and
the layer's shapes, and the static order with neighbouring CTAs on unrelated tiles
(Sm90Config.STATIC_SHUFFLE), which tells the claim's own cost apart from where the tiles land.
(v0.31: claims and the shuffle cost the same 4-16% at the 128 x 128 shapes and nothing at the
128 x 256 ones; the CTAs of a GPC, which take consecutive blockIdx, share operands in the static
order: ncu read the same DRAM bytes and 12-14% more L2 requests. A claim made ahead of the
tile's last loads timed as the one after them.) The modes run interleaved over --rounds, L2
flushed, median of --reps (us), each bit for bit against the static one.
Usage (device): PYTHONPATH=. python bench/claims_cost.py [--reps 20] [--rounds 2] [--shapes wd8192,act8192,...]"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402

H, I, E = 4096, 1408, 128


def problems(cp, names):
    """name -> (gemm() keywords, output array): grad_Wd = g^T act (wdT), d_act with the fused SwiGLU
    contract (actT), the dgrad-like dense product (dgT: [T, 2I + E] x [2I + E, H]), grad_[Wg; Wu]
    (wguT: [T, 2I]^T x [T, H]) and the layer's M-grouped routed dgrad (mgrouped: 128 experts,
    65536 balanced rows, N = 4096, K = 2816)."""
    from cupy_moe import bfloat16
    from cupy_moe.gpu.gemm import Segment, SwigluBackward

    rng = cp.random.default_rng(31)
    bf = lambda *s: (rng.standard_normal(s, dtype=cp.float32) * 0.5).astype(bfloat16)
    made = {}
    for name in names:
        kind, T = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):] or 0)
        if kind in ("wd", "wdpp"):  # (wdpp: on ping-pong consumers, as SOL-080 runs it up to T = 4096)
            g, act, out = bf(T, H), bf(T, I), cp.empty((H, I), bfloat16)
            kw = dict(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False,
                      out=out, ldc=I, pingpong=kind == "wdpp")
        elif kind == "act":
            g, wd, gate, up = bf(T, H), bf(H, I), bf(T, I), bf(T, I)
            out = cp.empty((T, 2 * I), bfloat16)
            kw = dict(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False,
                      out=None, ldc=I, epilogue="swiglu_backward", engine="sm90",
                      swiglu=SwigluBackward(gate=gate, up=up, dg=out, du=out.data.ptr + 2 * I,
                                            ld_grad=2 * I, contract_rounding=True))
        elif kind == "dg":
            K = 2 * I + E
            a, w, out = bf(T, K), bf(K, H), cp.empty((T, H), bfloat16)
            kw = dict(m=T, n=H, segments=[Segment(a, K, w, H, k=K)], a_kmajor=True, b_kmajor=False,
                      out=out, ldc=H)
        elif kind == "wgu":
            a, x, out = bf(T, 2 * I), bf(T, H), cp.empty((2 * I, H), bfloat16)
            kw = dict(m=2 * I, n=H, segments=[Segment(a, 2 * I, x, H, k=T)], a_kmajor=False,
                      b_kmajor=False, out=out, ldc=H)
        elif kind == "mgrouped":
            G, rows, K, N = 128, 65536, 2 * I, H
            offs = cp.asarray(np.arange(G + 1, dtype=np.int32) * (rows // G))
            a, w, out = bf(rows, K), bf(G, K, N), cp.empty((rows, N), bfloat16)
            kw = dict(m=rows, n=N, segments=[Segment(a, K, w, N, k=K, b_group_stride=K * N)],
                      a_kmajor=True, b_kmajor=False, out=out, ldc=N, grouping="m", group_offsets=offs,
                      num_groups=G)
        else:
            raise SystemExit(f"unknown shape {name}")
        made[name] = (kw, out)
    return made


def main():
    import cupy as cp

    from cupy_moe.gpu import gemm as G

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shapes", default="wd8192,act8192,dg8192,wgu8192,wd2053,act2053,mgrouped")
    args = ap.parse_args()
    measure = timer(args.reps)
    modes = [("static", {}), ("shuffled", {"STATIC_SHUFFLE": True}), ("claims", None)]
    made = problems(cp, args.shapes.split(","))
    times = {(s, m): [] for s in made for m, _ in modes}
    for r in range(args.rounds):
        for name, (kw, out) in made.items():
            first = None
            order = modes if r % 2 == 0 else modes[::-1]
            for mode, override in order:
                G.CONFIG_OVERRIDE = override or {}
                run = lambda: G.gemm(dynamic=override is None, **kw)
                out.fill(np.nan)
                run()
                bits = out.view(cp.uint16).copy()
                if first is None:
                    first = bits
                elif not bool((bits == first).all()):
                    raise SystemExit(f"{name} {mode}: not the bits of {order[0][0]}")
                times[name, mode].append(measure(run))
    G.CONFIG_OVERRIDE = {}
    print(f"{'shape':>10} " + " ".join(f"{m:>9}" for m, _ in modes) + "   (us, median of rounds' medians)")
    for name in made:
        row = [float(np.median(times[name, m])) for m, _ in modes]
        print(f"{name:>10} " + " ".join(f"{v:9.1f}" for v in row) + "   "
              + " ".join(f"{m} {100 * (v / row[0] - 1):+.1f}%" for (m, _), v in zip(modes[1:], row[1:])))


if __name__ == "__main__":
    main()
