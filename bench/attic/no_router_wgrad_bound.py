"""Bound (bench/NOTES.md v0.55): SOL-080 with its separate router weight-gradient GEMM not launched
(wrong results, timing only): what the router wgrad costs the call where it is its own GEMM.
4 interleaved rounds. Usage (device): PYTHONPATH=. python bench/attic/no_router_wgrad_bound.py [T,T,...]"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp
import cupy_moe
from benchmark import timer
from cupy_moe.gpu import sol080 as S, graphs, router
from cupy_moe.testing import make_sol080_inputs

measure = timer(20)
orig = router.weight_gradient
Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [512, 997, 1321, 1571, 1879, 2053, 3089]
res = {}
for r in range(4):
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        for v in (("base", "nowgrad") if r % 2 == 0 else ("nowgrad", "base")):
            router.weight_gradient = (lambda *args, **kw: None) if v == "nowgrad" else orig
            graphs.clear()
            res.setdefault((T, v), []).append(measure(lambda: cupy_moe.sol080_backward(**a)))
router.weight_gradient = orig
p = lambda T: S._Plan.of(*(make_sol080_inputs(T, seed=T, xp=cp)[k] for k in ("grad_output", "hidden_states", "router_weight", "shared_expert_gate_weight", "shared_expert_up_weight", "shared_expert_down_weight", "shared_gate_output")))
for T in Ts:
    b, n = min(res[(T, "base")]), min(res[(T, "nowgrad")])
    print(f"T={T}: fused {p(T).wgrad_fused} base {b:.1f}  no router wgrad {n:.1f}  ({n - b:+.1f})")
