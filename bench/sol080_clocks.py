"""The SM clock and board power while SOL-080 calls run as the benchmark runs them (L2 flushed
before each call, the host waiting for each), per workload: which T run at the full clock and which
under the power cap. Where a call is capped, a plan that only removes idle SM time gains little
(the busy SMs then run slower); where it is not, idle is time. NVML read between calls (the
clock it reports is a recent sample, so a long loop of one T gives that T's state).
Usage (device): PYTHONPATH=. python bench/sol080_clocks.py [--seconds 1.5] [--T 192,997,2053,4093,8192]"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from energy import Nvml  # noqa: E402


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--T", default="")
    args = ap.parse_args()
    Ts = [int(t) for t in args.T.split(",")] if args.T else sorted(t for t, _ in SOL080_WORKLOADS)
    nvml = Nvml()
    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    print(f"power limit {nvml.power_limit_w():.0f} W")
    print(f"{'T':>6} {'us':>8} {'SM MHz med':>10} {'min':>6} {'W med':>7} {'W max':>7}")
    for T in Ts:
        a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
        for _ in range(3):
            cupy_moe.sol080_backward(*a)
        cp.cuda.Device().synchronize()
        times, mhz, watts = [], [], []
        t_end = time.perf_counter() + args.seconds
        while time.perf_counter() < t_end:
            flush.fill(1.0)
            start.record()
            cupy_moe.sol080_backward(*a)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
            mhz.append(nvml.sm_mhz())
            watts.append(nvml.power_w())
        half = len(times) // 2  # the second half: the state a run of this T settles in
        print(f"{T:>6} {statistics.median(times[half:]):>8.1f} {statistics.median(mhz[half:]):>10.0f} "
              f"{min(mhz[half:]):>6.0f} {statistics.median(watts[half:]):>7.0f} {max(watts[half:]):>7.0f}")


if __name__ == "__main__":
    main()
