"""SOL-080 calls back to back without an L2 flush, as a training loop makes them: us a call (CUDA
events around 200 replayed calls, the median of 5 such runs). Where the host's work per call
(validation, plan, graph launch, the wait for the top-k verdict) exceeds the GPU's, it is the
bound; the benchmark's flushed calls hide it (bench/NOTES.md v0.38).
Usage (device): PYTHONPATH=. python bench/back_to_back.py [192,384,1321]"""
import statistics
import sys


def main(Ts):
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import make_sol080_inputs

    for T in Ts:
        a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
        for _ in range(5):  # eager, captured, replayed
            cupy_moe.sol080_backward(*a)
        cp.cuda.Device().synchronize()
        runs = []
        for _ in range(5):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(200):
                cupy_moe.sol080_backward(*a)
            end.record()
            end.synchronize()
            runs.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 200)
        print(f"T={T:>5}  {statistics.median(runs):7.1f} us a call back to back "
              f"(runs {min(runs):.1f}-{max(runs):.1f})")


if __name__ == "__main__":
    main([int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "192,384,1321").split(",")])
