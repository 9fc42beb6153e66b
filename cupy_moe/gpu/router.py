"""Router stages on the GPU: logits GEMM + top-k selection, and the routing-weight backward."""
from __future__ import annotations

import os

import cupy as cp

from .. import _build, _launch
from .._arrays import bfloat16
from .._launch import cdiv, f32, grid_stride_blocks, i32, i64, ptr
from . import gemm as _gemm
from . import settings
from .gemm import Segment, device_sms, gemm

_WARPS = 4
_SPLIT_ROWS = 256  # token rows per split at least: the fp32 partials' round trip stays small
# A/B only: 0 runs the split weight gradient as before (the hi and lo halves as two reductions of
# E rows each, so every piece reads its tokens of x twice).
STACKED = os.environ.get("CUPY_MOE_ROUTER_WGRAD_STACKED", "1") != "0"
# A/B only: 0 sums the stacked pieces through global memory and sum_splits even where a cluster
# could sum them inside the GEMM (gemm.SPLIT_CLUSTER must be on too).
SUM_IN_GEMM = os.environ.get("CUPY_MOE_ROUTER_WGRAD_CLUSTER", "1") != "0"


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
    """dL/dlogits [T,E] as a bf16 pair hi + lo = the fp32 value (to 2^-17), side by side in one
    [T, 2E] array (row t = [hi(t) | lo(t)]), the layout weight_gradient reads."""
    T, E = scores.shape
    grl = cp.empty((T, 2 * E), bfloat16)
    _launch.launch(_module(), "router_backward", (cdiv(32 * T, 256),), (256,),  # a warp per token
                   [ptr(dw_sorted), ptr(slot_rows), ptr(scores), ptr(idx), ptr(w), i32(T), i32(E),
                    i32(config.num_experts_per_tok), i32(config.norm_topk_prob),
                    f32(config.routed_scaling_factor), ptr(grl)])
    return grl


def hi_lo(grl):
    """The halves of grl = [hi | lo] ([T, 2E], backward_logits' layout) as GEMM operands with
    row stride 2E: hi (the array itself) and lo (the address E bf16 into its first row)."""
    return grl, grl.data.ptr + grl.shape[1]  # bytes: E bf16


def _rows(E: int) -> int:
    """Rows of the split weight gradient's GEMM: [hi; lo] stacked, or (the A/B path) E."""
    return 2 * E if STACKED else E


def weight_gradient_splits(T: int, E: int, H: int) -> int:
    """Pieces the router weight gradient's token reduction is split into (1: none). Split, it runs
    as one GEMM of 2E rows (hi and lo stacked) so that each token of x is read once; alone such a
    GEMM would fill only 2E / 128 rows of output tiles, so the tokens are split until the GPU is
    full, keeping at least _SPLIT_ROWS tokens per piece."""
    splits = max(1, min(device_sms() // (cdiv(_rows(E), 128) * cdiv(H, 128)), T // _SPLIT_ROWS))
    if summed_in_the_gemm(T, E):
        splits = min(splits, 4)  # a cluster holds the 2 x splits (piece, half) tiles: <= 8 CTAs
    return splits


# The pieces are summed inside the GEMM up to this many tokens, through global memory above it.
# SOL-080 A/B (bench/NOTES.md v0.9): in the GEMM 5-8 us faster at T = 997 .. 3089 (no sum_splits
# launch at the end of the call), 7-15 us slower at T >= 3719, where the clusters of 4 are not all
# resident beside the dgrad, gemm() halves the pieces, and each CTA's reduction doubles.
_CLUSTER_SUM_MAX_T = 3200


def summed_in_the_gemm(T: int, E: int) -> bool:
    """Whether split pieces are summed inside the GEMM (a cluster per output tile,
    gemm(sum_groups_and_halves)) rather than through global memory."""
    return (STACKED and SUM_IN_GEMM and _gemm.SPLIT_CLUSTER and E % 128 == 0
            and T <= _CLUSTER_SUM_MAX_T)


def weight_gradient_pieces_shape(T: int, E: int, H: int):
    """Shape of the fp32 pieces weight_gradient sums (None when it writes out directly)."""
    splits = weight_gradient_splits(T, E, H)
    return None if splits == 1 or summed_in_the_gemm(T, E) else (splits, _rows(E), H)


def weight_gradient(grl, x, out, partial=None, cancel=None) -> None:
    """dL/dW_router [E, H] fp32 = (hi + lo)^T x into out, grl = [hi | lo] ([T, 2E] bf16, see
    backward_logits), in one of three forms by shape:
    - one piece (weight_gradient_splits == 1): one GEMM over the two reductions hi^T x and lo^T x.
    - E a multiple of 128 and T <= _CLUSTER_SUM_MAX_T (summed_in_the_gemm): one K-grouped GEMM of
      the stacked rows [hi^T; lo^T] x in token pieces; each CTA multiplies both halves' rows of its
      piece against one load of x and adds them (gemm.PAIRED_HALVES; else a CTA per (piece, half)),
      and the pieces of each output tile form a cluster that adds them in order over distributed
      shared memory.
    - else: the stacked K-grouped GEMM into fp32 pieces [splits, 2E, H] in global memory (given
      as partial, or allocated here), added by a kernel in (piece, half) order.
    Each form adds in a fixed order (deterministic); stacked, each piece reads its tokens of x
    once. cancel: see gemm()."""
    T, E2 = grl.shape
    E, H = E2 // 2, x.shape[1]
    halves = [Segment(half, E2, x, H, k=T) for half in hi_lo(grl)]
    splits = weight_gradient_splits(T, E, H)
    if splits == 1:  # (its halves as a 2-CTA cluster instead measured 1.5-3 us slower at T < 512)
        gemm(m=E, n=H, segments=halves, a_kmajor=False, b_kmajor=False, out=out, ldc=H,
             epilogue="f32", cancel=cancel)
        return
    if summed_in_the_gemm(T, E):
        gemm(m=E2, n=H, segments=halves[:1], a_kmajor=False, b_kmajor=False, out=out, ldc=H,
             epilogue="f32", grouping="k", num_groups=splits, sum_groups_and_halves=True,
             cancel=cancel)
        return
    shape = weight_gradient_pieces_shape(T, E, H)
    _, rows, _ = shape
    if partial is None:
        partial = cp.empty(shape, cp.float32)
    # Stacked, the hi segment's 2E rows are [hi; lo]: one segment reads each token of x once.
    gemm(m=rows, n=H, segments=halves[:1] if STACKED else halves, a_kmajor=False, b_kmajor=False,
         out=partial, ldc=H, epilogue="f32", grouping="k", num_groups=splits,
         c_group_stride=rows * H, cancel=cancel)
    n = E * H
    _launch.launch(_module(), "sum_splits", (grid_stride_blocks(n),), (256,),
                   [ptr(partial), i32(splits * rows // E), i64(n), ptr(out), ptr(cancel)])


settings.watch(__name__)  # (gpu/sol080.py keeps its plans until a setting changes)
