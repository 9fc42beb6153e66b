"""The full MoE layer on the GPU: the data flow of design/architecture.md over our kernels.

Rounding points are those documented in cupy_moe/reference/layer.py. The stages are split so the
expert-parallel layer (cupy_moe/parallel/gpu_layer.py) runs the same code around its exchanges:
routing and the combine on the tokens' side, experts_forward / experts_backward on rows grouped by
expert, backward_tail (router and shared expert) on the tokens' side again.
"""
from __future__ import annotations

import os
from functools import partial

import cupy as cp

from .._arrays import bfloat16
from ..context import MoEContext, MoEGradients
from . import elementwise, router, routing
from .gemm import Segment, SwigluBackward, device_sms, gemm, sm90_applies, transposed_applies
from .side_by_side import beside, free_sms, gemm_rate, side_by_side

# Each expert's dWd [H, I] as (aw^T dy)^T, stored transposed (gemm(out_transposed)): I = 1408
# rows in 11 tiles of 128 and H = 4096 columns in 16 of 256, instead of 128 x 256 tiles over
# n = 1408 whose last column is half empty. The same bits; the layer backward at T = 8192 10.67
# vs 10.80 ms (three paired rounds; bench/NOTES.md v0.11). The shared expert's dWsd the same way
# (its 176 tiles then fit beside [dWsg; dWsu]'s 352 in whole rounds). CUPY_MOE_LAYER_DWD_TRANSPOSED=0
# turns both off (the whole GPU suite passed with it on: v0.12, v0.15).
DWD_TRANSPOSED = os.environ.get("CUPY_MOE_LAYER_DWD_TRANSPOSED", "1") != "0"
# The backward's two memory-bound row moves run on a few SMs beside a GEMM (side_by_side.beside:
# the SMs split so both take about as long): the scatter of dy into the experts' order beside the
# shared expert's d_act, which reads dy in token order (the call's span -30..-60 us at T = 8192),
# and the combine beside the routed dWg, which runs after the tokens' side for it (-30..-50 us;
# traced calls, bench/NOTES.md v0.23-v0.24). The same bits either way. CUPY_MOE_LAYER_BESIDE=0:
# one after the other (dWg still runs last).
BESIDE = os.environ.get("CUPY_MOE_LAYER_BESIDE", "1") != "0"


def experts_forward(x_rows, offsets, num_experts, wg, wu, wd):
    """Routed experts on rows grouped by expert (expert e owns rows offsets[e]:offsets[e+1]):
    (gate, up, act, y_rows), each [rows, I] bf16 but y_rows [rows, H]."""
    N, H = x_rows.shape
    I = wg.shape[1]
    grouped = dict(grouping="m", group_offsets=offsets, num_groups=num_experts)
    gate, up = cp.empty((N, I), bfloat16), cp.empty((N, I), bfloat16)
    for weight, out in ((wg, gate), (wu, up)):
        gemm(m=N, n=I, segments=[Segment(x_rows, H, weight, H, k=H, b_group_stride=I * H)],
             a_kmajor=True, b_kmajor=True, out=out, ldc=I, **grouped)
    act = elementwise.swiglu_forward(gate, up)
    y_rows = cp.empty((N, H), bfloat16)
    gemm(m=N, n=H, segments=[Segment(act, I, wd, I, k=I, b_group_stride=H * I)],
         a_kmajor=True, b_kmajor=True, out=y_rows, ldc=H, **grouped)
    return gate, up, act, y_rows


def experts_backward(x_rows, dy_rows, gate, up, act, offsets, num_experts, wg, wu, wd, weights,
                     row_index=None):
    """Backward of experts_forward given dL/dy of each row (unweighted: the routing weight of row
    r is weights[row_index[r]], or weights[r]). Returns (dw_rows [rows] fp32 = <da', a>, dx_rows
    [rows, H] bf16, d_gate_w, d_up_w, d_down_w)."""
    dw_rows, dx_rows, (dg, du, aw) = experts_data_backward(dy_rows, gate, up, act, offsets, num_experts,
                                                           wg, wu, wd, weights, row_index)
    grads = []
    for grad, call in (input_weight_grad(dg, x_rows, offsets, num_experts),
                       input_weight_grad(du, x_rows, offsets, num_experts),
                       down_weight_grad(dy_rows, aw, offsets, num_experts)):
        gemm(**call)
        grads.append(grad)
    return (dw_rows, dx_rows, *grads)  # d_gate_w, d_up_w, d_down_w


