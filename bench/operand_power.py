"""The same GEMM on random, all-zero, all-one and random-A-zero-B operands (d_act's shape in 128 x 128
tiles, 6144 rows; the dgrad's in 128 x 256, 8192 rows; all 132 SMs; L2 flushed): how much of the
power-limited clock (bench/ncu_clocks.sh) the operands' data costs. Session 41: zeros, ones and a
zero B all ran 10-13% faster than random data (bench/NOTES.md v0.41).
Usage (device, ~2 s warm): PYTHONPATH=. python bench/operand_power.py"""
import sys
sys.path.insert(0, "bench")
import cupy as cp
from benchmark import timer
from cupy_moe import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm
measure = timer(20)
def run(name, m, n, k, kind):
    if kind == "random":
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(bfloat16)
        b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(bfloat16)
    elif kind == "zeros":
        a, b = cp.zeros((m, k), bfloat16), cp.zeros((k, n), bfloat16)
    elif kind == "ones":
        a, b = cp.ones((m, k), bfloat16), cp.ones((k, n), bfloat16)
    else:  # random A, zero B
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(bfloat16)
        b = cp.zeros((k, n), bfloat16)
    o = cp.empty((m, n), bfloat16)
    f = lambda: gemm(m=m, n=n, segments=[Segment(a, k, b, n, k=k)], a_kmajor=True, b_kmajor=False, out=o, ldc=n)
    t = measure(f)
    print(f"{name:<24} {kind:<14} {t:8.1f} us  {2 * m * n * k / t / 1e6:6.1f} TFLOP/s", flush=True)
for kind in ("random", "zeros", "ones", "rand-A zero-B", "random"):
    run("d_act 6144 x 1408 x 4096", 6144, 1408, 4096, kind)
for kind in ("random", "zeros", "ones", "random"):
    run("dgrad 8192 x 4096 x 2944", 8192, 4096, 2944, kind)
