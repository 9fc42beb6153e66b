"""The full MoE layer (../spec moe_layer.md) in NumPy: the oracle of the GPU path.

Rounding points of the production (bf16) precision, each where the GPU path writes bf16 to memory:
  forward   g = bf16(x Wg^T), u = bf16(x Wu^T), a = bf16(silu(g) u)       per sorted row, saved
            y_e = bf16(a Wd^T)                                           per sorted row
            out = bf16(sum_k w_k y_e + y_shared)   (the combine sums in fp32, k ascending)
            shared: gs, us, as = bf16(...) as above, y_shared = bf16(as Wsd^T)
  backward  da' = dy Wd_e (fp32, never stored); dw = <da', a> (fp32)
            dg = bf16(w da' u silu'(g)), du = bf16(w da' silu(g))
            dWd_e = bf16(dy^T bf16(w a)), dWg_e = bf16(dg^T x), dWu_e = bf16(du^T x)
            dx_e = bf16(dg Wg_e + du Wu_e) per sorted row
            shared: dgs, dus = bf16(...), dWs* = bf16(...), its dx stays fp32
            router: dlogits, dWr = dlogits^T x and dx_router = dlogits Wr in fp32
            dx = bf16(sum_k dx_e + dx_shared + dx_router)
Between these points everything is fp32. The float64 precision rounds nowhere.
"""
from __future__ import annotations

import numpy as np

from ..config import MoEConfig
from ..context import MoEContext, MoEGradients
from .precision import Precision, precision_for, silu_and_grad
from .routing import route, router_backward, routing_sort


def _swiglu_forward(P: Precision, x, w_gate, w_up):
    g = P.store(x @ P.load(w_gate).T)
    u = P.store(x @ P.load(w_up).T)
    silu, _ = silu_and_grad(g)
    return g, u, P.store(silu * u)


def _swiglu_backward(P: Precision, da, g, u):
    """From the gradient at a (already scaled by the routing weight) to (dg, du), both stored."""
    silu, dsilu = silu_and_grad(g)
    return P.store(da * u * dsilu), P.store(da * silu)


def experts_forward(P: Precision, rows_x, offsets, expert_gate_weight, expert_up_weight,
                    expert_down_weight):
    """Routed experts on rows grouped by expert (expert e owns rows offsets[e]:offsets[e+1]):
    (gate, up, act, y) per row, in the accumulation dtype, stored values where the GPU stores."""
    n, H = rows_x.shape
    I = expert_gate_weight.shape[1]
    gate, up, act = (np.zeros((n, I), P.acc) for _ in range(3))
    y = np.zeros((n, H), P.acc)
    for e in range(len(offsets) - 1):
        if offsets[e] == offsets[e + 1]:
            continue
        rows = slice(offsets[e], offsets[e + 1])
        gate[rows], up[rows], act[rows] = _swiglu_forward(
            P, rows_x[rows], expert_gate_weight[e], expert_up_weight[e])
        y[rows] = P.store(act[rows] @ P.load(expert_down_weight[e]).T)
    return gate, up, act, y


