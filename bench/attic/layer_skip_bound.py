"""Bounds for the layer's backward (bench/NOTES.md v0.55): moe_backward at T = 8192 with one of its
memory-bound or small launches not made (wrong results, timing only), the GEMM it ran beside then
on every SM (layer.BESIDE off), against the call as it is: what a free form of it could give.
  combine: dx's combine of the routed rows (beside dWg); scatter: dy into the experts' order (beside
  the shared d_act); router-wgrad: the router weight gradient; beside-off: nothing skipped, BESIDE
  off (the GEMMs and the row moves one after the other).
After ~2 s of calls (so every variant meets the power cap's steady state: a cool first round read
~9% fast), 5 interleaved rounds, L2 flushed, the median of each round's median of 10.
Usage (device): PYTHONPATH=. python bench/attic/layer_skip_bound.py [T]"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp  # noqa: E402

import cupy_moe  # noqa: E402
from benchmark import timer  # noqa: E402
from cupy_moe.gpu import elementwise, layer, router  # noqa: E402
from cupy_moe.testing import make_moe_inputs, make_grad_output  # noqa: E402


def nothing(*args, **kwargs):
    return kwargs.get("out")


def main():
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    cfg = cupy_moe.MoEConfig.glm45_air()
    _, ctx = cupy_moe.moe_forward(**make_moe_inputs(cfg, T, seed=0, xp=cp), config=cfg)
    dy = make_grad_output(cfg, T, seed=1, xp=cp)
    kept = dict(combine=elementwise.combine_backward, scatter=elementwise.rows_by_expert,
                wgrad=router.weight_gradient)
    variants = {
        "base": {},
        "beside-off": {"beside": False},
        "combine": {"beside": False, "combine": nothing},
        "scatter": {"beside": False, "scatter": lambda src, slot_rows, K, out=None: (
            out if out is not None else kept["scatter"](src, slot_rows, K))},  # (x's rows still made)
        "router-wgrad": {"wgrad": nothing},
    }
    measure = timer(10)
    for _ in range(200):  # to the power cap's steady state before the first timed round
        cupy_moe.moe_backward(dy, ctx)
    cp.cuda.Device().synchronize()
    res = {}
    for r in range(5):
        names = list(variants)[r:] + list(variants)[:r]
        for name in names:
            v = variants[name]
            layer.BESIDE = v.get("beside", True)
            elementwise.combine_backward = v.get("combine", kept["combine"])
            elementwise.rows_by_expert = v.get("scatter", kept["scatter"])
            router.weight_gradient = v.get("wgrad", kept["wgrad"])
            res.setdefault(name, []).append(measure(lambda: cupy_moe.moe_backward(dy, ctx), warmup=2) / 1e3)
    layer.BESIDE = True
    elementwise.combine_backward, elementwise.rows_by_expert, router.weight_gradient = (
        kept["combine"], kept["scatter"], kept["wgrad"])
    med = lambda v: sorted(v)[len(v) // 2]
    base = med(res["base"])
    for name in variants:
        t = med(res[name])
        print(f"{name:<14} {t:7.3f} ms ({t - base:+.3f}, {100 * (t - base) / base:+.1f}%)  rounds "
              + " ".join(f"{x:.3f}" for x in res[name]))


if __name__ == "__main__":
    main()
