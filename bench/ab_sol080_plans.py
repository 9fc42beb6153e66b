"""A/B of SOL-080 plan knobs in one process: every variant on every workload, interleaved per
workload (two rounds; the variants' order rotated per round and workload), L2 flushed, median of
--reps; each variant's outputs must equal the first variant's bit for bit (the knobs move
launches between streams and SMs, never the arithmetic).

A variant is a comma list of knob=value: even=wd+wgu+dgrad (sol080.EVEN_ROUNDS),
claims=auto|none|wd+wgu+dgrad (sol080.CLAIMS: the same bits), wgrad=auto|side|side-early|early
(sol080.WGRAD_AT), pdl=0|1 (_launch.PDL), stack=0|1 (router.STACKED),
cluster=0|1 (gemm.SPLIT_CLUSTER: every in-GEMM cluster sum), scluster=0|1 (sol080.SPLIT_CLUSTER:
d_act's and the dgrad's), rcluster=0|1 (router.SUM_IN_GEMM: the router wgrad's), wide=0|1 (sol080.WIDE_D_ACT), wmid=0|1 (sol080.WIDE_MID_T), dyn=grouped|all|none
(gemm.DYNAMIC_TILES: the same bits), fwgrad=auto|0|1 (sol080.FUSED_WGRAD), wdpp=auto|0|1
(sol080.WD_PINGPONG), wgupp=auto|0|1 (sol080.WGU_PINGPONG), wdt=auto|0|1
(sol080.WD_TRANSPOSED), sto=auto|cap|wgu-main|"" (sol080.SMALL_T_ORDER; sto= for none), wdf=auto|0|1 (sol080.WD_FIRST),
dgs=auto|k|1 (sol080.DGRAD_SPLITS), dgw=auto|0|1 (sol080.DGRAD_WIDE), rmb=N (sol080.ROUTER_MIN_BLOCKS: the same bits), rsms=N (sol080._ROUTER_SMS: the fewest free SMs the router runs beside d_act on), sws=auto|N (sol080.SWIGLU_SMS), swst=N (the SwiGLU kernel's stages),
ring=N (gemm.STORE_RING: the same bits), paired=0|1 (gemm.PAIRED_HALVES), chunks=0|1 (sol080.CHUNK_GRIDS: the same bits), rq=auto|0 (sol080.ROUTER_QUEUED), wdhalf=0|1 (sol080.SMALL_T_WD_HALF), wfull=0|1 (sol080.WIDE_FULL_ROUND), athird=0|1 (sol080.ACT_SPLIT_THIRD), tail=0|1 (gemm.TAIL_BOXES: the same bits), ktail=0|1 (gemm.K_TAIL_BOXES: the same bits), band=N (gemm.BAND_ROWS: the same bits), dgband=N (sol080.DGRAD_BAND: the dgrad's own bands, 0 gemm's; the same bits), nband=N (gemm.BAND_NARROW_ROWS), gband=N (gemm.BAND_GROUPED_ROWS), cfg.FIELD=N (that Sm90Config field on every Hopper GEMM,
through gemm.CONFIG_OVERRIDE; e.g. cfg.PACKED_CONTRACT=0, the same bits);
a knob a variant does not name keeps the library's value at start-up (bench/knobs.py), so "base"
is the library's own plan, e.g.
`python bench/ab_sol080_plans.py base even=wgu wgrad=side-early pdl=0`.
Usage (device): PYTHONPATH=. python bench/ab_sol080_plans.py [--reps 20] [--T 192,8192] VARIANT...
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.gpu import sol080
    from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--T", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args()
    Ts = [int(t) for t in args.T.split(",")] if args.T else [t for t, _ in SOL080_WORKLOADS]
    measure = timer(args.reps)

    from cupy_moe import _launch
    from cupy_moe.gpu import gemm, router

    from knobs import Knob, Knobs, flag, integer, text

    use = Knobs({
        "even": Knob(sol080, "EVEN_ROUNDS", lambda v, _d: frozenset(filter(None, v.split("+")))),
        "claims": Knob(sol080, "CLAIMS", lambda v, _d: v.replace("+", ",")),
        "band": Knob(gemm, "BAND_ROWS", integer),
        "dgband": Knob(sol080, "DGRAD_BAND", integer),
        "nband": Knob(gemm, "BAND_NARROW_ROWS", integer),
        "gband": Knob(gemm, "BAND_GROUPED_ROWS", integer),
        "wgrad": Knob(sol080, "WGRAD_AT", text),
        "pdl": Knob(_launch, "PDL", flag),
        "stack": Knob(router, "STACKED", flag),
        "cluster": Knob(gemm, "SPLIT_CLUSTER", flag),
        "wide": Knob(sol080, "WIDE_D_ACT", flag),
        "wmid": Knob(sol080, "WIDE_MID_T", flag),
        "scluster": Knob(sol080, "SPLIT_CLUSTER", flag),
        "rcluster": Knob(router, "SUM_IN_GEMM", flag),
        "dyn": Knob(gemm, "DYNAMIC_TILES", text),
        "fwgrad": Knob(sol080, "FUSED_WGRAD", text),
        "wdpp": Knob(sol080, "WD_PINGPONG", text),
        "wgupp": Knob(sol080, "WGU_PINGPONG", text),
        "wdt": Knob(sol080, "WD_TRANSPOSED", text),
        "sto": Knob(sol080, "SMALL_T_ORDER", text),
        "wdf": Knob(sol080, "WD_FIRST", text),
        "dgs": Knob(sol080, "DGRAD_SPLITS", text),
        "dgw": Knob(sol080, "DGRAD_WIDE", text),
        "sws": Knob(sol080, "SWIGLU_SMS", text),
        "rmb": Knob(sol080, "ROUTER_MIN_BLOCKS", integer),
        "rsms": Knob(sol080, "_ROUTER_SMS", integer),
        "swst": Knob(sol080, "_SWIGLU_STAGES", integer),
        "ring": Knob(gemm, "STORE_RING", integer),
        "ppring": Knob(gemm, "PINGPONG_STORE_RING", integer),
        "wdhalf": Knob(sol080, "SMALL_T_WD_HALF", flag),
        "paired": Knob(gemm, "PAIRED_HALVES", flag),
        "chunks": Knob(sol080, "CHUNK_GRIDS", flag),
        "wfull": Knob(sol080, "WIDE_FULL_ROUND", flag),
        "athird": Knob(sol080, "ACT_SPLIT_THIRD", flag),
        "tail": Knob(gemm, "TAIL_BOXES", flag),
        "ktail": Knob(gemm, "K_TAIL_BOXES", flag),
        "rq": Knob(sol080, "ROUTER_QUEUED", text),
    }).use

    def arith():  # the knobs that change the order of an fp32 sum or the SwiGLU kernel
        return (router.STACKED, sol080.WIDE_D_ACT, gemm.SPLIT_CLUSTER, sol080.SPLIT_CLUSTER,
                router.SUM_IN_GEMM, sol080.FUSED_WGRAD, sol080.WD_PINGPONG, sol080.WGU_PINGPONG, sol080.WD_TRANSPOSED,
                sol080.WD_FIRST, sol080.DGRAD_SPLITS, sol080.SMALL_T_ORDER, sol080.SWIGLU_SMS, sol080._ROUTER_SMS,
                gemm.PAIRED_HALVES, sol080.ROUTER_QUEUED, sol080.WIDE_FULL_ROUND, sol080.ACT_SPLIT_THIRD)  # (grad_Wd first or the router queued: the router wgrad fused)

    table = {v: [] for v in args.variants}
    print(f"{'T':>6} " + " ".join(f"{v:>16}" for v in args.variants))
    for Ti, T in enumerate(Ts):
        a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
        first = None
        best = {v: [] for v in args.variants}
        for v in args.variants:
            use(v)
            outs = [o.copy() for o in cupy_moe.sol080_backward(*a)]
            if first is None:
                first, arithmetic0 = outs, arith()
            same = [bool(cp.array_equal(o.view(cp.uint8), f.view(cp.uint8))) for o, f in zip(outs, first)]
            if arith() != arithmetic0:
                # another order of the router wgrad's sum, another SwiGLU kernel: rounding only
                same = [sa or float(cp.linalg.norm(o.astype(cp.float32) - f.astype(cp.float32))
                                    / cp.linalg.norm(f.astype(cp.float32))) < 1e-2
                        for sa, o, f in zip(same, outs, first)]
            if not all(same):
                print(f"T={T} variant {v!r}: outputs differ from {args.variants[0]!r}")
                sys.exit(1)
        n = len(args.variants)
        for r in range(args.rounds):
            # Each variant leads in turn: under the power cap the first of a round gains ~3% (NOTES v0.20).
            for v in args.variants[(r + Ti) % n:] + args.variants[:(r + Ti) % n]:
                use(v)
                best[v].append(measure(lambda: cupy_moe.sol080_backward(*a)))
        for v in args.variants:
            table[v].append(min(best[v]))
        print(f"{T:>6} " + " ".join(f"{table[v][-1]:16.1f}" for v in args.variants), flush=True)
    print(f"{'mean':>6} " + " ".join(f"{np.mean(table[v]):16.1f}" for v in args.variants))


if __name__ == "__main__":
    main()