def experts_backward(P: Precision, rows_x, rows_dy, row_weights, gate, up, act, offsets,
                     expert_gate_weight, expert_up_weight, expert_down_weight):
    """Backward of experts_forward given dL/dy per row (rows_dy, unweighted: the routing weight
    of each row is applied here): (dw per row = <da', a>, dx per row, dWg, dWu, dWd)."""
    n, H = rows_x.shape
    E, I = expert_gate_weight.shape[:2]
    w_rows = row_weights.astype(P.acc)[:, None]
    dw_rows = np.zeros(n, P.acc)
    dx_rows = np.zeros((n, H), P.acc)
    d_gate_w = np.zeros((E, I, H), P.storage)
    d_up_w = np.zeros((E, I, H), P.storage)
    d_down_w = np.zeros((E, H, I), P.storage)
    for e in range(E):
        if offsets[e] == offsets[e + 1]:
            continue  # an expert without tokens has exactly zero weight gradients
        rows = slice(offsets[e], offsets[e + 1])
        xs, dys, ws = rows_x[rows], rows_dy[rows], w_rows[rows]
        g, u, a = P.load(gate[rows]), P.load(up[rows]), P.load(act[rows])
        wg, wu = P.load(expert_gate_weight[e]), P.load(expert_up_weight[e])
        da_unweighted = dys @ P.load(expert_down_weight[e])
        dw_rows[rows] = (da_unweighted * a).sum(axis=1)
        dg, du = _swiglu_backward(P, ws * da_unweighted, g, u)
        d_down_w[e] = P.out(P.store(dys.T @ P.store(ws * a)))
        d_gate_w[e] = P.out(P.store(dg.T @ xs))
        d_up_w[e] = P.out(P.store(du.T @ xs))
        dx_rows[rows] = P.store(dg @ wg + du @ wu)
    return dw_rows, dx_rows, d_gate_w, d_up_w, d_down_w


def combine(P: Precision, y_sorted, slots, w, y_shared):
    """out = sum_k w_k y(slot) (+ y_shared), accumulated in the accumulation dtype."""
    T, K = w.shape
    y_slot = np.empty_like(y_sorted)
    y_slot[slots] = y_sorted
    y = (w.reshape(T, K, 1) * y_slot.reshape(T, K, y_sorted.shape[1])).sum(axis=1)
    return y if y_shared is None else y + y_shared


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=perm.dtype)
    return inv


def forward(hidden_states, router_weight, e_score_correction_bias, expert_gate_weight,
            expert_up_weight, expert_down_weight, shared_expert_gate_weight,
            shared_expert_up_weight, shared_expert_down_weight, config: MoEConfig):
    P = precision_for(hidden_states.dtype)
    scores, idx, w = route(P.load(hidden_states), P.load(router_weight), e_score_correction_bias,
                           config)
    return forward_routed(hidden_states, router_weight, expert_gate_weight, expert_up_weight,
                          expert_down_weight, shared_expert_gate_weight, shared_expert_up_weight,
                          shared_expert_down_weight, config, scores, idx, w)


