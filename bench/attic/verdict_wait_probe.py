"""Does the host's wait for the top-k index verdict inside sol080_backward delay the benchmark's end
event (bench/NOTES.md v0.55: no)? normal: as benchmark.py times the call; deferred: the verdict is
waited for after end.record (before the next call); held: deferred, with a spin kernel ahead of the
start event (the GPU alone). 16 workloads, 3 interleaved rounds, L2 flushed.
Usage (device): PYTHONPATH=. python bench/attic/verdict_wait_probe.py [T,T,...]"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cupy as cp
import cupy_moe
from benchmark import timer
from cupy_moe import validate
from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs

orig = validate.topk_check_in_kernel
pending = []
def deferring(name, idx, n):
    c = orig(name, idx, n)
    f = c.finish
    def later():
        pending.append(f)
    c.finish = later
    return c

def settle_then_flush(flush):  # the last call's deferred verdict, before the next call's flush
    while pending:
        pending.pop()()
    flush.fill(1.0)

timers = {"normal": timer(20), "deferred": timer(20), "held": timer(20, hold_ms=2.0)}
def measure(fn, mode):
    t = timers[mode](fn, warmup=2, before=settle_then_flush)
    settle_then_flush(cp.empty(0, cp.float32))
    return t

Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [t for t, _ in SOL080_WORKLOADS]
res = {}
for r in range(3):
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        fn = lambda: cupy_moe.sol080_backward(**a)
        modes = ["normal", "deferred", "held"]
        modes = modes[r % 3:] + modes[:r % 3]
        for m in modes:
            validate.topk_check_in_kernel = deferring if m != "normal" else orig
            res.setdefault((T, m), []).append(measure(fn, m))
        validate.topk_check_in_kernel = orig
        del a
print(f"{'T':>6} {'normal':>8} {'deferred':>9} {'held':>8}   (min over 3 rounds of medians, us)")
tot = {m: 0.0 for m in ("normal", "deferred", "held")}
for T in Ts:
    row = {m: min(res[(T, m)]) for m in tot}
    for m in tot: tot[m] += row[m] / len(Ts)
    print(f"{T:>6} {row['normal']:8.1f} {row['deferred']:9.1f} {row['held']:8.1f}")
print(f"{'mean':>6} {tot['normal']:8.1f} {tot['deferred']:9.1f} {tot['held']:8.1f}")
