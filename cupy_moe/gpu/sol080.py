"""SOL-080 backward on the GPU (sol080.md): 6-8 launches over the shared GEMM engine, replayed as
one CUDA graph when a caller repeats a call on the same buffers (gpu/graphs.py).

The SwiGLU backward (steps 3-4) runs in the epilogue of d_act = g Wd, with the contract's rounding
points, writing [d_gate | d_up] rows directly (d_act is never stored); where the Hopper loop does
not apply (odd strides), d_act is stored and an elementwise kernel follows.

The contract's three dgrad products (d_up Wu, d_gate Wg, bf16(grl) Wr) run as one GEMM over the
concatenated reduction, accumulated in fp32 and rounded once (within the pass rule; the contract
rounds each to bf16 first).

The launches form a small DAG over two streams (fork/join by events, captured as graph branches):
    main: d_act GEMM (+ SwiGLU backward) ........ dgrad [d_gate | d_up | bf16(grl)] @ [Wg; Wu; Wr]
    side: router kernel, grad_Wd = g^T act, router wgrad ... grad_[Wg; Wu] = [d_gate | d_up]^T x
grad_Wd needs neither d_act nor the router, so it runs beside the d_act GEMM; when that GEMM's
tiles leave SMs free (small T), the one beside it is held to the rest (gemm's max_ctas), and
likewise grad_[Wg; Wu] beside the dgrad, so both start at once instead of queueing behind the
other. CUPY_MOE_SOL080_STREAMS=0 keeps everything on one stream.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import cupy as cp

from .. import _build, _launch
from .._arrays import bfloat16
from .._launch import grid_stride_blocks, i32, i64, ptr
from . import graphs, router
from .gemm import Segment, SwigluBackward, device_sms, gemm, k_splits_for, sm90_applies

CONCURRENT = os.environ.get("CUPY_MOE_SOL080_STREAMS", "1") != "0"
# A GEMM beside another is held to the SMs the other leaves free only when that is at least this
# many; with fewer, it takes the whole GPU and its CTAs start as the other's finish.
MIN_SHARE = 16
_side = {}  # (device, stream) -> _Side


@dataclass
class _Side:
    """The side stream of a caller's stream and the events that order the two."""

    stream: object
    fork: object
    d_act_done: object
    router_done: object
    join: object

    @classmethod
    def of(cls, main) -> "_Side":
        key = (cp.cuda.Device().id, main.ptr)
        entry = _side.get(key)
        if entry is None:
            if len(_side) >= 16:
                _side.clear()
            event = lambda: cp.cuda.Event(disable_timing=True)
            entry = _side[key] = cls(cp.cuda.Stream(non_blocking=True), event(), event(), event(),
                                     event())
        return entry


def _beside(ctas: int):
    """max_ctas for a GEMM started next to one that occupies `ctas` SMs."""
    free = device_sms() - ctas
    return free if free >= MIN_SHARE else None


@dataclass(frozen=True)
class _Plan:
    """How a call's two long-reduction GEMMs run (a function of shapes and alignment only).
    act_splits / dgrad_splits > 1: split-K into fp32 pieces summed by a small kernel (few output
    tiles at small T, gemm.k_splits_for); act_fused: else the SwiGLU backward in d_act's epilogue."""

    act_splits: int
    act_fused: bool
    dgrad_splits: int

    @classmethod
    def of(cls, g, wr, wg, wu, wd, gate):
        T, H = g.shape
        I, E = gate.shape[1], wr.shape[0]
        d_act_on_sm90 = sm90_applies(T, I, [Segment(g, H, wd, I, k=H)], True, False)
        # The dgrad's A operands live in the workspace (256-byte aligned): their offsets stand in.
        dgrad_on_sm90 = sm90_applies(T, H, [Segment(4 * I, 2 * I, wu, H, k=I), Segment(0, 2 * I, wg, H, k=I),
                                            Segment(0, E, wr, H, k=E)], True, False)
        act_splits = k_splits_for(T, I, H) if d_act_on_sm90 else 1
        return cls(act_splits=act_splits, act_fused=d_act_on_sm90 and act_splits == 1,
                   dgrad_splits=k_splits_for(T, H, 2 * I + E) if dgrad_on_sm90 else 1)