def experts_data_backward(dy_rows, gate, up, act, offsets, num_experts, wg, wu, wd, weights, row_index=None):
    """experts_backward's data gradients: (dw_rows, dx_rows, (dg, du, aw)), the last for the
    weight gradients (down_weight_grad, input_weight_grad)."""
    N, H = dy_rows.shape
    I = wg.shape[1]
    m_grouped = dict(grouping="m", group_offsets=offsets, num_groups=num_experts)
    # da' = dy Wd per expert, never stored: the GEMM's epilogue turns it into dg, du,
    # aw = bf16(w a) and dw = <da', a> per row (the SwiGLU backward).
    dg, du, aw = (cp.empty((N, I), bfloat16) for _ in range(3))
    dw_rows = cp.empty(N, cp.float32)
    gemm(m=N, n=I, segments=[Segment(dy_rows, H, wd, I, k=H, b_group_stride=H * I)],
         a_kmajor=True, b_kmajor=False, out=None, ldc=I, epilogue="swiglu_backward",
         swiglu=SwigluBackward(gate=gate, up=up, dg=dg, du=du, act=act, weights=weights,
                               row_index=row_index, aw=aw, dw=dw_rows),
         **m_grouped)
    # dgrad: [dg | du] @ [Wg; Wu] per expert.
    dx_rows = cp.empty((N, H), bfloat16)
    gemm(m=N, n=H, segments=[Segment(dg, I, wg, H, k=I, b_group_stride=I * H),
                             Segment(du, I, wu, H, k=I, b_group_stride=I * H)],
         a_kmajor=True, b_kmajor=False, out=dx_rows, ldc=H, **m_grouped)
    return dw_rows, dx_rows, (dg, du, aw)


def down_weight_grad(dy_rows, aw, offsets, num_experts):
    """Each expert's dWd [H, I] = dy^T aw over its own rows (empty experts write zeros): the
    gradient, allocated, and the gemm() call that writes it."""
    N, H = dy_rows.shape
    I, E = aw.shape[1], num_experts
    d_down_w = cp.empty((E, H, I), bfloat16)
    k_grouped = dict(grouping="k", group_offsets=offsets, num_groups=E)
    transposed = [Segment(aw, I, dy_rows, H, k=N)]
    if DWD_TRANSPOSED and transposed_applies(I, H, transposed, False, False, d_down_w, I, H * I, "k"):
        return d_down_w, dict(m=I, n=H, segments=transposed, a_kmajor=False, b_kmajor=False, out=d_down_w,
                              ldc=I, c_group_stride=H * I, out_transposed=True, **k_grouped)
    return d_down_w, dict(m=H, n=I, segments=[Segment(dy_rows, H, aw, I, k=N)], a_kmajor=False,
                          b_kmajor=False, out=d_down_w, ldc=I, c_group_stride=H * I, **k_grouped)


def input_weight_grad(d, x_rows, offsets, num_experts):
    """Each expert's dWg (d = dg) or dWu (d = du) [I, H] = d^T x over its own rows (empty experts
    write zeros): the gradient, allocated, and the gemm() call that writes it."""
    N, H = x_rows.shape
    I, E = d.shape[1], num_experts
    out = cp.empty((E, I, H), bfloat16)
    return out, dict(m=I, n=H, segments=[Segment(d, I, x_rows, H, k=N)], a_kmajor=False, b_kmajor=False,
                     out=out, ldc=H, c_group_stride=I * H, grouping="k", group_offsets=offsets, num_groups=E)


