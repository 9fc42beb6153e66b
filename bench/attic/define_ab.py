"""SCRATCH (bench/NOTES.md v0.54): SOL-080 with a scratch prelude define (argv[1], e.g. SIGMOID_TANH
with the define written into cuda_src first) against the shipped kernels: interleaved rounds over
the 16 T, every module cache cleared at each switch; the variant's outputs against base's by the
pass rule (a timing A/B, not a reference check).
Usage (device): PYTHONPATH=. python bench/attic/define_ab.py NAME 4"""
import sys
sys.path.insert(0, "bench")
import numpy as np
import cupy as cp
import cupy_moe
from cupy_moe import _build
from cupy_moe.gpu import graphs, gemm
from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs, sol080_pass_rule, relative_error
from benchmark import timer

orig = _build.load_module
state = {"define": ""}
def load_module(entry, prelude=""):
    if state["define"]:
        prelude = f"#define {state['define']} 1\n" + prelude
    return orig(entry, prelude)
_build.load_module = load_module

def switch(v):
    state["define"] = v
    gemm._sm90_module.cache_clear()
    gemm._prepared.clear()
    graphs.clear()

variants = ["", sys.argv[1]]
rounds = int(sys.argv[2])
measure = timer(20)
rows = []
for i, (T, atol) in enumerate(SOL080_WORKLOADS):
    a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
    outs = {}
    for v in variants:
        switch(v)
        outs[v] = [o.copy() for o in cupy_moe.sol080_backward(*a)]
    chk = [sol080_pass_rule(o, b, atol) for o, b in zip(outs[variants[1]], outs[""])]
    errs = [relative_error(o, b) for o, b in zip(outs[variants[1]], outs[""])]
    res = {v: [] for v in variants}
    for r in range(rounds):
        for v in (variants if (r + i) % 2 == 0 else variants[::-1]):
            switch(v)
            res[v].append(measure(lambda: cupy_moe.sol080_backward(*a)))
    row = [min(res[v]) for v in variants]
    rows.append(row)
    print(f"{T:6d} " + " ".join(f"{x:8.1f}" for x in row) + f"  {row[1]-row[0]:+6.1f}  pass {all(c.ok for c in chk)} "
          + " ".join(f"{e:.1e}" for e in errs), flush=True)
m = np.mean(rows, axis=0)
print("  mean " + " ".join(f"{x:8.1f}" for x in m) + f"  {m[1]-m[0]:+6.2f}")
