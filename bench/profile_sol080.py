"""Where sol080_backward's time goes: each stage timed alone (CPU and GPU time, cupyx.profiler),
or with --host the Python functions of repeated calls (cProfile; what the host adds per call).
Usage: PYTHONPATH=. python bench/profile_sol080.py [--host] [T ...]"""
import cProfile
import pstats
import sys

import cupy as cp
from cupyx.profiler import benchmark

import cupy_moe
from cupy_moe import validate
from cupy_moe.gpu.gemm import Segment, gemm
from cupy_moe.testing import make_sol080_inputs


def main(Ts):
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        H, I, E = 4096, 1408, 128
        g, x, wr, wg, wu, wd, act = (a[k] for k in ("grad_output", "hidden_states", "router_weight",
                                                    "shared_expert_gate_weight", "shared_expert_up_weight",
                                                    "shared_expert_down_weight", "shared_activated"))
        d = cp.empty((T, I), cupy_moe.bfloat16)
        wgrad = cp.empty((I, H), cupy_moe.bfloat16)
        hi = cp.zeros((T, E), cupy_moe.bfloat16)
        out = cp.empty((T, H), cupy_moe.bfloat16)
        stages = {
            "whole call": lambda: cupy_moe.sol080_backward(**a),
            "validation": lambda: validate.sol080_args(a),
            "d_act GEMM T x I x H": lambda: gemm(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)],
                                                 a_kmajor=True, b_kmajor=False, out=d, ldc=I),
            "one wgrad GEMM I x H x T": lambda: gemm(m=I, n=H, segments=[Segment(d, I, x, H, k=T)],
                                                     a_kmajor=False, b_kmajor=False, out=wgrad, ldc=H),
            "dgrad GEMM T x H x (2I+E)": lambda: gemm(
                m=T, n=H, segments=[Segment(d, I, wu, H, k=I), Segment(d, I, wg, H, k=I),
                                    Segment(hi, E, wr, H, k=E)],
                a_kmajor=True, b_kmajor=False, out=out, ldc=H),
        }
        print(f"T = {T}")
        for name, fn in stages.items():
            r = benchmark(fn, n_repeat=20, n_warmup=3)
            print(f"  {name:<28} cpu {r.cpu_times.mean() * 1e6:8.1f} us   gpu {r.gpu_times.mean() * 1e6:8.1f} us")


def host(Ts, calls=300):
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        for _ in range(5):  # compile, capture the graph
            cupy_moe.sol080_backward(**a)
        cp.cuda.Device().synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            cupy_moe.sol080_backward(**a)
        prof.disable()
        cp.cuda.Device().synchronize()
        print(f"T = {T}: {calls} calls (graph replay)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--host" in args:
        host([int(t) for t in args if t != "--host"] or [192])
    else:
        main([int(t) for t in args] or [192, 8192])