def shared_forward(x, wg, wu, wd):
    T, H = x.shape
    Is = wg.shape[0]
    g, u = cp.empty((T, Is), bfloat16), cp.empty((T, Is), bfloat16)
    for w, out in ((wg, g), (wu, u)):
        gemm(m=T, n=Is, segments=[Segment(x, H, w, H, k=H)], a_kmajor=True, b_kmajor=True, out=out, ldc=Is)
    a = elementwise.swiglu_forward(g, u)
    y = cp.empty((T, H), bfloat16)
    gemm(m=T, n=H, segments=[Segment(a, Is, wd, Is, k=Is)], a_kmajor=True, b_kmajor=True, out=y, ldc=H)
    return g, u, a, y


def forward(x, wr, bias, wg, wu, wd, wsg, wsu, wsd, config):
    E = config.n_routed_experts
    scores, idx, w = router.forward(x, wr, bias, config)
    r = routing.sort(idx, E)
    x_sorted = elementwise.rows_by_expert(x, r.slot_rows, config.num_experts_per_tok)
    gate, up, act, y_sorted = experts_forward(x_sorted, r.expert_offsets, E, wg, wu, wd)
    return finish_forward((x, wr, wg, wu, wd, wsg, wsu, wsd), config, (scores, idx, w, r), y_sorted,
                          (gate, up, act), sorted_hidden_states=x_sorted)


def finish_forward(inputs, config, routed, y_sorted, saved, **extra):
    """The tokens' side of the forward once the routed experts' rows are back in the sorted order:
    the shared expert, the weighted combine and the context. inputs: (x, router weight, the three
    expert weights, the three shared ones); routed: (scores, topk indices, topk weights, the
    routing.Routing); saved: (gate, up, act) rows, or Nones where the experts keep them
    (expert parallel); extra: MoEContext's optional fields."""
    x, wr, wg, wu, wd, wsg, wsu, wsd = inputs
    scores, idx, w, r = routed
    shared, y_shared = (None, None, None), None
    if config.n_shared_experts:
        *shared, y_shared = shared_forward(x, wsg, wsu, wsd)
    out = elementwise.combine_forward(y_sorted, r.slot_rows, w, y_shared)
    ctx = MoEContext(
        config=config, hidden_states=x, router_weight=wr, expert_gate_weight=wg,
        expert_up_weight=wu, expert_down_weight=wd, shared_expert_gate_weight=wsg,
        shared_expert_up_weight=wsu, shared_expert_down_weight=wsd, scores=scores,
        topk_indices=idx, topk_weights=w, tokens_per_expert=r.tokens_per_expert,
        expert_offsets=r.expert_offsets, sorted_slots=r.sorted_slots, slot_rows=r.slot_rows,
        gate=saved[0], up=saved[1], act=saved[2], shared_gate=shared[0], shared_up=shared[1],
        shared_act=shared[2], **extra)
    return out, ctx


def backward(dy, ctx: MoEContext) -> MoEGradients:
    x = ctx.hidden_states
    E, K = ctx.config.n_routed_experts, ctx.config.num_experts_per_tok
    slots = ctx.sorted_slots
    # Token rows in the experts' order, so every grouped GEMM reads plain rows (x's from the
    # forward); the scatter runs beside the shared expert's d_act, which reads dy in token order.
    dy_sorted = cp.empty((dy.shape[0] * K, dy.shape[1]), dy.dtype)
    scatter = partial(elementwise.rows_by_expert, dy, ctx.slot_rows, K, out=dy_sorted)
    shared_d = None
    if ctx.config.n_shared_experts:
        d_act, shared_d = _shared_d_act(dy, ctx)
        _gemm_beside(d_act, scatter, dy.nbytes + dy_sorted.nbytes)
    else:
        scatter()
    x_sorted = ctx.sorted_hidden_states
    if x_sorted is None:
        x_sorted = elementwise.rows_by_expert(x, ctx.slot_rows, K)
    dw_sorted, dx_sorted, (dg, du, aw) = experts_data_backward(
        dy_sorted, ctx.gate, ctx.up, ctx.act, ctx.expert_offsets, E, ctx.expert_gate_weight,
        ctx.expert_up_weight, ctx.expert_down_weight, weights=ctx.topk_weights, row_index=slots)
    # dWd and dWu now, each gradient allocated as its GEMM is queued and what it alone reads
    # dropped after it, so fewer arrays are live at once; dWg waits for the tokens' side, to run
    # beside the combine (backward_tail): of what it reads only dg outlives the rest (x_sorted is
    # ctx's). (dWg last against all three last: call span -20..-30 us, bench/NOTES.md v0.24.)
    d_down_w, call = down_weight_grad(dy_sorted, aw, ctx.expert_offsets, E)
    gemm(**call)
    del dy_sorted, aw, call
    d_up_w, call = input_weight_grad(du, x_sorted, ctx.expert_offsets, E)
    gemm(**call)
    del du, call
    d_gate_w, last = input_weight_grad(dg, x_sorted, ctx.expert_offsets, E)
    del dg, x_sorted
    return backward_tail(dy, ctx, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w, shared_d, last)


