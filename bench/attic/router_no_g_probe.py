"""SCRATCH upper bound: SOL-080 with a router that reads no g (q constant), against base; the
current plan. Interleaved rounds, graphs cleared at each switch."""
import os, sys
sys.path.insert(0, "bench")
import numpy as np
import cupy as cp
import cupy_moe
from cupy_moe import _build
from cupy_moe.gpu import graphs
from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs
from benchmark import timer

orig = _build.load_module
state = {"noq": False}
def load_module(entry, prelude=""):
    if entry == "sol080.cu" and state["noq"]:
        prelude = "#define ROUTER_NO_G 1\n" + prelude
    return orig(entry, prelude)
_build.load_module = load_module
import cupy_moe.gpu.sol080 as S
S._build.load_module = load_module

measure = timer(20)
Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [t for t, _ in SOL080_WORKLOADS]
rows = []
for i, T in enumerate(Ts):
    a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
    res = {False: [], True: []}
    for r in range(3):
        for v in ((False, True) if (r + i) % 2 == 0 else (True, False)):
            state["noq"] = v
            graphs.clear()
            res[v].append(measure(lambda: cupy_moe.sol080_backward(*a)))
    b, n = min(res[False]), min(res[True])
    rows.append((T, b, n))
    print(f"{T:6d} base {b:8.1f} noq {n:8.1f} diff {n-b:+6.1f}", flush=True)
print(f"mean base {np.mean([r[1] for r in rows]):.1f} noq {np.mean([r[2] for r in rows]):.1f}")
