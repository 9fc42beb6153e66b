"""The public functions: validate, then run the NumPy reference or the GPU path.

NumPy arrays in -> the NumPy reference, NumPy arrays out; CuPy arrays in -> our CUDA kernels,
CuPy arrays out (the cupy.get_array_module convention). Mixing the two is a TypeError.
"""
from __future__ import annotations

import numpy as np

from . import validate
from .config import MoEConfig
from .context import MoEContext, MoEGradients


def moe_forward(hidden_states, router_weight, e_score_correction_bias, expert_gate_weight,
                expert_up_weight, expert_down_weight, shared_expert_gate_weight=None,
                shared_expert_up_weight=None, shared_expert_down_weight=None, *,
                config: MoEConfig, ep_group=None):
    """Forward of one MoE layer: returns (out [T, H], ctx: MoEContext).

    hidden_states [T,H] bf16; router_weight [E,H] bf16; e_score_correction_bias [E] fp32 (steers
    selection only); expert_{gate,up}_weight [E,I,H], expert_down_weight [E,H,I] bf16; the shared
    expert's [Is,H], [Is,H], [H,Is] bf16 (None when config.n_shared_experts == 0). On the NumPy
    path all floating arrays may instead be float64 (the reference computes in float64 then).

    ep_group (cupy_moe.parallel): expert parallelism over group.world_size = W ranks. Each rank
    passes its own tokens and its E / W experts' weights ([E/W, I, H], ...; rank r owns experts
    r E/W ... (r+1) E/W - 1); router and shared-expert weights are replicated. moe_backward then
    returns this rank's experts' gradients and this rank's share of the router's and shared
    expert's (to be all-reduced by the caller). Both paths: NumPy arrays with a CPU group
    (ThreadGroup, QueueGroup), CuPy arrays with NcclGroup (one GPU per rank) or SingleRankGroup.
    """
    args = dict(hidden_states=hidden_states, router_weight=router_weight,
                e_score_correction_bias=e_score_correction_bias,
                expert_gate_weight=expert_gate_weight, expert_up_weight=expert_up_weight,
                expert_down_weight=expert_down_weight,
                shared_expert_gate_weight=shared_expert_gate_weight,
                shared_expert_up_weight=shared_expert_up_weight,
                shared_expert_down_weight=shared_expert_down_weight)
    xp = validate.moe_forward_args(args, config, ep_group)
    if ep_group is not None:
        from .parallel import layer as ep_layer
        return ep_layer.forward(*args.values(), config, ep_group)
    if xp is np:
        from .reference import layer
        return layer.forward(*args.values(), config)
    from .gpu import layer as gpu_layer
    return gpu_layer.forward(*args.values(), config=config)


def moe_backward(grad_output, ctx: MoEContext) -> MoEGradients:
    """Backward of moe_forward given dL/d(out) [T,H]: returns MoEGradients (router_weight's in fp32,
    the others in the dtype of what they differentiate)."""
    xp = validate.moe_backward_args(grad_output, ctx)
    if ctx.expert_parallel is not None:
        from .parallel import layer as ep_layer
        return ep_layer.backward(grad_output, ctx)
    if xp is np:
        from .reference import layer
        return layer.backward(grad_output, ctx)
    from .gpu import layer as gpu_layer
    return gpu_layer.backward(grad_output, ctx)


def sol080_backward(grad_output, hidden_states, router_weight, e_score_correction_bias,
                    router_logits, scores, topk_indices, topk_weights, score_mask,
                    shared_expert_gate_weight, shared_expert_up_weight, shared_expert_down_weight,
                    shared_gate_output, shared_up_output, shared_activated):
    """SOL-ExecBench L2/080 backward. Returns (grad_hidden_states bf16 [T,H], grad_router_weight
    fp32 [E,H], grad_shared_expert_gate_weight bf16 [I,H], grad_shared_expert_up_weight bf16 [I,H],
    grad_shared_expert_down_weight bf16 [H,I]). H, I, E, K are read off the shapes."""
    args = dict(grad_output=grad_output, hidden_states=hidden_states, router_weight=router_weight,
                e_score_correction_bias=e_score_correction_bias, router_logits=router_logits,
                scores=scores, topk_indices=topk_indices, topk_weights=topk_weights,
                score_mask=score_mask, shared_expert_gate_weight=shared_expert_gate_weight,
                shared_expert_up_weight=shared_expert_up_weight,
                shared_expert_down_weight=shared_expert_down_weight,
                shared_gate_output=shared_gate_output, shared_up_output=shared_up_output,
                shared_activated=shared_activated)
    xp, dims = validate.sol080_args(args, check_indices=False)
    if xp is np:
        validate.check_topk_indices("topk_indices", topk_indices, dims["E"])
        from .reference import sol080
        return sol080.sol080_backward(*args.values())
    from .gpu import sol080 as gpu_sol080
    return gpu_sol080.sol080_backward(*args.values())  # checks the indices in its first kernel
