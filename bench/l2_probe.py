"""What the L2 flush costs SOL-080 at each T: the call's GPU time (queued behind a spin kernel, so
the host's time to launch it is outside the events) with L2 flushed before it as the benchmark
does, with the call's weights read back into L2 after the flush (untimed: the most an in-call L2
prefetch of them could give), and with no flush (everything the last call left). Median of --reps.
--weights picks which (a comma list of the call's argument names; default: all four).
Usage (device): PYTHONPATH=. python bench/l2_probe.py [--T 192,384] [--reps 20] [--weights ...]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--weights", default="router_weight,shared_expert_gate_weight,shared_expert_up_weight,"
                                         "shared_expert_down_weight")
    args = ap.parse_args()
    Ts = [int(t) for t in args.T.split(",")] if args.T else sorted(t for t, _ in SOL080_WORKLOADS)
    measure = timer(args.reps, hold_ms=0.3)
    sink = cp.empty((), cp.float32)
    weights = args.weights.split(",")
    print(f"{'T':>6} {'flushed':>9} {'weights warm':>13} {'no flush':>9}")
    for T in Ts:
        a = {k: cp.asarray(v) for k, v in make_sol080_inputs(T, seed=T).items()}
        call = lambda: cupy_moe.sol080_backward(**a)

        def warm_weights(flush):
            flush.fill(1.0)
            for w in weights:  # a read of every byte brings the array into L2
                cp.sum(a[w].view(cp.uint16), dtype=cp.float32, out=sink)

        flushed, warm = measure(call), measure(call, before=warm_weights)
        unflushed = measure(call, before=lambda flush: None)
        print(f"{T:>6} {flushed:9.1f} {warm:13.1f} {unflushed:9.1f}", flush=True)


if __name__ == "__main__":
    main()
