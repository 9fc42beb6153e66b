"""How much do SOL-080's small-T kernels slow each other when they share the GPU (bench/NOTES.md
v0.55)? The dgrad (64 CTAs at T = 192), grad_[Wg; Wu] and grad_Wd (K = T, ping-pong) alone, then
the dgrad beside one of them on two streams (capped to the 68 SMs the dgrad leaves), then two one
after the other. L2 flushed, events, medians of 20.
Usage (device): PYTHONPATH=. python bench/attic/small_t_side_by_side.py [T]"""
import statistics
import sys
import cupy as cp
from cupy_moe._arrays import bfloat16
from cupy_moe.gpu.gemm import Segment, gemm

rnd = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
T = int(sys.argv[1]) if len(sys.argv) > 1 else 192
A, B, C = rnd(T, 2944), rnd(2944, 4096), cp.empty((T, 4096), bfloat16)
a, x, out = rnd(T, 2816), rnd(T, 4096), cp.empty((2816, 4096), bfloat16)
wd_a, wd_b, wd_out = rnd(T, 4096), rnd(T, 1408), cp.empty((4096, 1408), bfloat16)
dgrad = lambda: gemm(m=T, n=4096, segments=[Segment(A, 2944, B, 4096, k=2944)], a_kmajor=True, b_kmajor=False, out=C, ldc=4096)
wgu = lambda ctas=0: gemm(m=2816, n=4096, segments=[Segment(a, 2816, x, 4096, k=T)], a_kmajor=False, b_kmajor=False,
                          out=out, ldc=4096, pingpong=True, max_ctas=ctas)
wdg = lambda ctas=0: gemm(m=4096, n=1408, segments=[Segment(wd_a, 4096, wd_b, 1408, k=T)], a_kmajor=False, b_kmajor=False,
                          out=wd_out, ldc=1408, pingpong=True, max_ctas=ctas)
flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
main, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
ev = [cp.cuda.Event() for _ in range(4)]

def run(first, second=None, reps=20):
    t1, t2, tall = [], [], []
    for i in range(reps + 3):
        with main:
            flush.fill(1.0)
            ev[0].record(main)
            if second is not None:
                side.wait_event(ev[0])
            first()
            ev[1].record(main)
        if second is not None:
            with side:
                second()
                ev[2].record(side)
            main.wait_event(ev[2])
        ev[3].record(main)
        ev[3].synchronize()
        if i >= 3:
            t1.append(cp.cuda.get_elapsed_time(ev[0], ev[1]) * 1e3)
            if second is not None:
                t2.append(cp.cuda.get_elapsed_time(ev[0], ev[2]) * 1e3)
            tall.append(cp.cuda.get_elapsed_time(ev[0], ev[3]) * 1e3)
    med = statistics.median
    return med(t1), (med(t2) if t2 else float("nan")), med(tall)

for _ in range(2):
    print(f"T={T}")
    print("  dgrad alone (64 CTAs)            %.1f" % run(dgrad)[0])
    print("  wgu alone, 132 / 68 CTAs          %.1f / %.1f" % (run(lambda: wgu(0))[0], run(lambda: wgu(68))[0]))
    print("  grad_Wd alone, 132 / 68 CTAs      %.1f / %.1f" % (run(lambda: wdg(0))[0], run(lambda: wdg(68))[0]))
    d, w, both = run(dgrad, lambda: wgu(68))
    print("  dgrad | wgu(68) side by side:     dgrad %.1f, wgu %.1f, both %.1f" % (d, w, both))
    d, w, both = run(dgrad, lambda: wdg(68))
    print("  dgrad | grad_Wd(68) side by side: dgrad %.1f, grad_Wd %.1f, both %.1f" % (d, w, both))
    print("  dgrad then wgu(132), one stream   %.1f" % run(lambda: (dgrad(), wgu(0)))[0])
    print("  grad_Wd(132) then wgu(132)         %.1f" % run(lambda: (wdg(0), wgu(0)))[0])
