"""Bound (bench/NOTES.md v0.55): SOL-080 at small T with the split d_act's piece-sum + SwiGLU kernel
not launched (so the dgrad and the weight gradients read stale [d_gate | d_up]: wrong results,
timing only): the most an in-GEMM sum of d_act's pieces could give. 4 interleaved rounds.
Usage (device): PYTHONPATH=. python bench/attic/no_piece_sum_bound.py [T,T,...]"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp
import cupy_moe
from benchmark import timer
from cupy_moe.gpu import sol080 as S, graphs
from cupy_moe.testing import make_sol080_inputs

measure = timer(20)
orig = S._finish_d_act
def nosum(inputs, ws, plan, cancel):
    if plan.act_splits > 1 and not plan.split_cluster:
        return
    return orig(inputs, ws, plan, cancel)
Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [192, 211, 293, 384, 512, 997]
res = {}
for r in range(4):
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        for v in (("base", "nosum") if r % 2 == 0 else ("nosum", "base")):
            S._finish_d_act = nosum if v == "nosum" else orig
            graphs.clear()
            p = S._Plan.of(a["grad_output"], a["hidden_states"], a["router_weight"], a["shared_expert_gate_weight"],
                           a["shared_expert_up_weight"], a["shared_expert_down_weight"], a["shared_gate_output"])
            t = measure(lambda: cupy_moe.sol080_backward(**a))
            res.setdefault((T, v), []).append(t)
        print(T, "act_splits", p.act_splits, {v: round(min(res[(T, v)]), 1) for v in ("base", "nosum")}, flush=True)
S._finish_d_act = orig
print("final (min of rounds):")
for T in Ts:
    b, n = min(res[(T, "base")]), min(res[(T, "nosum")])
    print(f"  T={T}: base {b:.1f}  no sum {n:.1f}  ({n - b:+.1f})")
