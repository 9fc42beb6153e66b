"""The full MoE layer on the GPU: the data flow of design/architecture.md over our kernels.

Rounding points are those documented in cupy_moe/reference/layer.py. The stages are split so the
expert-parallel layer (cupy_moe/parallel/gpu_layer.py) runs the same code around its exchanges:
routing and the combine on the tokens' side, experts_forward / experts_backward on rows grouped by
expert, backward_tail (router and shared expert) on the tokens' side again.
"""
from __future__ import annotations

import os

import cupy as cp

from .._arrays import bfloat16
from ..context import MoEContext, MoEGradients
from . import elementwise, router, routing
from .gemm import Segment, SwigluBackward, gemm, sm90_applies, transposed_applies
from .side_by_side import side_by_side

# Each expert's dWd [H, I] as (aw^T dy)^T, stored transposed (gemm(out_transposed)): I = 1408
# rows in 11 tiles of 128 and H = 4096 columns in 16 of 256, instead of 128 x 256 tiles over
# n = 1408 whose last column is half empty. The same bits; the layer backward at T = 8192 10.67
# vs 10.80 ms (three paired rounds; bench/NOTES.md v0.11). The shared expert's dWsd the same way
# (its 176 tiles then fit beside [dWsg; dWsu]'s 352 in whole rounds). CUPY_MOE_LAYER_DWD_TRANSPOSED=0
# turns both off (the whole GPU suite passed with it on: v0.12, v0.15).
DWD_TRANSPOSED = os.environ.get("CUPY_MOE_LAYER_DWD_TRANSPOSED", "1") != "0"


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
    N, H = x_rows.shape
    I = wg.shape[1]
    E = num_experts
    m_grouped = dict(grouping="m", group_offsets=offsets, num_groups=E)
    k_grouped = dict(grouping="k", group_offsets=offsets, num_groups=E)
    # da' = dy Wd per expert, never stored: the GEMM's epilogue turns it into dg, du,
    # aw = bf16(w a) and dw = <da', a> per row (the SwiGLU backward).
    dg, du, aw = (cp.empty((N, I), bfloat16) for _ in range(3))
    dw_rows = cp.empty(N, cp.float32)
    gemm(m=N, n=I, segments=[Segment(dy_rows, H, wd, I, k=H, b_group_stride=H * I)],
         a_kmajor=True, b_kmajor=False, out=None, ldc=I, epilogue="swiglu_backward",
         swiglu=SwigluBackward(gate=gate, up=up, dg=dg, du=du, act=act, weights=weights,
                               row_index=row_index, aw=aw, dw=dw_rows),
         **m_grouped)
    # Weight gradients: each expert reduces over its own rows (empty experts write zeros).
    d_down_w = cp.empty((E, H, I), bfloat16)
    transposed = [Segment(aw, I, dy_rows, H, k=N)]
    if DWD_TRANSPOSED and transposed_applies(I, H, transposed, False, False, d_down_w, I, H * I, "k"):
        gemm(m=I, n=H, segments=transposed, a_kmajor=False, b_kmajor=False, out=d_down_w, ldc=I,
             c_group_stride=H * I, out_transposed=True, **k_grouped)
    else:
        gemm(m=H, n=I, segments=[Segment(dy_rows, H, aw, I, k=N)], a_kmajor=False, b_kmajor=False,
             out=d_down_w, ldc=I, c_group_stride=H * I, **k_grouped)
    del aw
    d_gate_w, d_up_w = cp.empty((E, I, H), bfloat16), cp.empty((E, I, H), bfloat16)
    for d, out in ((dg, d_gate_w), (du, d_up_w)):
        gemm(m=I, n=H, segments=[Segment(d, I, x_rows, H, k=N)], a_kmajor=False, b_kmajor=False,
             out=out, ldc=H, c_group_stride=I * H, **k_grouped)
    # dgrad: [dg | du] @ [Wg; Wu] per expert.
    dx_rows = cp.empty((N, H), bfloat16)
    gemm(m=N, n=H, segments=[Segment(dg, I, wg, H, k=I, b_group_stride=I * H),
                             Segment(du, I, wu, H, k=I, b_group_stride=I * H)],
         a_kmajor=True, b_kmajor=False, out=dx_rows, ldc=H, **m_grouped)
    return dw_rows, dx_rows, d_gate_w, d_up_w, d_down_w


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
    E = ctx.config.n_routed_experts
    slots = ctx.sorted_slots
    # Token rows in the experts' order, so every grouped GEMM reads plain rows (x's from the
    # forward).
    dy_sorted = elementwise.rows_by_expert(dy, ctx.slot_rows, ctx.config.num_experts_per_tok)
    x_sorted = ctx.sorted_hidden_states
    if x_sorted is None:
        x_sorted = elementwise.rows_by_expert(x, ctx.slot_rows, ctx.config.num_experts_per_tok)
    dw_sorted, dx_sorted, d_gate_w, d_up_w, d_down_w = experts_backward(
        x_sorted, dy_sorted, ctx.gate, ctx.up, ctx.act, ctx.expert_offsets, E,
        ctx.expert_gate_weight, ctx.expert_up_weight, ctx.expert_down_weight,
        weights=ctx.topk_weights, row_index=slots)
    del dy_sorted, x_sorted
    return backward_tail(dy, ctx, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w)


