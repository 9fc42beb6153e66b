"""The expert-parallel layer on the NumPy path (CuPy arrays go to gpu_layer.py, same stages): routing and the combine on the tokens' rank, the
routed experts on their owner's rank, rows moved by the group's all-to-all.

forward:  route + sort locally -> plan (counts all-to-all) -> token rows to the experts' owners
          -> local experts on expert-grouped rows -> y rows back -> weighted combine + shared expert
backward: dy rows and routing weights to the owners -> local experts' backward (their weight
          gradients stay there) -> dx rows and dw = <da', a> back -> router and shared expert
The arithmetic is the single-device reference's (reference/layer.py), stage for stage, so a run
over W ranks gives each rank the rows a single device computes for the same global tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._arrays import is_cupy_array
from ..context import MoEContext
from ..reference.layer import _backward_tail, experts_backward, experts_forward, finish_forward
from ..reference.precision import precision_for
from ..reference.routing import route, routing_sort
from .dispatch import DispatchPlan, plan_dispatch


@dataclass(frozen=True, eq=False)
class ExpertParallelState:
    """What the experts' side of a rank keeps for the backward (rows in expert-major order)."""

    group: Any
    plan: DispatchPlan
    x_rows: Any   # [R, H] the received token rows
    gate: Any     # [R, I]
    up: Any
    act: Any


def forward(hidden_states, router_weight, e_score_correction_bias, expert_gate_weight,
            expert_up_weight, expert_down_weight, shared_expert_gate_weight,
            shared_expert_up_weight, shared_expert_down_weight, config, group):
    if is_cupy_array(hidden_states):
        from . import gpu_layer
        return gpu_layer.forward(hidden_states, router_weight, e_score_correction_bias,
                                 expert_gate_weight, expert_up_weight, expert_down_weight,
                                 shared_expert_gate_weight, shared_expert_up_weight,
                                 shared_expert_down_weight, config, group)
    P = precision_for(hidden_states.dtype)
    E, K = config.n_routed_experts, config.num_experts_per_tok
    x = P.load(hidden_states)
    scores, idx, w = route(x, P.load(router_weight), e_score_correction_bias, config)
    slots, offsets, counts = routing_sort(idx, E)
    plan = plan_dispatch(counts, group)
    # Rows travel in the storage dtype (bf16 on the wire in production precision).
    received = group.exchange_rows(hidden_states[slots // K], plan.send_counts, plan.recv_counts)
    x_rows = received[plan.to_expert_major]
    gate, up, act, y_rows = experts_forward(P, P.load(x_rows), plan.local_offsets,
                                            expert_gate_weight, expert_up_weight, expert_down_weight)
    y_sorted = P.load(group.exchange_rows(P.out(y_rows)[plan.to_received], plan.recv_counts,
                                          plan.send_counts))
    ep = ExpertParallelState(group=group, plan=plan, x_rows=x_rows, gate=P.out(gate),
                             up=P.out(up), act=P.out(act))
    inputs = (hidden_states, router_weight, expert_gate_weight, expert_up_weight, expert_down_weight,
              shared_expert_gate_weight, shared_expert_up_weight, shared_expert_down_weight)
    return finish_forward(P, inputs, config, (scores, idx, w, slots, offsets, counts), y_sorted,
                          (None, None, None), expert_parallel=ep)


def backward(grad_output, ctx: MoEContext):
    if is_cupy_array(grad_output):
        from . import gpu_layer
        return gpu_layer.backward(grad_output, ctx)
    ep, P = ctx.expert_parallel, precision_for(ctx.hidden_states.dtype)
    plan, group = ep.plan, ep.group
    K = ctx.config.num_experts_per_tok
    slots = ctx.sorted_slots
    to_experts = lambda rows: group.exchange_rows(rows, plan.send_counts,
                                                  plan.recv_counts)[plan.to_expert_major]
    to_sources = lambda rows: group.exchange_rows(rows[plan.to_received], plan.recv_counts,
                                                  plan.send_counts)
    dy_rows = to_experts(grad_output[slots // K])
    w_rows = to_experts(ctx.topk_weights.reshape(-1)[slots])
    dw_rows, dx_rows, d_gate_w, d_up_w, d_down_w = experts_backward(
        P, P.load(ep.x_rows), P.load(dy_rows), w_rows, ep.gate, ep.up, ep.act, plan.local_offsets,
        ctx.expert_gate_weight, ctx.expert_up_weight, ctx.expert_down_weight)
    dx_sorted = P.load(to_sources(P.out(dx_rows)))
    dw_sorted = to_sources(dw_rows)
    return _backward_tail(P, ctx, P.load(ctx.hidden_states), P.load(grad_output), dx_sorted,
                          dw_sorted, d_gate_w, d_up_w, d_down_w)
