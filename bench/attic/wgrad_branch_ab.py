"""A/B (bench/NOTES.md v0.55): the mid-T router wgrad on a third branch, with launch priorities
honored in the replayed graph or not; the outputs of every variant bitwise equal to the first's.
Usage (device, in a copy with bench/attic/wgrad_branch_priority.patch applied):
  PYTHONPATH=. python bench/attic/wgrad_branch_ab.py [T,T,... [variant,variant,...]]
  variants: base, base+flag (graphs instantiated with node priorities), nop (the branch alone),
  prio-ignored (the branch and priorities, graphs as CuPy instantiates them), prio."""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp
import cupy_moe
from benchmark import timer
from cupy_moe.gpu import sol080 as S, graphs
from cupy_moe.testing import make_sol080_inputs

measure = timer(20)
V = {"base": ("0", False), "base+flag": ("0", True), "nop": ("nop", False), "prio-ignored": ("1", False), "prio": ("1", True)}
names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(V)
Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 and sys.argv[1] else [997, 1321, 1571, 1879, 2053]
res = {}
for r in range(4):
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        ref = None
        order = names[r % len(names):] + names[:r % len(names)]
        for v in order:
            S.WGRAD_BRANCH, graphs.NODE_PRIORITY = V[v]
            graphs.clear()
            out = [o.copy() for o in cupy_moe.sol080_backward(**a)]
            if r == 0:
                if ref is None:
                    ref = out
                else:
                    same = all(bool((x.view(cp.uint16 if x.dtype.itemsize == 2 else cp.uint32) ==
                                     y.view(cp.uint16 if y.dtype.itemsize == 2 else cp.uint32)).all()) for x, y in zip(out, ref))
                    assert same, (T, v, "outputs differ")
            res.setdefault((T, v), []).append(measure(lambda: cupy_moe.sol080_backward(**a)))
S.WGRAD_BRANCH, graphs.NODE_PRIORITY = "0", False
print(f"{'T':>6} " + " ".join(f"{v:>13}" for v in names) + "   (min over 4 rounds of medians, us)")
tot = {v: 0.0 for v in names}
for T in Ts:
    row = {v: min(res[(T, v)]) for v in names}
    for v in names:
        tot[v] += row[v] / len(Ts)
    print(f"{T:>6} " + " ".join(f"{row[v]:13.1f}" for v in names))
print(f"{'mean':>6} " + " ".join(f"{tot[v]:13.1f}" for v in names))
