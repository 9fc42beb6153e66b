"""The layer's routed grouped GEMMs alone at T = 8192, L2 flushed, median of --reps: what an
expert's last, partial row tile and the expert weights' DRAM traffic cost, per model.
  dgrad: the routed dgrad [dg | du] @ [Wg; Wu] (M-grouped); with one weight for all experts too
    (B always in L2: what the weights' DRAM traffic costs);
  fused: the fused SwiGLU dgrad dy @ Wd with its SwiGLU-backward epilogue (M-grouped);
  dWu:   du^T x over each expert's rows (K-grouped, layer.input_weight_grad);
each with random routing (top-K distinct experts a token, uniform) and balanced counts (T K / E
rows an expert, a multiple of 128 at every model here: no partial row tiles). With --bands B,...
each M-grouped GEMM runs once more per band of row tiles (gemm's band; 'lib' is the library's
own choice, gemm.m_grouped_band), in --rounds rounds of rotated order; the best round is shown.
Session 33 (GLM-4.5-Air, then bench/m_grouped_alone.py): the dgrad 2200.5 / 2195.9 / 2107.4 us
(687 / 689 / 717 TFLOP/s) random / one weight / balanced: a tile of <= 64 rows runs at ~60% of a
full one's time. Session 57: DeepSeek-V3's dgrad 7.1-7.7 ms in the plain order, ~6.1 / 7.3 ms
(balanced / random) in bands of 4 (bench/NOTES.md v0.57).
Usage (device): PYTHONPATH=. python bench/grouped_alone.py [--model glm45_air|glm45|deepseek_v3]
[--T 8192] [--reps 10] [--bands lib,1,4] [--rounds 2]"""
import argparse
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402

import cupy_moe  # noqa: E402
from cupy_moe import bfloat16  # noqa: E402
from cupy_moe.gpu.gemm import Segment, SwigluBackward, gemm  # noqa: E402
from cupy_moe.gpu.layer import input_weight_grad  # noqa: E402


def normal(*shape, scale=1.0):
    a = cp.random.standard_normal(shape, dtype=cp.float32)
    a *= scale
    return a.astype(bfloat16)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="glm45_air")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bands", default="", help="comma list: lib (the library's choice) or N row tiles")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    cfg = getattr(cupy_moe.MoEConfig, args.model)()
    T, K, E, H, I = (args.T, cfg.num_experts_per_tok, cfg.n_routed_experts, cfg.hidden_size,
                     cfg.moe_intermediate_size)
    N = T * K
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((T, E)), axis=1)[:, :K]
    counts = {"random": np.bincount(picks.ravel(), minlength=E), "balanced": np.full(E, N // E)}
    counts["balanced"][: N - counts["balanced"].sum()] += 1
    cp.random.seed(0)
    dy, x = normal(N, H), normal(N, H)
    gate, up = normal(N, I, scale=2.0), normal(N, I)
    dg, du, act, aw = (cp.empty((N, I), bfloat16) for _ in range(4))
    weights, dw = cp.random.random(N, dtype=cp.float32), cp.empty(N, cp.float32)
    wg, wu, wd = normal(E, I, H, scale=H ** -0.5), normal(E, I, H, scale=H ** -0.5), normal(E, H, I, scale=I ** -0.5)
    out = cp.empty((N, H), bfloat16)
    measure = timer(args.reps)
    flop = 2.0 * N * H * I  # one [N x H] x [H x I] product
    print(f"{args.model} T={T}: {N} rows, {E} experts, {N / E:.0f} rows an expert; H {H}, I {I}; "
          f"B a expert: dgrad {2 * H * 2 * I / 1e6:.1f} MB, fused {2 * H * I / 1e6:.1f} MB")
    bands = [b for b in args.bands.split(",") if b]
    for routing, c in counts.items():
        offs = cp.asarray(np.concatenate([[0], np.cumsum(c)]).astype(np.int32))
        grouped = dict(grouping="m", group_offsets=offs, num_groups=E)
        tiles = int(np.sum((c + 127) // 128))
        small = int(np.sum((c % 128 > 0) & (c % 128 <= 64)))
        print(f" {routing}: row tiles {tiles} (of which <= 64 rows: {small})")

        def dgrad(band=0, stride=I * H):
            gemm(m=N, n=H, segments=[Segment(dg, I, wg, H, k=I, b_group_stride=stride),
                                     Segment(du, I, wu, H, k=I, b_group_stride=stride)],
                 a_kmajor=True, b_kmajor=False, out=out, ldc=H, band=band, **grouped)

        def fused(band=0):
            gemm(m=N, n=I, segments=[Segment(dy, H, wd, I, k=H, b_group_stride=H * I)], a_kmajor=True,
                 b_kmajor=False, out=None, ldc=I, epilogue="swiglu_backward", band=band,
                 swiglu=SwigluBackward(gate=gate, up=up, dg=dg, du=du, act=act, weights=weights, aw=aw,
                                       dw=dw), **grouped)

        fused()  # dg, du: real values for the dgrad and dWu
        for name, run, f in (("dgrad", dgrad, 2 * flop), ("fused", fused, flop)):
            us = measure(run)
            print(f"  {name:>5} {'lib':>8}: {us:8.1f} us {f / us / 1e6:6.1f} TFLOP/s")
        us = measure(lambda: dgrad(stride=0))
        print(f"  dgrad one weight: {us:8.1f} us {2 * flop / us / 1e6:6.1f} TFLOP/s")
        grad, call = input_weight_grad(du, x, offs, E)
        us = measure(lambda: gemm(**call))
        print(f"  dWu   K-grouped: {us:8.1f} us {flop / us / 1e6:6.1f} TFLOP/s  output {grad.nbytes / 1e9:.2f} GB")
        times = {(name, b): [] for name in ("dgrad", "fused") for b in bands}
        for r in range(args.rounds if bands else 0):
            for b in bands[r % len(bands):] + bands[:r % len(bands)]:
                for name, run in (("dgrad", dgrad), ("fused", fused)):
                    times[name, b].append(measure(lambda: run(0 if b == "lib" else int(b))))
        for (name, b), ts in times.items():
            f = 2 * flop if name == "dgrad" else flop
            print(f"  {name:>5} band {b:>3}: {min(ts):8.1f} us {f / min(ts) / 1e6:6.1f} TFLOP/s  "
                  f"(rounds: {' '.join(f'{t:.0f}' for t in ts)})")


if __name__ == "__main__":
    main()
