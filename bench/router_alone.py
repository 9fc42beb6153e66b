"""SOL-080's router kernel (sol080_router_lanes at the contract's shapes: q, c and grl = hi + lo, with the top-k index check)
alone, L2 flushed, median of --reps (us), on all the SMs or on N of them (--beside N: a hog grid,
one block of all of an SM's shared memory on each of the others, spinning ~2 ms on a side
stream, launched before the L2 flush, as d_act or grad_Wd leave the router N SMs in the call):
what one SM moves there.
Each timed launch runs a real check (its verdict read after the launch, as the library does).
Usage (device): PYTHONPATH=. python bench/router_alone.py [--T 192,2053,8192] [--beside 0,14]"""
import argparse
import statistics
import time

_HOG = r"""extern "C" __global__ void __launch_bounds__(32, 1) hog(long long cycles) {
  extern __shared__ int smem[];
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  if (cycles < 0) smem[threadIdx.x] = 0;  // (never: the shared memory is what holds the SM)
}"""


def main():
    import cupy as cp

    from cupy_moe import validate
    from cupy_moe.gpu import sol080
    from cupy_moe.testing import make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="192,2053,8192")
    ap.add_argument("--beside", default="0")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    hog = cp.RawKernel(_HOG, "hog")
    hog_smem = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    hog.max_dynamic_shared_size_bytes = hog_smem
    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    side = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    print(f"{'T':>6} {'SMs':>5} {'us':>8} {'GB/s':>8} {'GB/s an SM':>10}")
    for T in (int(t) for t in args.T.split(",")):
        a = make_sol080_inputs(T, seed=T, xp=cp)
        inputs = sol080._Inputs(*(a[k] for k in (
            "grad_output", "hidden_states", "router_weight", "scores", "topk_indices", "topk_weights",
            "score_mask", "shared_expert_gate_weight", "shared_expert_up_weight",
            "shared_expert_down_weight", "shared_gate_output", "shared_up_output", "shared_activated")))
        E = inputs.wr.shape[0]
        hi = cp.empty((T, 2 * E), cp.uint16)  # [hi | lo] rows, router.py's form
        moved = (inputs.g.nbytes + inputs.scores.nbytes + inputs.mask.nbytes + inputs.idx.nbytes
                 + inputs.tw.nbytes + hi.nbytes)

        def call():
            check = validate.topk_check_in_kernel("topk_indices", inputs.idx, E)
            sol080._router_kernel(inputs, hi, 2 * E, E, check.kernel_args)
            return check

        for free in (int(f) for f in args.beside.split(",")):
            times = []
            for rep in range(args.reps + 2):
                dev.synchronize()
                if free:  # first, so the flush and the router run on the SMs it leaves
                    with side:
                        hog((sms - free,), (32,), (cp.int64(4_000_000),), shared_mem=hog_smem)
                    time.sleep(2e-4)  # the hog's blocks resident before the flush's
                flush.fill(1.0)  # (its time on the GPU hides the host's time to launch the call)
                start.record()
                check = call()
                end.record()
                end.synchronize()
                check.finish()
                dev.synchronize()
                if rep >= 2:
                    times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
            us = statistics.median(times)
            n = free or sms
            print(f"{T:>6} {n:>5} {us:>8.1f} {moved / us / 1e3:>8.0f} {moved / us / 1e3 / n:>10.1f}")


if __name__ == "__main__":
    main()
