"""Does a CUDA graph honor per-launch priorities (bench/NOTES.md v0.55)? CuPy instantiates captured
graphs with flags 0, and a graph so instantiated runs every node at its stream's priority; with
CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY (8) it uses each node's own. A: 3 waves of one
block an SM (50 us each) at the least priority; on another branch C (one 10 us block) then B (a
block an SM, 5 us each) at the greatest. Honored: C starts as A's first wave ends, B before A's
third wave. Eager, graph flags 0, graph flags 8.
Usage (device): python bench/attic/graph_priority_probe.py"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import cupy as cp  # noqa: E402
from cupy_backends.cuda.api import runtime  # noqa: E402

from cupy_moe._launch import _LaunchAttribute as Attr, _LaunchConfig as Cfg  # noqa: E402

SRC = r'''
extern "C" __global__ void spin(long long ns, unsigned long long* starts) {
  extern __shared__ char big[];
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) { starts[blockIdx.x] = t0; big[0] = 1; }
  unsigned long long t;
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);
}'''
k = cp.RawKernel(SRC, "spin")
k.max_dynamic_shared_size_bytes = 160 * 1024
fn = k.kernel.ptr
cuda = ctypes.CDLL("libcuda.so.1")

lo, hi = ctypes.c_int(), ctypes.c_int()

def launch(stream, blocks, ns, starts, prio):
    a = (Attr * 1)()
    a[0].id = 8  # CU_LAUNCH_ATTRIBUTE_PRIORITY
    a[0].value[0] = prio
    c = Cfg((ctypes.c_uint * 3)(blocks, 1, 1), (ctypes.c_uint * 3)(128, 1, 1), 160 * 1024, stream.ptr, a, 1)
    ns_ = ctypes.c_longlong(ns)
    p = ctypes.c_void_p(starts.data.ptr)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ns_), ctypes.addressof(p))
    st = cuda.cuLaunchKernelEx(ctypes.byref(c), ctypes.c_void_p(fn), params, None)
    assert st == 0, st

SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
A_s, B_s, C_s = (cp.zeros(3 * SMS, cp.uint64), cp.zeros(SMS, cp.uint64), cp.zeros(1, cp.uint64))
assert cuda.cuCtxGetStreamPriorityRange(ctypes.byref(lo), ctypes.byref(hi)) == 0
pmin, pmax = lo.value, hi.value  # least, greatest
print('priority range', pmin, pmax)
S1, S2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

def enqueue(main):
    s1, s2 = S1, S2
    ev = cp.cuda.Event(disable_timing=True)
    ev.record(main); s1.wait_event(ev); s2.wait_event(ev)
    launch(s1, 3 * SMS, 50_000, A_s, pmin)
    launch(s2, 1, 10_000, C_s, pmax)
    launch(s2, SMS, 5_000, B_s, pmax)
    e1, e2 = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
    e1.record(s1); e2.record(s2); main.wait_event(e1); main.wait_event(e2)
    return s1, s2

def report(tag):
    cp.cuda.Device().synchronize()
    t0 = int(min(A_s.min(), C_s.min()))
    a = (A_s.get().astype("int64") - t0) / 1e3
    b = (B_s.get().astype("int64") - t0) / 1e3
    import numpy as np
    print(f"{tag:<28} C {(int(C_s[0]) - t0) / 1e3:6.1f}  B starts {np.min(b):6.1f}..{np.max(b):6.1f} us  "
          f"A waves start at {np.percentile(a, 10):6.1f} / {np.percentile(a, 50):6.1f} / {np.percentile(a, 90):6.1f}")

main = cp.cuda.Stream(non_blocking=True)
with main:
    keep = enqueue(main)
    report("eager")
    for flags in (0, 8):
        cap = cp.cuda.Stream(non_blocking=True)
        cap.begin_capture()
        with cap:
            keep = enqueue(cap)
        g = runtime.streamEndCapture(cap.ptr)
        ex = ctypes.c_void_p()
        st = cuda.cuGraphInstantiateWithFlags(ctypes.byref(ex), ctypes.c_void_p(g), ctypes.c_ulonglong(flags))
        assert st == 0, st
        for rep in range(2):
            st = cuda.cuGraphLaunch(ex, ctypes.c_void_p(main.ptr))
            assert st == 0, st
            report(f"graph flags={flags} rep {rep}")
