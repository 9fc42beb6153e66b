"""SOL-080's SwiGLU backward contract alone (the kernel that runs beside grad_Wd under
CUPY_MOE_SOL080_SWIGLU_SMS): the bulk-copy kernel on S blocks (one an SM) at several stage
counts, and the grid-stride elementwise kernel on the whole GPU, as GB/s of its 5 T I x 2 bytes
and per SM. L2 flushed, median of --reps; the GPU otherwise idle.
Usage (device): PYTHONPATH=. python bench/swiglu_bulk.py [--T 8192] [--reps 20]"""
import argparse

import cupy as cp

from benchmark import timer
from cupy_moe import _build, _launch, bfloat16
from cupy_moe._launch import grid_stride_blocks, i32, i64, ptr
from cupy_moe.gpu.sol080 import _swiglu_rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    measure = timer(args.reps)
    T, I, E = args.T, 1408, 128
    ld = 2 * E + 2 * I
    rand = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(bfloat16)
    d_act, gate, up = rand(T, I), rand(T, I), rand(T, I)
    acts = cp.empty((T, ld), bfloat16)
    dg = acts.data.ptr + 2 * E
    mod = _build.load_module("sol080.cu")
    nbytes = 5 * T * I * 2

    def bulk(sms, stages, threads=512):
        rows = _swiglu_rows(I, stages)
        return lambda: _launch.launch(mod, "sol080_swiglu_backward_bulk", (sms,), (threads,),
                                      [ptr(d_act), ptr(gate), ptr(up), ptr(dg), i32(I), i32(T), i64(ld),
                                       i32(rows), i32(stages), ptr(None)],
                                      shared_mem=stages * 6 * I * rows)

    n = T * I
    rows = [("elementwise, whole GPU", 132,
             lambda: _launch.launch(mod, "sol080_swiglu_backward", (grid_stride_blocks(n),), (256,),
                                    [ptr(d_act), ptr(gate), ptr(up), ptr(dg), i32(I), i64(n), i64(ld), ptr(None)]))]
    for sms in (8, 14, 28, 66, 132):
        for stages in (3, 6):
            rows.append((f"bulk S={sms} stages={stages}", sms, bulk(sms, stages)))
    rows.append(("bulk S=14 stages=6 1024 thr", 14, bulk(14, 6, 1024)))
    for name, sms, run in rows:
        us = measure(run)
        print(f"{name:>30}: {us:8.1f} us  {nbytes / us / 1e3:7.0f} GB/s  {nbytes / us / 1e3 / sms:6.1f} GB/s/SM",
              flush=True)


if __name__ == "__main__":
    main()
