"""Where a SOL-080 call's latency goes besides its kernels, measured the benchmark's way (CUDA
events around the call, L2 flushed, median): the public call; the call past the structural
argument checks (gpu/sol080.py directly; the top-k index check runs inside its router kernel);
the checks as they would cost alone (structural + the check kernel of its own and its wait); the
replay of the call's CUDA graph alone (its GPU time); and the host's CPU time per call.
Usage: PYTHONPATH=. python bench/sol080_breakdown.py [T ...]"""
import sys
import time

import cupy as cp

sys.path.insert(0, "bench")
from benchmark import timer  # noqa: E402

import cupy_moe  # noqa: E402
from cupy_moe import validate  # noqa: E402
from cupy_moe.gpu import graphs  # noqa: E402
from cupy_moe.gpu import sol080 as gpu_sol080  # noqa: E402
from cupy_moe.testing import make_sol080_inputs  # noqa: E402


def main(Ts, reps=30):
    measure = timer(reps)
    print(f"us, median of {reps}, L2 flushed; loop = per call, back to back, no flush")
    print(f"{'T':>6} {'call':>8} {'no struct':>10} {'checks':>8} {'graph':>8} {'loop':>8}")
    for T in Ts:
        a = make_sol080_inputs(T, seed=T, xp=cp)
        args = list(a.values())
        call = measure(lambda: cupy_moe.sol080_backward(**a))
        unchecked = measure(lambda: gpu_sol080.sol080_backward(*args))
        checks = measure(lambda: validate.sol080_args(a))
        graph = next(reversed(graphs._graphs.values()))[0]  # the last call's graph
        stream = cp.cuda.get_current_stream()
        replay = measure(lambda: graph.launch(stream))
        cp.cuda.Device().synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            cupy_moe.sol080_backward(**a)
        loop = (time.perf_counter() - t0) / n * 1e6
        cp.cuda.Device().synchronize()
        print(f"{T:>6} {call:>8.1f} {unchecked:>10.1f} {checks:>8.1f} {replay:>8.1f} {loop:>8.1f}")


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1:]] or [192, 512, 997, 2053, 4093, 8192])