def forward_routed(hidden_states, router_weight, expert_gate_weight, expert_up_weight,
                   expert_down_weight, shared_expert_gate_weight, shared_expert_up_weight,
                   shared_expert_down_weight, config: MoEConfig, scores, idx, w):
    """The layer after routing, given (scores, topk_indices, topk_weights): lets a test feed the
    GPU's own routing decisions, which near-ties in fp32 may resolve differently."""
    P = precision_for(hidden_states.dtype)
    E, K = config.n_routed_experts, config.num_experts_per_tok
    x = P.load(hidden_states)
    slots, offsets, counts = routing_sort(idx, E)
    gate, up, act, y_sorted = experts_forward(P, x[slots // K], offsets, expert_gate_weight,
                                              expert_up_weight, expert_down_weight)
    inputs = (hidden_states, router_weight, expert_gate_weight, expert_up_weight, expert_down_weight,
              shared_expert_gate_weight, shared_expert_up_weight, shared_expert_down_weight)
    return finish_forward(P, inputs, config, (scores, idx, w, slots, offsets, counts), y_sorted,
                          (P.out(gate), P.out(up), P.out(act)))


def finish_forward(P: Precision, inputs, config: MoEConfig, routing, y_sorted, saved,
                   expert_parallel=None):
    """After the routed experts: the shared expert, the weighted combine and the saved context
    (shared by the single-device and the expert-parallel layer). inputs: the eight arrays of
    moe_forward; routing: (scores, topk_indices, topk_weights, sorted_slots, expert_offsets,
    tokens_per_expert); saved: (gate, up, act) for the context."""
    hidden_states, router_weight, wg, wu, wd, wsg, wsu, wsd = inputs
    scores, idx, w, slots, offsets, counts = routing
    shared = (None, None, None)
    y_shared = None
    if config.n_shared_experts:
        shared = _swiglu_forward(P, P.load(hidden_states), wsg, wsu)
        y_shared = P.store(shared[2] @ P.load(wsd).T)
    out = P.out(P.store(combine(P, y_sorted, slots, w, y_shared)))
    ctx = MoEContext(
        config=config, hidden_states=hidden_states, router_weight=router_weight,
        expert_gate_weight=wg, expert_up_weight=wu, expert_down_weight=wd,
        shared_expert_gate_weight=wsg, shared_expert_up_weight=wsu, shared_expert_down_weight=wsd,
        scores=scores, topk_indices=idx, topk_weights=w, tokens_per_expert=counts,
        expert_offsets=offsets, sorted_slots=slots, slot_rows=_inverse(slots),
        gate=saved[0], up=saved[1], act=saved[2],
        shared_gate=None if shared[0] is None else P.out(shared[0]),
        shared_up=None if shared[1] is None else P.out(shared[1]),
        shared_act=None if shared[2] is None else P.out(shared[2]),
        expert_parallel=expert_parallel)
    return out, ctx


def backward(grad_output, ctx: MoEContext) -> MoEGradients:
    P = precision_for(ctx.hidden_states.dtype)
    K = ctx.config.num_experts_per_tok
    x, dy = P.load(ctx.hidden_states), P.load(grad_output)
    slots, offsets = ctx.sorted_slots, ctx.expert_offsets
    tok = slots // K
    dw_sorted, dx_sorted, d_gate_w, d_up_w, d_down_w = experts_backward(
        P, x[tok], dy[tok], ctx.topk_weights.reshape(-1)[slots], ctx.gate, ctx.up, ctx.act,
        offsets, ctx.expert_gate_weight, ctx.expert_up_weight, ctx.expert_down_weight)
    return _backward_tail(P, ctx, x, dy, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w)


def _backward_tail(P, ctx, x, dy, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w):
    """Everything after the routed experts: the combine of their dx, the router and the shared
    expert (shared by the single-device and the expert-parallel layer)."""
    cfg = ctx.config
    T, H = x.shape
    K = cfg.num_experts_per_tok
    n = T * K
    slots = ctx.sorted_slots
    dx_slot = np.empty_like(dx_sorted)
    dx_slot[slots] = dx_sorted
    dx = dx_slot.reshape(T, K, H).sum(axis=1)
    dw = np.empty(n, P.acc)
    dw[slots] = dw_sorted
    d_logits = router_backward(dw.reshape(T, K), ctx.scores, ctx.topk_indices, ctx.topk_weights, cfg)
    d_router_w = d_logits.T @ x
    dx = dx + d_logits @ P.load(ctx.router_weight)
    shared = (None, None, None)
    if cfg.n_shared_experts:
        gs, us, as_ = P.load(ctx.shared_gate), P.load(ctx.shared_up), P.load(ctx.shared_act)
        dgs, dus = _swiglu_backward(P, dy @ P.load(ctx.shared_expert_down_weight), gs, us)
        shared = (P.out(P.store(dgs.T @ x)), P.out(P.store(dus.T @ x)),
                  P.out(P.store(dy.T @ as_)))
        dx = dx + (dgs @ P.load(ctx.shared_expert_gate_weight)
                   + dus @ P.load(ctx.shared_expert_up_weight))
    return MoEGradients(
        hidden_states=P.out(P.store(dx)), router_weight=d_router_w.astype(P.acc),
        expert_gate_weight=d_gate_w, expert_up_weight=d_up_w, expert_down_weight=d_down_w,
        shared_expert_gate_weight=shared[0], shared_expert_up_weight=shared[1],
        shared_expert_down_weight=shared[2])