def _flop(call: dict) -> float:
    """A gemm() call's multiply-adds x 2."""
    return 2.0 * call["m"] * call["n"] * sum(s.k for s in call["segments"])


def _gemm_beside(call: dict, kernel, kernel_bytes: int) -> None:
    """gemm(**call) with kernel(), a memory-bound kernel moving kernel_bytes, on the SMs free_sms
    leaves it (BESIDE; else, or where it is too short, one after the other)."""
    free = free_sms(kernel_bytes, _flop(call), device_sms(), gemm_rate(call)) if BESIDE else 0
    beside(lambda sms: gemm(**call, max_ctas=sms), kernel, free)


def _shared_d_act(dy, ctx: MoEContext):
    """The shared expert's d_act GEMM (its SwiGLU backward in the epilogue), not launched: the
    gemm() keywords and (dgs, dus, dgu, ld) it writes. dgs and dus sit side by side in one
    [T, 2 Is] array dgu (the epilogue's ld_grad) where the Hopper loop applies, so [dWsg; dWsu]
    = [dgs | dus]^T x is one GEMM of 2 Is rows (_shared_weight_grads); else dgu is None."""
    T, H = dy.shape
    Is = ctx.shared_expert_gate_weight.shape[0]
    d_act = [Segment(dy, H, ctx.shared_expert_down_weight, Is, k=H)]
    stacked = sm90_applies(T, Is, d_act, True, False) and Is % 8 == 0  # ld_grad: the Hopper loop
    if stacked:
        dgu = cp.empty((T, 2 * Is), bfloat16)
        dgs, dus = dgu[:, :Is], dgu[:, Is:]
    else:
        dgu, dgs, dus = None, cp.empty((T, Is), bfloat16), cp.empty((T, Is), bfloat16)
    ld = 2 * Is if stacked else Is
    call = dict(m=T, n=Is, segments=d_act, a_kmajor=True, b_kmajor=False, out=None, ldc=Is,
                epilogue="swiglu_backward",
                swiglu=SwigluBackward(gate=ctx.shared_gate, up=ctx.shared_up, dg=dgs, du=dus,
                                      ld_grad=ld if stacked else 0))
    return call, (dgs, dus, dgu, ld)


