"""How much of a public call's timed latency is the GPU's own and how much is the GPU waiting for
the host to queue work. Three measures of the same call, interleaved, median of --reps each:
  timed:  as benchmark.py times it (L2 flushed, events around the call);
  queued: the same with a spin kernel holding the GPU while the call is queued behind it, so the
          events time the GPU alone (no launch gaps);
  host:   the host's wall time to queue the call (perf_counter, GPU held).
timed - queued is what host-side work costs the caller. The spin leaves the GPU near idle for
--spin-ms, which may raise the clock for the queued call: read a small gap as no gap. A call that
waits on the GPU inside (SOL-080's index verdict) waits for the spin too: its "host" then reads
the spin's length, and "queued" still times the GPU from the spin's end.
Usage (device): PYTHONPATH=. python bench/call_gap.py [--T 8192] [--reps 20] [--spin-ms 20]
                [layer|sol080 ...]"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from spin import hold_gpu  # noqa: E402 (not profile_kernels': that module turns SOL-080's graphs off)


def calls(which, T):
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import make_moe_inputs, make_grad_output, make_sol080_inputs

    if which == "layer":
        cfg = cupy_moe.MoEConfig.glm45_air()
        a = make_moe_inputs(cfg, T, seed=0, xp=cp)
        dy = make_grad_output(cfg, T, seed=1, xp=cp)
        _, ctx = cupy_moe.moe_forward(**a, config=cfg)
        return lambda: cupy_moe.moe_backward(dy, ctx)
    a = make_sol080_inputs(T, seed=T, xp=cp)
    return lambda: cupy_moe.sol080_backward(**a)


def main():
    import cupy as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--spin-ms", type=float, default=20.0)
    ap.add_argument("which", nargs="*", default=["layer"])
    args = ap.parse_args()
    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for which in args.which:
        fn = calls(which, args.T)
        for _ in range(3):
            fn()
        cp.cuda.Device().synchronize()
        timed, queued, host = [], [], []
        for _ in range(args.reps):
            for held in (False, True):
                flush.fill(1.0)
                if held:
                    hold_gpu(args.spin_ms)
                start.record()
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                end.record()
                end.synchronize()
                gpu_us = cp.cuda.get_elapsed_time(start, end) * 1e3
                (queued if held else timed).append(gpu_us)
                if held:
                    host.append((t1 - t0) * 1e6)
        med = {k: statistics.median(v) for k, v in (("timed", timed), ("queued", queued), ("host", host))}
        print(f"{which} T={args.T}: timed {med['timed']:9.1f} us | queued (GPU alone) {med['queued']:9.1f} us"
              f" | gap {med['timed'] - med['queued']:7.1f} us | host to queue {med['host']:8.1f} us"
              f" (medians of {args.reps})")


if __name__ == "__main__":
    main()