def _shared_backward(dy, ctx: MoEContext):
    """The shared expert's weight gradients (dWsg, dWsu, dWsd) and its dx as GEMM segments
    [dgs @ Wsg, dus @ Wsu]. dgs and dus sit side by side in one [T, 2 Is] array (the SwiGLU
    epilogue's ld_grad), so [dWsg; dWsu] = [dgs | dus]^T x is one GEMM of 2 Is rows (dWsg and
    dWsu are its two halves, each C-contiguous), and it runs beside dWsd (side_by_side: at
    T = 8192, 352 + 176 tiles in 4 rounds instead of 3 + 2)."""
    x = ctx.hidden_states
    T, H = x.shape
    wsg, wsu, wsd = (ctx.shared_expert_gate_weight, ctx.shared_expert_up_weight,
                     ctx.shared_expert_down_weight)
    Is = wsg.shape[0]
    d_act = [Segment(dy, H, wsd, Is, k=H)]
    stacked = sm90_applies(T, Is, d_act, True, False) and Is % 8 == 0  # ld_grad: the Hopper loop
    if stacked:
        dgu = cp.empty((T, 2 * Is), bfloat16)
        dgs, dus = dgu[:, :Is], dgu[:, Is:]
    else:
        dgs, dus = cp.empty((T, Is), bfloat16), cp.empty((T, Is), bfloat16)
    ld = 2 * Is if stacked else Is
    gemm(m=T, n=Is, segments=d_act, a_kmajor=True, b_kmajor=False, out=None, ldc=Is,
         epilogue="swiglu_backward",
         swiglu=SwigluBackward(gate=ctx.shared_gate, up=ctx.shared_up, dg=dgs, du=dus,
                               ld_grad=ld if stacked else 0))
    d_wsd = cp.empty((H, Is), bfloat16)
    down = [Segment(ctx.shared_act, Is, dy, H, k=T)]  # dWsd = (act^T dy)^T, as the routed dWd
    if DWD_TRANSPOSED and transposed_applies(Is, H, down, False, False, d_wsd, Is):
        wd_grad = dict(m=Is, n=H, segments=down, out_transposed=True)
    else:
        wd_grad = dict(m=H, n=Is, segments=[Segment(dy, H, ctx.shared_act, Is, k=T)])
    wd_grad.update(a_kmajor=False, b_kmajor=False, out=d_wsd, ldc=Is)
    if stacked:
        d_wsgu = cp.empty((2 * Is, H), bfloat16)
        d_wsg, d_wsu = d_wsgu[:Is], d_wsgu[Is:]
        side_by_side(dict(m=2 * Is, n=H, segments=[Segment(dgu, 2 * Is, x, H, k=T)],
                          a_kmajor=False, b_kmajor=False, out=d_wsgu, ldc=H), wd_grad)
    else:
        d_wsg, d_wsu = cp.empty((Is, H), bfloat16), cp.empty((Is, H), bfloat16)
        gemm(**wd_grad)
        for d, out in ((dgs, d_wsg), (dus, d_wsu)):
            gemm(m=Is, n=H, segments=[Segment(d, Is, x, H, k=T)], a_kmajor=False, b_kmajor=False,
                 out=out, ldc=H)
    dx = [Segment(dgs, ld, wsg, H, k=Is), Segment(dus, ld, wsu, H, k=Is)]
    return (d_wsg, d_wsu, d_wsd), dx


def backward_tail(dy, ctx: MoEContext, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w):
    """The tokens' side of the backward, given the routed experts' dx rows and dw = <da', a> in
    the sorted order: the router, the shared expert and dx."""
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
        shared, shared_dx = _shared_backward(dy, ctx)
        dx_segments += shared_dx
    # Everything but the routed rows in one fp32 GEMM: [hi | lo | dgs | dus] @ [Wr; Wr; Wsg; Wsu].
    dx_rest = cp.empty((T, H), cp.float32)
    gemm(m=T, n=H, segments=dx_segments, a_kmajor=True, b_kmajor=False, out=dx_rest, ldc=H,
         epilogue="f32")
    dx = elementwise.combine_backward(dx_sorted, ctx.slot_rows, dx_rest, K)
    return MoEGradients(hidden_states=dx, router_weight=d_router_w, expert_gate_weight=d_gate_w,
                        expert_up_weight=d_up_w, expert_down_weight=d_down_w,
                        shared_expert_gate_weight=shared[0], shared_expert_up_weight=shared[1],
                        shared_expert_down_weight=shared[2])
