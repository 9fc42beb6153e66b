"""Routing sort on the GPU: histogram -> scan -> stable placement (cuda_src/routing.cu)."""
from __future__ import annotations

from typing import NamedTuple

import cupy as cp
import numpy as np

from .. import _build, _launch
from .._launch import cdiv, i32, ptr

CHUNK = 2048  # kChunk in routing.cu


class Routing(NamedTuple):
    sorted_slots: object       # [N] int32, flat slot of each expert-sorted row
    slot_rows: object          # [N] int32, sorted row of each slot
    expert_offsets: object     # [E+1] int32
    tokens_per_expert: object  # [E] int64


def sort(topk_indices, n_experts: int) -> Routing:
    mod = _build.load_module("routing.cu")
    n = topk_indices.size
    E = n_experts
    chunks = max(1, cdiv(n, CHUNK))
    counts = cp.empty((chunks, E), cp.int32)
    base = cp.empty((chunks, E), cp.int32)
    offsets = cp.empty(E + 1, cp.int32)
    per_expert = cp.empty(E, cp.int64)
    slots = cp.empty(n, cp.int32)
    rows = cp.empty(n, cp.int32)
    if n == 0:
        offsets.fill(0)
        per_expert.fill(0)
        return Routing(slots, rows, offsets, per_expert)
    _launch.launch(mod, "routing_histogram", (chunks,), (256,),
                   [ptr(topk_indices), i32(n), i32(E), ptr(counts)], 4 * E)
    _launch.launch(mod, "routing_scan", (1,), (256,),
                   [ptr(counts), i32(chunks), i32(E), ptr(base), ptr(offsets), ptr(per_expert)], 4 * E)
    _launch.launch(mod, "routing_place", (chunks,), (32,),
                   [ptr(topk_indices), i32(n), i32(E), ptr(base), ptr(slots), ptr(rows)], 4 * E)
    return Routing(slots, rows, offsets, per_expert)


_NONE = 0x7F7F7F7F  # the status words' fill (memset bytes 0x7F): above every row index
_check_buffers = {}  # (device, stream) -> (device status [2] int32, pinned host copy)


def start_topk_check(topk_indices, n_experts: int):
    """Launch the top-k index check on the current stream (one kernel; its two status words go
    to pinned host memory asynchronously) and return a function that waits for it and returns
    (first row with an out-of-range index, first row repeating an expert), None where none. The
    caller can prepare its launches in between; the wait is the check's one host sync."""
    stream = cp.cuda.get_current_stream()
    key = (cp.cuda.Device().id, stream.ptr)
    buffers = _check_buffers.get(key)
    if buffers is None:
        pinned = cp.cuda.alloc_pinned_memory(8)
        buffers = _check_buffers[key] = (cp.empty(2, cp.int32), pinned,
                                         np.frombuffer(pinned, np.int32, 2))
    status, _, host = buffers
    T, K = topk_indices.shape
    cp.cuda.runtime.memsetAsync(status.data.ptr, 0x7F, 8, stream.ptr)
    _launch.launch(_build.load_module("routing.cu"), "check_topk_indices", (cdiv(T, 256),), (256,),
                   [ptr(topk_indices), i32(T), i32(K), i32(n_experts), ptr(status)])
    cp.cuda.runtime.memcpyAsync(host.ctypes.data, status.data.ptr, 8,
                                cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)

    def result():
        stream.synchronize()
        return tuple(None if int(v) == _NONE else int(v) for v in host)
    return result
