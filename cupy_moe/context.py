"""MoEContext: what moe_forward saves for moe_backward (both paths use one layout)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from .config import MoEConfig


@dataclass(frozen=True, eq=False)
class MoEContext:
    """Saved state of one forward call.

    Routing (T tokens, K slots, E experts):
      scores            [T, E] fp32     sigmoid(router logits), before the selection bias
      topk_indices      [T, K] int64    selected experts, in descending biased score; ties -> lower index
      topk_weights      [T, K] fp32     routing weights (normalized if norm_topk_prob, times r)
      tokens_per_expert [E]    int64    how many slots chose each expert (for the bias-balancing update)
    Expert-sorted layout (the rows of every grouped GEMM; N = T*K):
      expert_offsets    [E+1]  int32    expert e owns sorted rows expert_offsets[e] : expert_offsets[e+1]
      sorted_slots      [N]    int32    flat slot t*K + k of each sorted row (tokens ascending per expert)
      slot_rows         [N]    int32    sorted row of each flat slot (the inverse permutation)
      gate, up, act     [N, I] bf16     g = x W_g^T, u = x W_u^T, a = silu(g) * u, per sorted row
      sorted_hidden_states [N, H] bf16  x's rows in this order (GPU path: the operand of the
                                        expert weight gradients, kept from the forward as training
                                        frameworks keep permuted tokens; None on the NumPy path)
    Shared expert (None when n_shared_experts == 0):
      shared_gate, shared_up, shared_act [T, I * n_shared_experts] bf16
    Inputs are kept by reference (never copied, never modified): hidden_states, router_weight and
    the expert weights.

    On the float64 NumPy path every floating array above is float64 instead.
    Expert parallelism (moe_forward(..., ep_group=...)): the expert weights are this rank's shard,
    gate/up/act are None here and live, for the rows this rank's experts received, in
    expert_parallel (cupy_moe.parallel.layer.ExpertParallelState) with the dispatch plan.
    """

    config: MoEConfig
    hidden_states: Any
    router_weight: Any
    expert_gate_weight: Any
    expert_up_weight: Any
    expert_down_weight: Any
    shared_expert_gate_weight: Optional[Any]
    shared_expert_up_weight: Optional[Any]
    shared_expert_down_weight: Optional[Any]
    scores: Any
    topk_indices: Any
    topk_weights: Any
    tokens_per_expert: Any
    expert_offsets: Any
    sorted_slots: Any
    slot_rows: Any
    gate: Any
    up: Any
    act: Any
    shared_gate: Optional[Any]
    shared_up: Optional[Any]
    shared_act: Optional[Any]
    expert_parallel: Optional[Any] = None
    sorted_hidden_states: Optional[Any] = None


class MoEGradients(NamedTuple):
    """Gradients of moe_backward: router_weight in fp32, the rest in the dtype of what they
    differentiate (bf16; float64 on the float64 NumPy path). Shared fields are None without a
    shared expert."""

    hidden_states: Any
    router_weight: Any
    expert_gate_weight: Any
    expert_up_weight: Any
    expert_down_weight: Any
    shared_expert_gate_weight: Optional[Any]
    shared_expert_up_weight: Optional[Any]
    shared_expert_down_weight: Optional[Any]