@dataclass
class _Workspace:
    """Temporaries of one call (kept with its graph when captured)."""

    d_act: object      # [T, I] bf16 (None when the SwiGLU backward runs in the GEMM's epilogue)
    act_pieces: object    # [splits, T, I] fp32 split-K pieces of d_act, or None
    dgrad_pieces: object  # [splits, T, H] fp32 split-K pieces of grad_hidden_states, or None
    d_gu: object       # [T, 2I] bf16, row t = [d_gate(t) | d_up(t)]
    hi: object         # [T, E] bf16: bf16(grl) and the rest, hi + lo = grl
    lo: object
    partial: object    # [splits, E, H] fp32 pieces of the router weight gradient, or None

    @classmethod
    def allocate(cls, T, H, I, E, plan: _Plan):
        splits = router.weight_gradient_splits(T, E, H)
        pieces = lambda n, *shape: cp.empty((n,) + shape, cp.float32) if n > 1 else None
        return cls(d_act=None if plan.act_fused or plan.act_splits > 1 else cp.empty((T, I), bfloat16),
                   act_pieces=pieces(plan.act_splits, T, I),
                   dgrad_pieces=pieces(plan.dgrad_splits, T, H),
                   d_gu=cp.empty((T, 2 * I), bfloat16),
                   hi=cp.empty((T, E), bfloat16), lo=cp.empty((T, E), bfloat16),
                   partial=pieces(splits, E, H))


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
    plan = _Plan.of(g, wr, wg, wu, wd, gate)
    graphs.run(key, lambda: _Workspace.allocate(T, H, I, E, plan),
               lambda ws: _enqueue(inputs, outputs, ws, plan), before_launch=before_launch)
    return grad_h, grad_router, grad_wgu[:I], grad_wgu[I:], grad_wd


def _enqueue(inputs, outputs, ws: _Workspace, plan: _Plan) -> None:
    x = inputs[1]
    grad_h, grad_router, grad_wgu, grad_wd = outputs
    main = cp.cuda.get_current_stream()
    side = _Side.of(main) if CONCURRENT else None
    if side is not None:
        side.fork.record(main)
        side.stream.wait_event(side.fork)
    d_act_ctas = _d_act(inputs, ws, plan)
    with side.stream if side else main:
        _router_kernel(inputs, ws)
        if side:
            side.router_done.record()
        _grad_wd(inputs, grad_wd, max_ctas=_beside(d_act_ctas) if side else None)
        router.weight_gradient(ws.hi, ws.lo, x, grad_router, ws.partial)
    if side:
        side.d_act_done.record(main)
        main.wait_event(side.router_done)
    dgrad_ctas = _dgrad(inputs, grad_h, ws, plan)
    with side.stream if side else main:
        if side:
            side.stream.wait_event(side.d_act_done)
        _grad_wgu(inputs, grad_wgu, ws, max_ctas=_beside(dgrad_ctas) if side else None)
        if side:
            side.join.record()
    if side:
        main.wait_event(side.join)


