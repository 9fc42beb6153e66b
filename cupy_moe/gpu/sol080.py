"""SOL-080 backward on the GPU (sol080.md): 6-8 launches over the shared GEMM engine, replayed as
one CUDA graph when a caller repeats a call on the same buffers (gpu/graphs.py).

The SwiGLU backward (steps 3-4) runs in the epilogue of d_act = g Wd, with the contract's rounding
points, writing [d_gate | d_up] rows directly (d_act is never stored); where the Hopper loop does
not apply (odd strides), d_act is stored and an elementwise kernel follows.

The contract's three dgrad products (d_up Wu, d_gate Wg, bf16(grl) Wr) run as one GEMM over the
concatenated reduction, accumulated in fp32 and rounded once (within the pass rule; the contract
rounds each to bf16 first).

Once [d_gate | d_up] and bf16(grl) exist, the dgrad and the router weight gradient run on a side
stream next to the two expert weight gradients (fork/join by events, captured as two graph
branches), so each fills the SMs the other's last wave leaves idle; CUPY_MOE_SOL080_STREAMS=0
keeps everything on one stream.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import cupy as cp

from .. import _build, _launch
from .._arrays import bfloat16
from .._launch import grid_stride_blocks, i32, i64, ptr
from . import graphs, router
from .gemm import Segment, SwigluBackward, gemm, sm90_applies

CONCURRENT = os.environ.get("CUPY_MOE_SOL080_STREAMS", "1") != "0"
_side = {}  # (device, stream) -> (side stream, fork event, join event)


def _side_stream(main):
    key = (cp.cuda.Device().id, main.ptr)
    entry = _side.get(key)
    if entry is None:
        if len(_side) >= 16:
            _side.clear()
        entry = _side[key] = (cp.cuda.Stream(non_blocking=True),
                              cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True))
    return entry


@dataclass
class _Workspace:
    """Temporaries of one call (kept with its graph when captured)."""

    d_act: object      # [T, I] bf16 (None when the SwiGLU backward runs in the GEMM's epilogue)
    d_gu: object       # [T, 2I] bf16, row t = [d_gate(t) | d_up(t)]
    hi: object         # [T, E] bf16: bf16(grl) and the rest, hi + lo = grl
    lo: object
    partial: object    # [splits, E, H] fp32 pieces of the router weight gradient, or None

    @classmethod
    def allocate(cls, T, H, I, E, fused):
        splits = router.weight_gradient_splits(T, E, H)
        return cls(d_act=None if fused else cp.empty((T, I), bfloat16),
                   d_gu=cp.empty((T, 2 * I), bfloat16),
                   hi=cp.empty((T, E), bfloat16), lo=cp.empty((T, E), bfloat16),
                   partial=cp.empty((splits, E, H), cp.float32) if splits > 1 else None)


def sol080_backward(g, x, wr, bias, logits, scores, idx, tw, mask, wg, wu, wd, gate, up, act,
                    before_launch=None):
    """before_launch: called once the outputs are allocated, before any launch (the pending
    top-k index check completes there, while nothing of this call has run)."""
    T, H = x.shape
    I, E = gate.shape[1], wr.shape[0]
    grad_wgu = cp.empty((2 * I, H), bfloat16)  # [grad_Wg; grad_Wu]: one GEMM, two contiguous halves
    grad_wd = cp.empty((H, I), bfloat16)
    grad_router = cp.empty((E, H), cp.float32)
    grad_h = cp.empty((T, H), bfloat16)
    inputs = (g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act)
    outputs = (grad_h, grad_router, grad_wgu, grad_wd)
    key = ("sol080", T, H, I, E, idx.shape[1]) + tuple(a.data.ptr for a in inputs + outputs)
    if before_launch is not None:
        before_launch()
    fused = sm90_applies(T, I, [Segment(g, H, wd, I, k=H)], True, False)
    graphs.run(key, lambda: _Workspace.allocate(T, H, I, E, fused),
               lambda ws: _enqueue(inputs, outputs, ws))
    return grad_h, grad_router, grad_wgu[:I], grad_wgu[I:], grad_wd


def _enqueue(inputs, outputs, ws: _Workspace) -> None:
    g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act = inputs
    grad_h, grad_router, grad_wgu, grad_wd = outputs
    T, H = x.shape
    I, E, K = gate.shape[1], wr.shape[0], idx.shape[1]
    mod = _build.load_module("sol080.cu")
    d_up = ws.d_gu.data.ptr + 2 * I  # the second half of every row
    if ws.d_act is None:
        gemm(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False,
             out=None, ldc=I, epilogue="swiglu_backward", engine="sm90",
             swiglu=SwigluBackward(gate=gate, up=up, dg=ws.d_gu, du=d_up, ld_grad=2 * I,
                                   contract_rounding=True))
    else:
        gemm(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False,
             out=ws.d_act, ldc=I)
        n = T * I
        _launch.launch(mod, "sol080_swiglu_backward", (grid_stride_blocks(n),), (256,),
                       [ptr(ws.d_act), ptr(gate), ptr(up), ptr(ws.d_gu), i32(I), i64(n)])
    _launch.launch(mod, "sol080_router", (T,), (256,),
                   [ptr(g), ptr(tw), ptr(idx), ptr(mask), ptr(scores), i32(T), i32(H), i32(E),
                    i32(K), ptr(ws.hi), ptr(ws.lo)])
    main = cp.cuda.get_current_stream()
    side, fork, join = _side_stream(main) if CONCURRENT else (main, None, None)
    if fork is not None:
        fork.record(main)
        side.wait_event(fork)
    with side:  # dgrad and the router weight gradient (the main stream when not CONCURRENT)
        gemm(m=T, n=H, segments=[Segment(d_up, 2 * I, wu, H, k=I), Segment(ws.d_gu, 2 * I, wg, H, k=I),
                                 Segment(ws.hi, E, wr, H, k=E)],
             a_kmajor=True, b_kmajor=False, out=grad_h, ldc=H)
        router.weight_gradient(ws.hi, ws.lo, x, grad_router, ws.partial)
    gemm(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False,
         out=grad_wd, ldc=I)
    gemm(m=2 * I, n=H, segments=[Segment(ws.d_gu, 2 * I, x, H, k=T)], a_kmajor=False,
         b_kmajor=False, out=grad_wgu, ldc=H)
    if join is not None:
        join.record(side)
        main.wait_event(join)
