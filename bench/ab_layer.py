"""A/B of the layer backward's knobs in one process: each variant interleaved over --rounds, L2
flushed, median of --reps (ms), the variants' order rotated each round; each variant's gradients
against the first's (relative error).
A variant is a comma list of knob=value: dwdt=0|1 (gpu.layer.DWD_TRANSPOSED), sbs=0|1 (the
shared expert's weight gradients side by side: gpu.side_by_side.MIN_GAIN_STEPS), ring=N
(gpu.gemm.STORE_RING), kwide=0 (the K-grouped weight gradients on ping-pong 128 x 128 tiles where
gemm.wide_tiles_pay would take cooperative 128 x 256 ones), band=N (gpu.gemm.BAND_ROWS), nband=N (gpu.gemm.BAND_NARROW_ROWS), gband=N (gpu.gemm.BAND_GROUPED_ROWS), wband=N / wbytes=N (gpu.gemm.WIDE_B_BAND / WIDE_B_BYTES: M-grouped GEMMs with an expert's B over wbytes in bands of wband row tiles), kgrate=X (gpu.side_by_side.K_GROUPED_FLOP_PER_SM_US: the combine's SMs
beside dWg through free_sms), bsm=X / fsm=X (gpu.side_by_side.BYTES_PER_SM_US / FLOP_PER_SM_US: the
SMs of the dy scatter beside the shared d_act, and of the combine), f32tma=0|1 (gpu.gemm.F32_TMA), dyn=grouped|all|none (gpu.gemm.DYNAMIC_TILES), cfg.FIELD=N (gpu.gemm.CONFIG_OVERRIDE: that Sm90Config field on every
Hopper GEMM; the caller keeps it within shared memory); a knob a variant does not name keeps the
library's value at start-up (bench/knobs.py), so "base" is the library's own setting. Usage (device): PYTHONPATH=. python bench/ab_layer.py [--T 8192] [--reps 10]
[--model glm45_air|glm45|deepseek_v3] base dwdt=0"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.gpu import gemm, layer, side_by_side
    from cupy_moe.testing import make_grad_output, make_moe_inputs, relative_error

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="glm45_air")
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args()

    from knobs import Knob, Knobs, flag, integer, text

    wide_tiles_pay = gemm.wide_tiles_pay

    def k_grouped_wide(value, default):
        if value != "0":
            return default
        return lambda n, grouping: grouping != gemm.GROUPINGS["k"] and wide_tiles_pay(n, grouping)

    knobs = Knobs({
        "kwide": Knob(gemm, "wide_tiles_pay", k_grouped_wide),
        "dwdt": Knob(layer, "DWD_TRANSPOSED", flag),
        "sbs": Knob(side_by_side, "MIN_GAIN_STEPS", lambda v, default: default if v != "0" else 1 << 30),
        "ring": Knob(gemm, "STORE_RING", integer),
        "band": Knob(gemm, "BAND_ROWS", integer),
        "nband": Knob(gemm, "BAND_NARROW_ROWS", integer),
        "gband": Knob(gemm, "BAND_GROUPED_ROWS", integer),
        "wband": Knob(gemm, "WIDE_B_BAND", integer),
        "wbytes": Knob(gemm, "WIDE_B_BYTES", integer),
        "f32tma": Knob(gemm, "F32_TMA", flag),
        "dyn": Knob(gemm, "DYNAMIC_TILES", text),
        "kgrate": Knob(side_by_side, "K_GROUPED_FLOP_PER_SM_US", lambda v, _d: float(v)),
        "bsm": Knob(side_by_side, "BYTES_PER_SM_US", lambda v, _d: float(v)),
        "fsm": Knob(side_by_side, "FLOP_PER_SM_US", lambda v, _d: float(v)),
    })

    def use(variant):
        knobs.use(variant)
        gemm._prepared.clear()  # gemm()'s launch cache is keyed by settings kwide does not touch

    cfg = getattr(cupy_moe.MoEConfig, args.model)()
    _, ctx = cupy_moe.moe_forward(**make_moe_inputs(cfg, args.T, seed=0, xp=cp), config=cfg)
    dy = make_grad_output(cfg, args.T, seed=1, xp=cp)
    measure = timer(args.reps)
    first = None
    for v in args.variants:
        use(v)
        g = cupy_moe.moe_backward(dy, ctx)
        if first is None:
            first = g
        worst = max(relative_error(a, b) for a, b in zip(g, first) if a is not None)
        print(f"{v}: worst relative error against {args.variants[0]}: {worst:.2e}")
        assert worst < 1e-2
    times = {v: [] for v in args.variants}
    n = len(args.variants)
    for r in range(args.rounds):
        # Each variant leads in turn: under the power cap the first of a round gains ~3% (NOTES v0.20).
        for v in args.variants[r % n:] + args.variants[:r % n]:
            use(v)
            times[v].append(measure(lambda: cupy_moe.moe_backward(dy, ctx), warmup=2) / 1e3)
    print(f"layer backward T = {args.T}, ms (median of {args.reps} per round):")
    for v, t in times.items():
        print(f"  {v:>16}: " + " ".join(f"{x:8.3f}" for x in t))


if __name__ == "__main__":
    main()
