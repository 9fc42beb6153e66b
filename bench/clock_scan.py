"""The SM clock as nvidia-smi samples it (every 10 ms) while d_act's shape runs on 132 or 33 CTAs,
each call behind a 256 MB flush (the benchmark's pattern) or back to back. It read 1980 MHz behind
the flush whatever the CTAs; ncu's cycle counters read 1.53-1.80 GHz inside the same kernels
(bench/ncu_cta_clocks.sh, bench/NOTES.md v0.41): nvidia-smi does not see the clock's drops within
a kernel of ~100 us, so a clock that reads full here is not evidence that a kernel ran at it.
Usage (device, ~10 s): PYTHONPATH=. python bench/clock_scan.py"""
import statistics
import subprocess
import sys
import time

sys.path.insert(0, "bench")
import cupy as cp
from clocks import summarize
from cupy_moe import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm

H, I = 4096, 1408
x = cp.random.standard_normal((8192, H), dtype=cp.float32).astype(bfloat16)
wd = cp.random.standard_normal((H, I), dtype=cp.float32).astype(bfloat16)
flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
def case(T, ctas, seconds, with_flush=True):
    out = cp.empty((T, I), bfloat16)
    f = lambda: gemm(m=T, n=I, segments=[Segment(x, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False,
                     out=out, ldc=I, max_ctas=ctas)
    f(); cp.cuda.Device().synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader", "-lms", "10"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        if with_flush:
            flush.fill(1.0)
        s.record(); f(); e.record(); e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) * 1e3)
    smi.terminate()
    lines = smi.communicate()[0].strip().splitlines()[30:]  # past the idle 0.3 s
    print(f"T={T} ctas={ctas} flush={with_flush}: gemm median {statistics.median(times):.1f} us over "
          f"{len(times)}; {summarize(lines)}", flush=True)


case(6144, 132, 1.0)
case(6144, 33, 1.0)
case(6144, 132, 1.0, with_flush=False)
case(6144, 33, 1.0, with_flush=False)
case(1536, 132, 1.0)
