"""SOL-080 backward on the GPU (sol080.md): 7 launches over the shared GEMM engine.

The contract's three dgrad products (d_up Wu, d_gate Wg, bf16(grl) Wr) run as one GEMM over the
concatenated reduction, accumulated in fp32 and rounded once (within the pass rule; the contract
rounds each to bf16 first).
"""
from __future__ import annotations

import cupy as cp

from .. import _build, _launch
from .._arrays import bfloat16
from .._launch import grid_stride_blocks, i32, i64, ptr
from . import router
from .gemm import Segment, gemm


def sol080_backward(g, x, wr, bias, logits, scores, idx, tw, mask, wg, wu, wd, gate, up, act):
    T, H = x.shape
    I, E, K = gate.shape[1], wr.shape[0], idx.shape[1]
    mod = _build.load_module("sol080.cu")
    grad_wgu = cp.empty((2 * I, H), bfloat16)  # [grad_Wg; grad_Wu]: one GEMM, two contiguous halves
    grad_wd = cp.empty((H, I), bfloat16)
    grad_router = cp.empty((E, H), cp.float32)
    grad_h = cp.empty((T, H), bfloat16)
    d_act = cp.empty((T, I), bfloat16)
    gemm(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False,
         out=d_act, ldc=I)
    d_gu = cp.empty((T, 2 * I), bfloat16)  # row t = [d_gate(t) | d_up(t)]
    n = T * I
    _launch.launch(mod, "sol080_swiglu_backward", (grid_stride_blocks(n),), (256,),
                   [ptr(d_act), ptr(gate), ptr(up), ptr(d_gu), i32(I), i64(n)])
    d_up = d_gu.data.ptr + 2 * I  # the second half of every row
    hi, lo = cp.empty((T, E), bfloat16), cp.empty((T, E), bfloat16)
    _launch.launch(mod, "sol080_router", (T,), (256,),
                   [ptr(g), ptr(tw), ptr(idx), ptr(mask), ptr(scores), i32(T), i32(H), i32(E),
                    i32(K), ptr(hi), ptr(lo)])

    gemm(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False,
         out=grad_wd, ldc=I)
    gemm(m=2 * I, n=H, segments=[Segment(d_gu, 2 * I, x, H, k=T)], a_kmajor=False, b_kmajor=False,
         out=grad_wgu, ldc=H)
    router.weight_gradient(hi, lo, x, grad_router)
    gemm(m=T, n=H, segments=[Segment(d_up, 2 * I, wu, H, k=I), Segment(d_gu, 2 * I, wg, H, k=I),
                             Segment(hi, E, wr, H, k=E)],
         a_kmajor=True, b_kmajor=False, out=grad_h, ldc=H)
    return grad_h, grad_router, grad_wgu[:I], grad_wgu[I:], grad_wd