def _shared_weight_grads(dy, ctx: MoEContext, shared_d):
    """The shared expert's weight gradients (dWsg, dWsu, dWsd) from its d_act results: [dWsg;
    dWsu] beside dWsd (side_by_side: at T = 8192, 352 + 176 tiles in 4 rounds instead of 3 + 2)
    where dgs and dus are stacked."""
    x = ctx.hidden_states
    T, H = x.shape
    dgs, dus, dgu, _ = shared_d
    Is = dgs.shape[1]
    d_wsd = cp.empty((H, Is), bfloat16)
    down = [Segment(ctx.shared_act, Is, dy, H, k=T)]  # dWsd = (act^T dy)^T, as the routed dWd
    if DWD_TRANSPOSED and transposed_applies(Is, H, down, False, False, d_wsd, Is):
        wd_grad = dict(m=Is, n=H, segments=down, out_transposed=True)
    else:
        wd_grad = dict(m=H, n=Is, segments=[Segment(dy, H, ctx.shared_act, Is, k=T)])
    wd_grad.update(a_kmajor=False, b_kmajor=False, out=d_wsd, ldc=Is)
    if dgu is not None:
        d_wsgu = cp.empty((2 * Is, H), bfloat16)
        side_by_side(dict(m=2 * Is, n=H, segments=[Segment(dgu, 2 * Is, x, H, k=T)], a_kmajor=False,
                          b_kmajor=False, out=d_wsgu, ldc=H), wd_grad)
        return d_wsgu[:Is], d_wsgu[Is:], d_wsd
    d_wsg, d_wsu = cp.empty((Is, H), bfloat16), cp.empty((Is, H), bfloat16)
    gemm(**wd_grad)
    for d, out in ((dgs, d_wsg), (dus, d_wsu)):
        gemm(m=Is, n=H, segments=[Segment(d, Is, x, H, k=T)], a_kmajor=False, b_kmajor=False, out=out, ldc=H)
    return d_wsg, d_wsu, d_wsd


def backward_tail(dy, ctx: MoEContext, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w, shared_d=None,
                  wgrad=None):
    """The tokens' side of the backward, given the routed experts' dx rows and dw = <da', a> in
    the sorted order: the router, the shared expert and dx. shared_d: the shared expert's d_act
    results (_shared_d_act) where the caller already ran it; wgrad: the gemm() call of a routed
    weight gradient that the caller left to run here, beside the combine."""
    cfg = ctx.config
    x = ctx.hidden_states
    T, H = x.shape
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    # Router: dlogits as bf16 hi + lo, so both router GEMMs run on the tensor cores.
    grl = router.backward_logits(dw_sorted, ctx.slot_rows, ctx.scores, ctx.topk_indices,
                                 ctx.topk_weights, cfg)  # [T, 2E]: [hi | lo]
    d_router_w = cp.empty((E, H), cp.float32)
    router.weight_gradient(grl, x, d_router_w)
    dx_segments = [Segment(half, 2 * E, ctx.router_weight, H, k=E) for half in router.hi_lo(grl)]

    shared = (None, None, None)
    if cfg.n_shared_experts:
        if shared_d is None:
            d_act, shared_d = _shared_d_act(dy, ctx)
            gemm(**d_act)
        shared = _shared_weight_grads(dy, ctx, shared_d)
        dgs, dus, _, ld = shared_d
        dx_segments += [Segment(dgs, ld, ctx.shared_expert_gate_weight, H, k=dgs.shape[1]),
                        Segment(dus, ld, ctx.shared_expert_up_weight, H, k=dus.shape[1])]
    # Everything but the routed rows in one fp32 GEMM: [hi | lo | dgs | dus] @ [Wr; Wr; Wsg; Wsu].
    dx_rest = cp.empty((T, H), cp.float32)
    gemm(m=T, n=H, segments=dx_segments, a_kmajor=True, b_kmajor=False, out=dx_rest, ldc=H,
         epilogue="f32")
    # The combine on a few SMs beside the weight gradient, whose 22K tiles (at T = 8192) are
    # spread over the rest by the tile claims: both take about as long.
    dx = cp.empty((T, H), bfloat16)
    combine = partial(elementwise.combine_backward, dx_sorted, ctx.slot_rows, dx_rest, K, out=dx)
    if wgrad is not None:
        _gemm_beside(wgrad, combine, dx_sorted.nbytes + dx_rest.nbytes + dx.nbytes)
    else:
        combine()
    return MoEGradients(hidden_states=dx, router_weight=d_router_w, expert_gate_weight=d_gate_w,
                        expert_up_weight=d_up_w, expert_down_weight=d_down_w,
                        shared_expert_gate_weight=shared[0], shared_expert_up_weight=shared[1],
                        shared_expert_down_weight=shared[2])
