"""The expert-parallel layer on the GPU: the single-GPU stages of cupy_moe/gpu/layer.py around the
group's exchanges (an NcclGroup between GPUs; SingleRankGroup runs the same path on one GPU).

forward:  route + sort locally -> plan (counts all-to-all; the one host sync, which sizes the
          exchanges) -> token rows to the experts' owners -> local experts -> y rows back ->
          weighted combine + shared expert
backward: dy rows and routing weights to the owners -> local experts' backward (their weight
          gradients stay there) -> dx rows and dw = <da', a> back -> router, shared expert, dx
Rows leave in the routing-sorted order (the blocks for each owner are contiguous) and arrive in
source-major order; the plan's permutations take them to expert-major order and back, so the
local grouped GEMMs see what one GPU would see for the same global tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy as cp
import numpy as np

from .._arrays import bfloat16
from ..context import MoEContext
from ..gpu import elementwise, router, routing
from ..gpu.layer import backward_tail, experts_backward, experts_forward, finish_forward
from .dispatch import DispatchPlan, plan_dispatch


@dataclass(frozen=True)
class _Permutation:
    """One of the plan's row permutations on the device (rows[index]), or None: the identity."""

    index: Any  # [R] int32, or None

    @classmethod
    def of(cls, host_index) -> "_Permutation":
        identity = np.array_equal(host_index, np.arange(host_index.size))
        return cls(None if identity else cp.asarray(host_index, dtype=cp.int32))

    def __call__(self, rows):
        if self.index is None:
            return rows
        if rows.ndim == 2 and rows.dtype == bfloat16 and rows.flags.c_contiguous:
            return elementwise.gather_rows(rows, self.index, 1)
        return rows[self.index]


@dataclass(frozen=True, eq=False)
class GpuExpertParallelState:
    """What the experts' side of a rank keeps for the backward (rows in expert-major order)."""

    group: Any
    plan: DispatchPlan
    to_expert_major: _Permutation  # received order -> expert-major order
    to_received: _Permutation      # and back
    local_offsets: Any             # device copy of the plan's
    x_rows: Any            # [R, H] the received token rows
    gate: Any              # [R, I]
    up: Any
    act: Any


def forward(x, wr, bias, wg, wu, wd, wsg, wsu, wsd, config, group):
    E = config.n_routed_experts
    El = wg.shape[0]
    scores, idx, w = router.forward(x, wr, bias, config)
    r = routing.sort(idx, E)
    plan = plan_dispatch(r.tokens_per_expert.get(), group)
    to_em, to_recv = _Permutation.of(plan.to_expert_major), _Permutation.of(plan.to_received)
    offsets = cp.asarray(plan.local_offsets)
    x_sorted = elementwise.rows_by_expert(x, r.slot_rows, config.num_experts_per_tok)
    x_rows = to_em(group.exchange_rows(x_sorted, plan.send_counts, plan.recv_counts))
    del x_sorted
    gate, up, act, y_rows = experts_forward(x_rows, offsets, El, wg, wu, wd)
    y_sorted = group.exchange_rows(to_recv(y_rows), plan.recv_counts, plan.send_counts)
    del y_rows
    ep = GpuExpertParallelState(group=group, plan=plan, to_expert_major=to_em, to_received=to_recv,
                                local_offsets=offsets, x_rows=x_rows, gate=gate, up=up, act=act)
    return finish_forward((x, wr, wg, wu, wd, wsg, wsu, wsd), config, (scores, idx, w, r), y_sorted,
                          (None, None, None), expert_parallel=ep)


def backward(dy, ctx: MoEContext):
    ep = ctx.expert_parallel
    plan, group = ep.plan, ep.group
    slots = ctx.sorted_slots

    def to_experts(rows):
        return ep.to_expert_major(group.exchange_rows(rows, plan.send_counts, plan.recv_counts))

    def to_sources(rows):
        return group.exchange_rows(ep.to_received(rows), plan.recv_counts, plan.send_counts)

    dy_rows = to_experts(elementwise.rows_by_expert(dy, ctx.slot_rows, ctx.config.num_experts_per_tok))
    w_rows = to_experts(ctx.topk_weights.reshape(-1)[slots])
    dw_rows, dx_rows, d_gate_w, d_up_w, d_down_w = experts_backward(
        ep.x_rows, dy_rows, ep.gate, ep.up, ep.act, ep.local_offsets, ctx.expert_gate_weight.shape[0],
        ctx.expert_gate_weight, ctx.expert_up_weight, ctx.expert_down_weight, weights=w_rows)
    del dy_rows
    dx_sorted, dw_sorted = to_sources(dx_rows), to_sources(dw_rows)
    return backward_tail(dy, ctx, dx_sorted, dw_sorted, d_gate_w, d_up_w, d_down_w)
