"""Bounds (bench/NOTES.md v0.55): SOL-080 with one of its launches not made, against the call as it
is (wrong results, timing only): the most a faster form of that launch could give the call.
  piece-sum: small-T d_act's piece-sum + SwiGLU kernel (the dgrad and the weight gradients then
             read stale [d_gate | d_up]); default T 192, 211, 293, 384, 512, 997.
  router-wgrad: the router weight gradient where it is its own GEMM; default T 512 .. 3089.
4 interleaved rounds, L2 flushed, min of medians of 20.
Usage (device): PYTHONPATH=. python bench/attic/skip_bound.py piece-sum|router-wgrad [T,T,...]"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp  # noqa: E402

import cupy_moe  # noqa: E402
from benchmark import timer  # noqa: E402
from cupy_moe.gpu import graphs, router, sol080  # noqa: E402
from cupy_moe.testing import make_sol080_inputs  # noqa: E402


def skipping_piece_sum():
    finish = sol080._finish_d_act

    def finish_unless_split(inputs, ws, plan, cancel):
        if not (plan.act_splits > 1 and not plan.split_cluster):
            finish(inputs, ws, plan, cancel)
    return sol080, "_finish_d_act", finish_unless_split


def skipping_router_wgrad():
    return router, "weight_gradient", lambda *args, **kwargs: None


SKIPS = {"piece-sum": (skipping_piece_sum, [192, 211, 293, 384, 512, 997]),
         "router-wgrad": (skipping_router_wgrad, [512, 997, 1321, 1571, 1879, 2053, 3089])}


def main():
    what = sys.argv[1]
    make, Ts = SKIPS[what]
    if len(sys.argv) > 2:
        Ts = [int(t) for t in sys.argv[2].split(",")]
    module, name, skipped = make()
    kept = getattr(module, name)
    measure = timer(20)
    res = {}
    for r in range(4):
        for T in Ts:
            a = make_sol080_inputs(T, seed=T, xp=cp)
            for variant in (("base", what) if r % 2 == 0 else (what, "base")):
                setattr(module, name, skipped if variant == what else kept)
                graphs.clear()  # (the replayed graph holds the launches it was captured with)
                res.setdefault((T, variant), []).append(measure(lambda: cupy_moe.sol080_backward(**a)))
    setattr(module, name, kept)
    for T in Ts:
        base, without = min(res[(T, "base")]), min(res[(T, what)])
        print(f"T = {T}: base {base:.1f} us, without the {what} {without:.1f} ({without - base:+.1f})")


if __name__ == "__main__":
    main()
