"""Router stages on the GPU: logits GEMM + top-k selection, and the routing-weight backward."""
from __future__ import annotations

import cupy as cp

from .. import _build, _launch
from .._arrays import bfloat16
from .._launch import cdiv, f32, grid_stride_blocks, i32, i64, ptr
from .gemm import Segment, device_sms, gemm

_WARPS = 4
_SPLIT_ROWS = 256  # token rows per split at least: the fp32 partials' round trip stays small


def _module():
    return _build.load_module("router.cu")


def forward(x, router_weight, bias, config):
    """(scores [T,E] fp32, topk_indices [T,K] int64, topk_weights [T,K] fp32)."""
    T, H = x.shape
    E, K = config.n_routed_experts, config.num_experts_per_tok
    logits = cp.empty((T, E), cp.float32)
    gemm(m=T, n=E, segments=[Segment(x, H, router_weight, H, k=H)], a_kmajor=True, b_kmajor=True,
         out=logits, ldc=E, epilogue="f32")
    scores = cp.empty((T, E), cp.float32)
    idx = cp.empty((T, K), cp.int64)
    w = cp.empty((T, K), cp.float32)
    smem = _WARPS * (E + config.n_group) * 4
    _launch.launch(_module(), "router_topk", (cdiv(T, _WARPS),), (32 * _WARPS,),
                   [ptr(logits), ptr(bias), i32(T), i32(E), i32(K), i32(config.n_group),
                    i32(config.topk_group), i32(config.norm_topk_prob),
                    f32(config.routed_scaling_factor), ptr(scores), ptr(idx), ptr(w)], smem)
    return scores, idx, w


def backward_logits(dw_sorted, slot_rows, scores, idx, w, config):
    """dL/dlogits [T,E] as a bf16 pair (hi, lo) with hi + lo = the fp32 value to 2^-17."""
    T, E = scores.shape
    hi, lo = cp.empty((T, E), bfloat16), cp.empty((T, E), bfloat16)
    n = T * E
    _launch.launch(_module(), "router_backward", (cdiv(n, 256),), (256,),
                   [ptr(dw_sorted), ptr(slot_rows), ptr(scores), ptr(idx), ptr(w), i32(T), i32(E),
                    i32(config.num_experts_per_tok), i32(config.norm_topk_prob),
                    f32(config.routed_scaling_factor), ptr(hi), ptr(lo)])
    return hi, lo


def weight_gradient_splits(T: int, E: int, H: int) -> int:
    """Pieces the router weight gradient's token reduction is split into (1: none). Alone it
    would fill only one row of output tiles (E <= 128 rows, H / 128 SMs busy), so the tokens are
    split until the GPU is full, keeping at least _SPLIT_ROWS tokens per piece."""
    return max(1, min(device_sms() // (cdiv(E, 128) * cdiv(H, 128)), T // _SPLIT_ROWS))


def weight_gradient(hi, lo, x, out, partial=None, cancel=None) -> None:
    """dL/dW_router [E, H] fp32 = (hi + lo)^T x into out: K-grouped pieces of the tokens
    (weight_gradient_splits) into fp32 partials [splits, E, H] (given, or allocated here), summed
    in a fixed order (deterministic). cancel: see gemm()."""
    T, E = hi.shape
    H = x.shape[1]
    segments = [Segment(hi, E, x, H, k=T), Segment(lo, E, x, H, k=T)]
    splits = weight_gradient_splits(T, E, H)
    if splits == 1:
        gemm(m=E, n=H, segments=segments, a_kmajor=False, b_kmajor=False, out=out, ldc=H,
             epilogue="f32", cancel=cancel)
        return
    if partial is None:
        partial = cp.empty((splits, E, H), cp.float32)
    gemm(m=E, n=H, segments=segments, a_kmajor=False, b_kmajor=False, out=partial, ldc=H,
         epilogue="f32", grouping="k", num_groups=splits, c_group_stride=E * H, cancel=cancel)
    n = E * H
    _launch.launch(_module(), "sum_splits", (grid_stride_blocks(n),), (256,),
                   [ptr(partial), i32(splits), i64(n), ptr(out), ptr(cancel)])