def _d_act(inputs, ws: _Workspace, plan: _Plan) -> int:
    """[d_gate | d_up] from d_act = g Wd (steps 1, 3, 4); returns the SMs it occupies."""
    g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act = inputs
    T, H = x.shape
    I = gate.shape[1]
    mod = _build.load_module("sol080.cu")
    n = T * I
    d_act = [Segment(g, H, wd, I, k=H)]
    if plan.act_splits > 1:
        ctas = gemm(m=T, n=I, segments=d_act, a_kmajor=True, b_kmajor=False, out=ws.act_pieces,
                    ldc=I, epilogue="f32", k_splits=plan.act_splits, c_group_stride=n)
        _launch.launch(mod, "sol080_swiglu_backward_pieces", (grid_stride_blocks(n),), (256,),
                       [ptr(ws.act_pieces), i32(plan.act_splits), ptr(gate), ptr(up), ptr(ws.d_gu),
                        i32(I), i64(n)])
        return ctas
    if plan.act_fused:
        d_up = ws.d_gu.data.ptr + 2 * I  # the second half of every row
        return gemm(m=T, n=I, segments=d_act, a_kmajor=True, b_kmajor=False, out=None, ldc=I,
                    epilogue="swiglu_backward", engine="sm90",
                    swiglu=SwigluBackward(gate=gate, up=up, dg=ws.d_gu, du=d_up, ld_grad=2 * I,
                                          contract_rounding=True))
    ctas = gemm(m=T, n=I, segments=d_act, a_kmajor=True, b_kmajor=False, out=ws.d_act, ldc=I)
    _launch.launch(mod, "sol080_swiglu_backward", (grid_stride_blocks(n),), (256,),
                   [ptr(ws.d_act), ptr(gate), ptr(up), ptr(ws.d_gu), i32(I), i64(n)])
    return ctas


def _router_kernel(inputs, ws: _Workspace) -> None:
    """bf16(grl) and its remainder (steps 7-10)."""
    g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act = inputs
    T, H = x.shape
    E, K = wr.shape[0], idx.shape[1]
    _launch.launch(_build.load_module("sol080.cu"), "sol080_router", (T,), (256,),
                   [ptr(g), ptr(tw), ptr(idx), ptr(mask), ptr(scores), i32(T), i32(H), i32(E),
                    i32(K), ptr(ws.hi), ptr(ws.lo)])


def _grad_wd(inputs, grad_wd, max_ctas) -> None:
    g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act = inputs
    T, H = x.shape
    I = gate.shape[1]
    gemm(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False,
         out=grad_wd, ldc=I, max_ctas=max_ctas)


def _grad_wgu(inputs, grad_wgu, ws: _Workspace, max_ctas) -> None:
    """[grad_Wg; grad_Wu] = [d_gate | d_up]^T x (step 5) as one GEMM."""
    x = inputs[1]
    T, H = x.shape
    gemm(m=grad_wgu.shape[0], n=H, segments=[Segment(ws.d_gu, grad_wgu.shape[0], x, H, k=T)],
         a_kmajor=False, b_kmajor=False, out=grad_wgu, ldc=H, max_ctas=max_ctas)


def _dgrad(inputs, grad_h, ws: _Workspace, plan: _Plan) -> int:
    """grad_hidden_states (steps 6, 12) as one GEMM over the concatenated reduction."""
    g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act = inputs
    T, H = x.shape
    I, E = gate.shape[1], wr.shape[0]
    d_up = ws.d_gu.data.ptr + 2 * I
    segments = [Segment(d_up, 2 * I, wu, H, k=I), Segment(ws.d_gu, 2 * I, wg, H, k=I),
                Segment(ws.hi, E, wr, H, k=E)]
    if plan.dgrad_splits == 1:
        return gemm(m=T, n=H, segments=segments, a_kmajor=True, b_kmajor=False, out=grad_h, ldc=H)
    n = T * H
    ctas = gemm(m=T, n=H, segments=segments, a_kmajor=True, b_kmajor=False, out=ws.dgrad_pieces,
                ldc=H, epilogue="f32", k_splits=plan.dgrad_splits, c_group_stride=n)
    _launch.launch(_build.load_module("sol080.cu"), "sum_pieces_bf16", (grid_stride_blocks(n),),
                   (256,), [ptr(ws.dgrad_pieces), i32(plan.dgrad_splits), i64(n), ptr(grad_h)])
    return ctas
