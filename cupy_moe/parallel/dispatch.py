"""The bookkeeping of expert-parallel dispatch: who sends how many rows to whom, and the
permutations between the received order and the experts' order.

After the routing sort, a rank's T*K slots are grouped by expert, and experts are grouped by
owner (rank d owns experts d*El ... (d+1)*El - 1, El = E / W), so the rows for rank d are one
contiguous block of the sorted rows: no permutation is needed to send. A receiver gets, from each
source s in rank order, that source's rows for its El experts, expert by expert; the grouped
GEMMs want rows grouped by expert, sources in rank order within an expert (which is the order a
single device would have used for the same global tokens: tokens ascending within an expert).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DispatchPlan:
    send_counts: np.ndarray       # [W] rows this rank sends to each rank
    recv_counts: np.ndarray       # [W] rows this rank receives from each rank
    recv_per_expert: np.ndarray   # [W, El] rows received from source s for local expert e
    local_offsets: np.ndarray     # [El + 1] int32: local expert e owns expert-major rows [o[e], o[e+1])
    to_expert_major: np.ndarray   # [R] int64: expert-major row i is received row to_expert_major[i]
    to_received: np.ndarray       # [R] int64: the inverse (received row j is expert-major row ...)


def plan_dispatch(tokens_per_expert, group) -> DispatchPlan:
    """Exchange the per-expert counts with every rank (one small all-to-all) and derive the plan.

    tokens_per_expert: [E] counts of this rank's slots per global expert (host integers).
    """
    counts = np.asarray(tokens_per_expert, dtype=np.int64)
    W = group.world_size
    E = counts.size
    if E % W:
        raise ValueError(f"ep_group: n_routed_experts ({E}) must be a multiple of the world size ({W})")
    El = E // W
    send_per_expert = counts.reshape(W, El)
    recv_per_expert = np.asarray(group.exchange_counts(send_per_expert), dtype=np.int64)
    return plan_from_counts(send_per_expert, recv_per_expert)


def plan_from_counts(send_per_expert: np.ndarray, recv_per_expert: np.ndarray) -> DispatchPlan:
    """The plan given both count tables ([W, El] each): pure arithmetic, tested without ranks."""
    W, El = recv_per_expert.shape
    recv_counts = recv_per_expert.sum(axis=1)
    local_counts = recv_per_expert.sum(axis=0)
    local_offsets = np.zeros(El + 1, np.int32)
    np.cumsum(local_counts, out=local_offsets[1:])
    # Received layout: source-major, then expert; block (s, e) starts at start[s, e].
    flat = recv_per_expert.reshape(-1)
    start = (np.cumsum(flat) - flat).reshape(W, El)
    pieces = [np.arange(start[s, e], start[s, e] + recv_per_expert[s, e], dtype=np.int64)
              for e in range(El) for s in range(W)]
    to_expert_major = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    to_received = np.empty_like(to_expert_major)
    to_received[to_expert_major] = np.arange(to_expert_major.size, dtype=np.int64)
    return DispatchPlan(send_counts=send_per_expert.sum(axis=1), recv_counts=recv_counts,
                        recv_per_expert=recv_per_expert, local_offsets=local_offsets,
                        to_expert_major=to_expert_major, to_received=to_received)
