"""Routing sort on the GPU: histogram -> scan -> stable placement (cuda_src/routing.cu)."""
from __future__ import annotations

from typing import NamedTuple

import cupy as cp

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


def find_bad_topk_rows(topk_indices, n_experts: int):
    """(first row with an out-of-range index, first row repeating an expert), None where none."""
    T, K = topk_indices.shape
    status = cp.full(2, 2**31 - 1, cp.int32)
    _launch.launch(_build.load_module("routing.cu"), "check_topk_indices", (cdiv(T, 256),), (256,),
                   [ptr(topk_indices), i32(T), i32(K), i32(n_experts), ptr(status)])
    bad = status.get()  # the one host sync of the check
    return tuple(None if int(v) == 2**31 - 1 else int(v) for v in bad)
