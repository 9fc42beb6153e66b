"""Is the host inside SOL-080's timed window? benchmark.py's measurement of sol080_backward, with
an event recorded right after the launches (it fires at the GPU's end of the call). Per T,
medians of --reps (us):
  timed:  end - start, as benchmark.py reads it;
  gpu:    start -> the event after the launches (the GPU's end);
  late:   end - that event (the host recorded end after the GPU was done: its return was late);
  held:   gpu with a 2 ms spin queued before start (the GPU alone: no launch gap can open);
  pre:    host time from the call's entry to its launches' return;
  flush:  start - an event before the 256 MiB flush (the flush's GPU time plus its host launch).
timed ~ held and a small constant late: the host is hidden behind the flush. --eager runs the
launches without the captured graph (a workspace per shape), to price the graph.
Usage (device): PYTHONPATH=. python bench/sol080_host_gap.py [--T 192,8192] [--reps 20] [--eager]"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from spin import hold_gpu  # noqa: E402


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.gpu import graphs
    from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default=",".join(str(T) for T, _ in SOL080_WORKLOADS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args()
    after, host, workspaces = cp.cuda.Event(), {}, {}
    run = graphs.run

    def traced_run(key, make_workspace, enqueue):
        if args.eager:
            if key not in workspaces:
                workspaces[key] = make_workspace()
            enqueue(workspaces[key])
        else:
            run(key, make_workspace, enqueue)
        after.record()
        host["launched"] = time.perf_counter()

    graphs.run = traced_run
    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    before_flush, start, end = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
    ms = lambda a, b: cp.cuda.get_elapsed_time(a, b) * 1e3
    print(f"{'T':>5} {'timed':>7} {'gpu':>7} {'late':>6} {'held':>7} {'pre':>6} {'flush':>6}")
    for T in (int(t) for t in args.T.split(",")):
        a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
        for _ in range(4):
            cupy_moe.sol080_backward(*a)
        cp.cuda.Device().synchronize()
        r = {k: [] for k in ("timed", "gpu", "late", "held", "pre", "flush")}
        for _ in range(args.reps):
            for held in (False, True):
                before_flush.record()
                flush.fill(1.0)
                if held:
                    hold_gpu(2.0)
                start.record()
                t0 = time.perf_counter()
                cupy_moe.sol080_backward(*a)
                end.record()
                end.synchronize()
                if held:
                    r["held"].append(ms(start, after))
                    continue
                r["timed"].append(ms(start, end))
                r["gpu"].append(ms(start, after))
                r["late"].append(ms(after, end))
                r["pre"].append((host["launched"] - t0) * 1e6)
                r["flush"].append(ms(before_flush, start))
        m = {k: statistics.median(v) for k, v in r.items()}
        print(f"{T:>5} {m['timed']:7.1f} {m['gpu']:7.1f} {m['late']:6.1f} {m['held']:7.1f} {m['pre']:6.1f} "
              f"{m['flush']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
