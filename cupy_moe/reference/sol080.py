"""SOL-ExecBench L2/080 backward (../spec sol080.md) in NumPy, with its rounding points.

bf16(.) marks where the contract rounds to bf16; everything else is fp32 (products of bf16 values
are exact in fp32, sums accumulate in fp32).
"""
from __future__ import annotations

import numpy as np

from .._arrays import bfloat16, round_bf16 as bf16
from .precision import sigmoid


def sol080_backward(grad_output, hidden_states, router_weight, e_score_correction_bias,
                    router_logits, scores, topk_indices, topk_weights, score_mask,
                    shared_expert_gate_weight, shared_expert_up_weight, shared_expert_down_weight,
                    shared_gate_output, shared_up_output, shared_activated):
    f32 = np.float32
    g, x = grad_output.astype(f32), hidden_states.astype(f32)
    T, K = topk_indices.shape
    E = router_weight.shape[0]
    gate, up, act = (a.astype(f32) for a in (shared_gate_output, shared_up_output, shared_activated))

    # Shared expert (steps 1-6).
    d_act = bf16(g @ shared_expert_down_weight.astype(f32))
    grad_wd = bf16(g.T @ act)
    t = bf16(d_act * up)
    sig = sigmoid(gate)
    d_up = bf16(d_act * bf16(gate * sig))
    d_gate = bf16(t * sig * (1 + gate * (1 - sig)))
    grad_wg = bf16(d_gate.T @ x)
    grad_wu = bf16(d_up.T @ x)
    h_shared = bf16(bf16(d_up @ shared_expert_up_weight.astype(f32))
                    + bf16(d_gate @ shared_expert_gate_weight.astype(f32)))

    # Router (steps 7-12), all fp32.
    q = (g * g).sum(axis=1) / f32(K)
    s = topk_weights.sum(axis=1) + f32(1e-20)
    c = (q - (q[:, None] * topk_weights / s[:, None]).sum(axis=1)) / s
    G = np.zeros((T, E), f32)
    np.add.at(G, (np.repeat(np.arange(T), K), topk_indices.ravel()), np.repeat(c, K))
    grl = G * score_mask * scores * (1 - scores)
    grad_router = grl.T @ x
    grad_h = bf16(h_shared + bf16(bf16(grl) @ router_weight.astype(f32)))

    out = lambda a: a.astype(bfloat16)
    return (out(grad_h), grad_router.astype(f32), out(grad_wg), out(grad_wu), out(grad_wd))
