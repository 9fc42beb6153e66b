"""A k-step's time against the number of CTAs that run: d_act's shape (128 x 128 tiles, and 128 x
256 ones) and the dgrad's (128 x 256), each GEMM held to 33 / 66 / 99 / 132 CTAs (gemm(max_ctas)),
L2 flushed, us per 64-deep k-step of a CTA over its rounds (bench/NOTES.md v0.41: both shapes slow
as more SMs run them, 128 x 128 the most, at an unchanged 1980 MHz).
Usage (device): PYTHONPATH=. python bench/cta_scan.py"""
import sys
sys.path.insert(0, "bench")
import cupy as cp
from benchmark import timer
from cupy_moe import bfloat16
from cupy_moe.gpu import gemm as G
from cupy_moe.gpu.gemm import Segment, gemm
measure = timer(20)
def rand(*s):
    return cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
H, I = 4096, 1408
x, wd = rand(8192, H), rand(H, I)
a2, w2 = rand(8192, 2944), rand(2944, H)
def row(name, T, n, A, B, K, ctas, wide=False):
    out = cp.empty((T, n), bfloat16)
    kw = dict(m=T, n=n, segments=[Segment(A, K, B, n, k=K)], a_kmajor=True, b_kmajor=False, out=out, ldc=n,
              wide=wide, max_ctas=ctas)
    l = G.prepare(**kw)
    t = measure(lambda: gemm(**kw))
    rounds = -(-l.tiles // l.grid[0])
    bn = 256 if (n == H or wide) else 128
    flops = 2 * T * n * K
    print(f"{name:<28} BN~{bn} tiles {l.tiles:>5} ctas {l.grid[0]:>4} rounds {rounds:>3}: {t:8.1f} us "
          f"{t / (rounds * (K // 64)):.3f} us/k-step  {flops / t / 1e6:6.1f} TFLOP/s", flush=True)
for c in (33, 66, 99, 132):
    row("d_act 6144 (128x128)", 6144, I, x, wd, H, c)
for c in (33, 66, 99, 132):
    row("dgrad 8192 (128x256)", 8192, H, a2, w2, 2944, c)
for c in (33, 66, 132):
    row("d_act 6144 wide (128x256)", 6144, I, x, wd, H, c, wide=True)
