"""SOL-080's small-T GEMMs taken apart (bench/NOTES.md v0.55): full / no epilogue / loads only (no
MMAs) / MMAs only (no loads) / neither, each GEMM alone, L2 flushed; every variant but "full" keeps
its accumulators live (PROBE_SKIP 1). Wrong results, timing only.
Usage (device, in a copy with bench/attic/probe_skip.patch applied):
  cp -r cupy_moe cuda_src bench /tmp/x && cd /tmp/x && patch -p1 -s < bench/attic/probe_skip.patch
  PYTHONPATH=. python bench/attic/small_gemm_parts.py"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp
from benchmark import timer
from cupy_moe._arrays import bfloat16
from cupy_moe.gpu import gemm as G
from cupy_moe.gpu.gemm import Segment, gemm

measure = timer(20)
rnd = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
cases = []
for T in (192, 512):
    A, B, C = rnd(T, 2944), rnd(2944, 4096), cp.empty((T, 4096), bfloat16)
    cases.append((f"dgrad T={T} [T x 2944]x[2944 x 4096]", 2 * T * 2944 * 4096,
                  lambda A=A, B=B, C=C, T=T: gemm(m=T, n=4096, segments=[Segment(A, 2944, B, 4096, k=2944)],
                                                  a_kmajor=True, b_kmajor=False, out=C, ldc=4096)))
    A, B, C = rnd(T, 4096), rnd(4096, 1408), cp.empty((T, 1408), bfloat16)
    cases.append((f"d_act unsplit T={T}", 2 * T * 4096 * 1408,
                  lambda A=A, B=B, C=C, T=T: gemm(m=T, n=1408, segments=[Segment(A, 4096, B, 1408, k=4096)],
                                                  a_kmajor=True, b_kmajor=False, out=C, ldc=1408)))
for K in (192, 512):
    a, x, out = rnd(K, 2816), rnd(K, 4096), cp.empty((2816, 4096), bfloat16)
    for pp in (True, False):
        cases.append((f"wgu K={K} {'pingpong' if pp else 'coop'}", 2 * K * 2816 * 4096,
                      lambda a=a, x=x, out=out, K=K, pp=pp: gemm(m=2816, n=4096, segments=[Segment(a, 2816, x, 4096, k=K)],
                                                                a_kmajor=False, b_kmajor=False, out=out, ldc=4096, pingpong=pp)))
names = {0: "full", 1: "no epi", 33: "loads only", 3: "MMAs only", 35: "neither"}
print("us, flushed (min of 2 rounds of medians of 20)")
for name, flops, f in cases:
    row = {}
    for rnd_ in range(2):
        for probe in names:
            G.CONFIG_OVERRIDE = {"PROBE_SKIP": probe} if probe else {}
            t = measure(f)
            row[probe] = min(row.get(probe, 1e9), t)
    G.CONFIG_OVERRIDE = {}
    print(f"{name:<38} " + "  ".join(f"{names[p]} {row[p]:6.1f}" for p in names) + f"  | full {flops / row[0] / 1e6:5.0f} TFLOP/s", flush=True)
