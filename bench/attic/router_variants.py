"""SCRATCH (bench/NOTES.md v0.48; with bench/attic/router_q_defines.patch applied): SOL-080 with
the router's scratch variants (prelude defines), interleaved rounds, graphs cleared at each
switch; no bit check (the variants change q).
Usage (device): PYTHONPATH=. python bench/attic/router_variants.py "" 4   (all 16 T, 4 rounds)"""
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
state = {"define": ""}
def load_module(entry, prelude=""):
    if entry == "sol080.cu" and state["define"]:
        prelude = f"#define {state['define']} 1\n" + prelude
    return orig(entry, prelude)
_build.load_module = load_module
import cupy_moe.gpu.sol080 as S
S._build.load_module = load_module

variants = ["", "ROUTER_Q_LOADS_ONLY", "ROUTER_NO_G"]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
measure = timer(20)
Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 and sys.argv[1] else [t for t, _ in SOL080_WORKLOADS]
rows = []
for i, T in enumerate(Ts):
    a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
    res = {v: [] for v in variants}
    for r in range(rounds):
        k = (r + i) % len(variants)
        for v in variants[k:] + variants[:k]:
            state["define"] = v
            graphs.clear()
            res[v].append(measure(lambda: cupy_moe.sol080_backward(*a)))
    row = [min(res[v]) for v in variants]
    rows.append(row)
    print(f"{T:6d} " + " ".join(f"{x:8.1f}" for x in row), flush=True)
print("  mean " + " ".join(f"{x:8.1f}" for x in np.mean(rows, axis=0)))
