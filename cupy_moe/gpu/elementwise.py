"""Launchers of the memory-bound stages: the row gather, SwiGLU forward/backward and the two
combines."""
from __future__ import annotations

import cupy as cp

from .. import _build, _launch
from .._arrays import bfloat16
from .._launch import cdiv, grid_stride_blocks, i32, i64, ptr


def gather_rows(src, index, div):
    """dst[i] = src[index[i] // div] (rows of a C-contiguous 2-D array; index int32)."""
    rows, width = index.shape[0], src.shape[1]
    dst = cp.empty((rows, width), src.dtype)
    _launch.launch(_build.load_module("gather_rows.cu"), "gather_rows",
                   (grid_stride_blocks(rows * 32),), (256,),  # a warp per row
                   [ptr(src), ptr(index), i32(div), i32(rows), i32(width), ptr(dst)])
    return dst


def rows_by_expert(src, slot_rows, K, out=None):
    """[T * K, width]: row slot_rows[t * K + k] is src[t] (the experts' sorted order; slot_rows
    int32 [T * K], a permutation of the rows): gather_rows(src, sorted_slots, K), as a scatter
    that reads each token row once. out: the array to write (else a new one)."""
    tokens, width = src.shape
    dst = cp.empty((tokens * K, width), src.dtype) if out is None else out
    _launch.launch(_build.load_module("gather_rows.cu"), "scatter_rows",
                   (grid_stride_blocks(tokens * 32),), (256,),  # a warp per token
                   [ptr(src), ptr(slot_rows), i32(K), i32(tokens), i32(width), ptr(dst)])
    return dst


def swiglu_forward(gate, up):
    a = cp.empty_like(gate)
    n = gate.size
    _launch.launch(_build.load_module("swiglu.cu"), "swiglu_forward",
                   (grid_stride_blocks(cdiv(n, 8)),), (256,), [ptr(gate), ptr(up), ptr(a), i64(n)])
    return a


def row_partial_sums(partial, out) -> None:
    """out[r] = the sum of row r of partial ([rows, cols] fp32), left to right (a fixed order)."""
    rows, cols = partial.shape
    if rows:
        _launch.launch(_build.load_module("swiglu.cu"), "row_partial_sums", (grid_stride_blocks(rows),),
                       (256,), [ptr(partial), i32(rows), i32(cols), ptr(out)])


def swiglu_backward(da_unweighted, gate, up, act=None, weights=None, row_index=None, out=None):
    """(dg, du, dw, aw) from the unweighted activation gradient; dw = <da', a> per row and
    aw = bf16(w a) only for routed experts (weights given; w of row r = weights[row_index[r]]),
    else None. out: the four arrays to write (None entries where not wanted) instead of new ones."""
    rows, width = gate.shape
    routed = weights is not None
    if out is None:
        out = (cp.empty_like(gate), cp.empty_like(gate),
               cp.empty(rows, cp.float32) if routed else None, cp.empty_like(gate) if routed else None)
    dg, du, dw, aw = out
    _launch.launch(_build.load_module("swiglu.cu"), "swiglu_backward", (rows,), (256,),
                   [ptr(da_unweighted), ptr(gate), ptr(up), ptr(act), ptr(weights), ptr(row_index),
                    i32(rows), i32(width), ptr(dg), ptr(du), ptr(dw), ptr(aw)])
    return dg, du, dw, aw


def _combine_blocks(T, H):
    return cdiv(T * H // (8 if H % 8 == 0 else 1), 256)  # one thread per 8 elements when H allows


def combine_forward(y_sorted, slot_rows, weights, y_shared):
    T, K = weights.shape
    H = y_sorted.shape[1]
    out = cp.empty((T, H), bfloat16)
    _launch.launch(_build.load_module("combine.cu"), "combine_forward", (_combine_blocks(T, H),), (256,),
                   [ptr(y_sorted), ptr(slot_rows), ptr(weights), ptr(y_shared), i32(T), i32(H),
                    i32(K), ptr(out)])
    return out


def combine_backward(dx_sorted, slot_rows, dx_rest, K, out=None):
    T, H = dx_rest.shape
    dx = cp.empty((T, H), bfloat16) if out is None else out
    _launch.launch(_build.load_module("combine.cu"), "combine_backward", (_combine_blocks(T, H),), (256,),
                   [ptr(dx_sorted), ptr(slot_rows), ptr(dx_rest), i32(T), i32(H), i32(K), ptr(dx)])
    return dx
