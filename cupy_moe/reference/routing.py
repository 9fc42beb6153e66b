"""Router, expert selection and the routing sort, in NumPy."""
from __future__ import annotations

import numpy as np

from ..config import MoEConfig
from .precision import sigmoid


def select_experts(biased: np.ndarray, cfg: MoEConfig) -> np.ndarray:
    """Group-limited top-k of the biased scores [T, E] -> expert indices [T, K] int64.

    A group scores the sum of its two largest biased scores; the topk_group best groups stay
    (ties: lower group index); then the K best experts of the kept groups, in descending score
    (ties: lower expert index). NaN ranks below every number, so a NaN row still yields K
    distinct experts.
    """
    T, E = biased.shape
    key = np.where(np.isnan(biased), -np.inf, biased)
    if cfg.n_group > 1:
        per = E // cfg.n_group
        grouped = key.reshape(T, cfg.n_group, per)
        top2 = -np.sort(-grouped, axis=2)[:, :, :2]
        group_score = top2[:, :, 0] + top2[:, :, 1]
        kept = np.argsort(-group_score, axis=1, kind="stable")[:, :cfg.topk_group]
        keep = np.zeros((T, cfg.n_group), dtype=bool)
        np.put_along_axis(keep, kept, True, axis=1)
        key = np.where(np.repeat(keep, per, axis=1), key, -np.inf)
    order = np.argsort(-key, axis=1, kind="stable")
    return order[:, :cfg.num_experts_per_tok].astype(np.int64)


def routing_weights(scores: np.ndarray, idx: np.ndarray, cfg: MoEConfig) -> np.ndarray:
    """w_k = s[t, e_k], normalized over the K picks if norm_topk_prob, times routed_scaling_factor."""
    w = np.take_along_axis(scores, idx, axis=1)
    if cfg.norm_topk_prob:
        w = w / (w.sum(axis=1, keepdims=True) + scores.dtype.type(1e-20))
    return w * scores.dtype.type(cfg.routed_scaling_factor)


def route(x_acc: np.ndarray, router_weight_acc: np.ndarray, bias: np.ndarray, cfg: MoEConfig):
    """Router forward: (scores [T,E], topk_indices [T,K] int64, topk_weights [T,K])."""
    logits = x_acc @ router_weight_acc.T
    scores = sigmoid(logits)
    idx = select_experts(scores + bias.astype(scores.dtype), cfg)
    return scores, idx, routing_weights(scores, idx, cfg)


def routing_sort(idx: np.ndarray, n_experts: int):
    """Stable counting sort of the T*K slots by expert.

    Returns (sorted_slots [T*K] int32, expert_offsets [E+1] int32, tokens_per_expert [E] int64):
    sorted row j holds flat slot sorted_slots[j] = t*K + k; expert e owns rows
    expert_offsets[e]:expert_offsets[e+1], tokens ascending within it.
    """
    flat = idx.ravel()
    slots = np.argsort(flat, kind="stable").astype(np.int32)
    counts = np.bincount(flat, minlength=n_experts).astype(np.int64)
    offsets = np.zeros(n_experts + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return slots, offsets, counts


def router_backward(dw: np.ndarray, scores: np.ndarray, idx: np.ndarray, topk_weights: np.ndarray,
                    cfg: MoEConfig) -> np.ndarray:
    """Gradient of the routing weights [T,K] back to the router logits [T,E]."""
    r = scores.dtype.type(cfg.routed_scaling_factor)
    if cfg.norm_topk_prob:
        s_sel = np.take_along_axis(scores, idx, axis=1)
        denom = s_sel.sum(axis=1, keepdims=True) + scores.dtype.type(1e-20)
        ds = (r / denom) * (dw - (dw * topk_weights).sum(axis=1, keepdims=True) / r)
    else:
        ds = r * dw
    d_scores = np.zeros_like(scores)
    np.put_along_axis(d_scores, idx, ds.astype(scores.dtype), axis=1)
    return d_scores * scores * (1 - scores)
