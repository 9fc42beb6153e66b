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


_NO_ROW = 0x7FFFFFFF  # kNoRow in routing.cu: no bad row
_check_state = {}  # (device, stream) -> _CheckBuffers


class _CheckBuffers:
    """The top-k check's device scratch ([0..2] reset by the kernel itself after every check, [3]
    the last verdict) and its host-mapped report [first out-of-range row, first repeating row,
    done flag] (cuda_src/common/topk_check.cuh)."""

    def __init__(self):
        self.scratch = cp.array([_NO_ROW, _NO_ROW, 0, 0], cp.int32)
        self.pinned = cp.cuda.alloc_pinned_memory(3 * 4)
        self.report = np.frombuffer(self.pinned, np.int32, 3)
        self.report[:] = (_NO_ROW, _NO_ROW, 0)
        # Pinned memory is mapped into the device's address space (unified addressing).
        self.device_report = cp.cuda.runtime.pointerGetAttributes(self.pinned.ptr).devicePointer


class PendingCheck:
    """A top-k check of the current stream, about to be launched. kernel_args: the (scratch,
    report) pointers of the kernel that runs it (check_topk_indices, or SOL-080's router kernel);
    cancel: the device address of its verdict (nonzero: bad), for the launches enqueued after it
    to read (gemm's cancel); result() waits for the host's copy of the verdict and returns (first
    row with an out-of-range index, first row repeating an expert), None where none. Whoever
    launches the check waits for it (result(), or settle() when the call fails on its way), so
    the next check's done flag cannot be set by this one. buffers: what a replay of the kernel
    (a captured graph) must keep alive."""

    def __init__(self, stream, buffers: _CheckBuffers):
        self._stream, self._report, self.buffers = stream, buffers.report, buffers
        self.kernel_args = [ptr(buffers.scratch), ptr(buffers.device_report)]
        self.cancel = buffers.scratch.data.ptr + 3 * 4

    def result(self):
        report = self._report
        while report[2] == 0:
            if self._stream.done and report[2] == 0:  # finished (or failed) without a verdict
                self._stream.synchronize()  # raises the stream's error, if any
                raise RuntimeError("the top-k index check finished without reporting")
        return tuple(None if int(v) == _NO_ROW else int(v) for v in report[:2])

    def settle(self) -> None:
        """Wait until nothing this check's call enqueued can still write (a call that raised
        before result()); errors of the stream are left to the exception under way."""
        try:
            self._stream.synchronize()
        except Exception:
            pass


def next_topk_check() -> PendingCheck:
    """The current stream's next top-k check: clears its done flag; the caller launches the
    kernel that runs it (with kernel_args) before anything else reads the verdict."""
    stream = cp.cuda.get_current_stream()
    key = (cp.cuda.Device().id, stream.ptr)
    buffers = _check_state.get(key)
    if buffers is None:
        if len(_check_state) >= 16:
            # No check still writes into what is dropped; a captured graph that may replay one
            # holds its buffers itself (IndexCheck.keep), so their addresses are not reused.
            cp.cuda.Device().synchronize()
            _check_state.clear()
        buffers = _check_state[key] = _CheckBuffers()
    buffers.report[2] = 0
    return PendingCheck(stream, buffers)


def start_topk_check(topk_indices, n_experts: int) -> PendingCheck:
    """Launch the top-k index check on the current stream: one kernel, whose verdict lands in
    device memory (for the launches that follow) and in host-mapped memory (for the host)."""
    pending = next_topk_check()
    T, K = topk_indices.shape
    _launch.launch(_build.load_module("routing.cu"), "check_topk_indices", (cdiv(T, 256),), (256,),
                   [ptr(topk_indices), i32(T), i32(K), i32(n_experts)] + pending.kernel_args)
    return pending
