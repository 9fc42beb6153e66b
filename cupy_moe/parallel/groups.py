"""Transports of the expert-parallel layer: an all-to-all of small count tables and of row blocks.

A group is what one rank sees: its rank, the world size, and two collectives that every rank of
the group calls in the same order:
  exchange_counts(table [W, n] int64) -> [W, n]: row d goes to rank d; row s of the result came
      from rank s.
  exchange_rows(rows [sum(send_counts), ...], send_counts [W], recv_counts [W]) -> rows: the
      first send_counts[0] rows go to rank 0, the next send_counts[1] to rank 1, ...; the result
      holds recv_counts[s] rows from each rank s, in rank order.
Rows are NumPy or CuPy arrays (the layer's path); count tables are host integers.
SingleRankGroup is W = 1 (every exchange is the identity), ThreadGroup simulates W ranks as
threads of one process (tests; with CuPy rows, W ranks sharing one GPU), QueueGroup connects W
processes of one host (CPU; launch.run_world), NcclGroup W processes with one GPU each
(launch.run_world(..., transport="nccl")).
"""
from __future__ import annotations

import os
import threading

import numpy as np

from .._arrays import is_cupy_array


def _xp(rows):
    if is_cupy_array(rows):
        import cupy
        return cupy
    return np


class ExpertParallelGroup:
    """Interface of a transport (see the module docstring)."""

    rank: int
    world_size: int
    array_modules = ("numpy", "cupy")  # which arrays' rows it moves

    def exchange_counts(self, table):
        raise NotImplementedError

    def exchange_rows(self, rows, send_counts, recv_counts):
        raise NotImplementedError


class SingleRankGroup(ExpertParallelGroup):
    """W = 1: one rank owns every expert; the layer runs the expert-parallel code path with
    identity exchanges."""

    rank, world_size = 0, 1

    def exchange_counts(self, table):
        return np.array(table, dtype=np.int64, copy=True)

    def exchange_rows(self, rows, send_counts, recv_counts):
        return rows.copy()


class _BlockAllToAll(ExpertParallelGroup):
    """Both exchanges over one primitive, _all_to_all(blocks): blocks[d] goes to rank d, the result
    holds one block from every rank in rank order. Blocks are copies, never views of the sender's
    arrays."""

    def _all_to_all(self, blocks):
        raise NotImplementedError

    def exchange_counts(self, table):
        table = np.asarray(table, dtype=np.int64)
        return np.stack(self._all_to_all([table[d].copy() for d in range(self.world_size)]))

    def exchange_rows(self, rows, send_counts, recv_counts):
        ends = np.cumsum(send_counts)
        got = self._all_to_all([rows[e - c:e].copy() for c, e in zip(send_counts, ends)])
        for s, (block, n) in enumerate(zip(got, recv_counts)):
            if len(block) != n:
                raise RuntimeError(f"rank {self.rank}: expected {n} rows from rank {s}, got {len(block)}")
        return _xp(rows).concatenate(got)


class _Exchange:
    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size)
        self.boxes = [None] * world_size


class ThreadGroup(_BlockAllToAll):
    """One rank of W simulated in threads of one process (thread_groups(W) makes all W)."""

    def __init__(self, exchange: _Exchange, rank: int, world_size: int):
        self._x, self.rank, self.world_size = exchange, rank, world_size

    def _all_to_all(self, blocks):
        x = self._x
        x.boxes[self.rank] = blocks
        x.barrier.wait()
        got = [x.boxes[s][self.rank] for s in range(self.world_size)]
        x.barrier.wait()  # nobody overwrites a box before everyone has read theirs
        return got


def thread_groups(world_size: int):
    """The W groups of one simulated expert-parallel world (one per thread)."""
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    exchange = _Exchange(world_size)
    return [ThreadGroup(exchange, r, world_size) for r in range(world_size)]


class QueueGroup(_BlockAllToAll):
    """One rank of W processes on one host, exchanging through multiprocessing queues (one inbox
    per rank). A CPU transport for the NumPy path and for testing launchers; an NCCL group takes
    its place on GPUs. Messages carry (collective number, source), so a fast rank that is already
    one collective ahead never confuses a slow one."""

    array_modules = ("numpy",)

    def __init__(self, inboxes, rank: int):
        self._inboxes, self.rank, self.world_size = inboxes, rank, len(inboxes)
        self._seq = 0
        self._early = {}

    def _all_to_all(self, blocks):
        seq, self._seq = self._seq, self._seq + 1
        for d, block in enumerate(blocks):
            if d != self.rank:
                self._inboxes[d].put((seq, self.rank, block))
        got = {self.rank: blocks[self.rank]}
        while len(got) < self.world_size:
            key = next((k for k in self._early if k[0] == seq), None)
            if key is not None:
                got[key[1]] = self._early.pop(key)
                continue
            s, src, block = self._inboxes[self.rank].get(timeout=600)
            if s == seq:
                got[src] = block
            else:
                self._early[(s, src)] = block
        return [got[s] for s in range(self.world_size)]


def p2p_schedule(rank: int, send_counts, recv_counts, row_bytes: int):
    """The transfers of one rank's all-to-all of row blocks (see exchange_rows): its own block as
    one local copy, then a send and a receive per other rank with rows, as (kind, peer, source
    byte offset, destination byte offset, bytes) with kind 'copy', 'send' or 'recv' (offsets into
    the rank's send buffer for copy/send, into its receive buffer for copy/recv)."""
    send_counts = np.asarray(send_counts, dtype=np.int64)
    recv_counts = np.asarray(recv_counts, dtype=np.int64)
    if send_counts[rank] != recv_counts[rank]:
        raise RuntimeError(f"rank {rank}: sends itself {send_counts[rank]} rows but expects "
                           f"{recv_counts[rank]}")
    s_off = np.concatenate([[0], np.cumsum(send_counts)]) * row_bytes
    r_off = np.concatenate([[0], np.cumsum(recv_counts)]) * row_bytes
    out = []
    if send_counts[rank]:
        out.append(("copy", rank, int(s_off[rank]), int(r_off[rank]), int(send_counts[rank] * row_bytes)))
    for peer in range(len(send_counts)):
        if peer == rank:
            continue
        if send_counts[peer]:
            out.append(("send", peer, int(s_off[peer]), 0, int(send_counts[peer] * row_bytes)))
        if recv_counts[peer]:
            out.append(("recv", peer, 0, int(r_off[peer]), int(recv_counts[peer] * row_bytes)))
    return out


class NcclGroup(ExpertParallelGroup):
    """One rank of W processes with one GPU each, over NCCL (cupy.cuda.nccl): both exchanges are
    grouped point-to-point sends and receives of bytes on the current CuPy stream (p2p_schedule),
    the rank's own block a device-to-device copy. Every rank creates its group with the same
    unique_id (NcclGroup.unique_id() on one rank, passed to the others; launch.run_world does
    this). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless the caller set it): the
    exchanges are point-to-point and the machines here require it."""

    array_modules = ("cupy",)

    def __init__(self, rank: int, world_size: int, unique_id):
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        from cupy.cuda import nccl

        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size = {world_size}, got {rank}")
        self._nccl = nccl
        self.rank, self.world_size = rank, world_size
        self.comm = nccl.NcclCommunicator(world_size, unique_id, rank)

    @staticmethod
    def unique_id():
        from cupy.cuda import nccl

        return nccl.get_unique_id()

    def exchange_counts(self, table):
        import cupy

        table = np.ascontiguousarray(table, dtype=np.int64)
        send = cupy.asarray(table)
        recv = cupy.empty_like(send)
        ones = np.ones(self.world_size, np.int64)
        self._all_to_all(send, recv, ones, ones, table.shape[1] * 8)
        return recv.get()

    def exchange_rows(self, rows, send_counts, recv_counts):
        import cupy

        rows = cupy.ascontiguousarray(rows)
        out = cupy.empty((int(np.sum(recv_counts)),) + rows.shape[1:], rows.dtype)
        row_bytes = rows.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
        self._all_to_all(rows, out, send_counts, recv_counts, row_bytes)
        return out

    def _all_to_all(self, src, dst, send_counts, recv_counts, row_bytes):
        import cupy

        nccl, stream = self._nccl, cupy.cuda.get_current_stream().ptr
        schedule = p2p_schedule(self.rank, send_counts, recv_counts, row_bytes)
        for kind, _, s, d, n in schedule:
            if kind == "copy":
                cupy.cuda.runtime.memcpyAsync(dst.data.ptr + d, src.data.ptr + s, n,
                                              cupy.cuda.runtime.memcpyDeviceToDevice, stream)
        nccl.groupStart()
        try:
            for kind, peer, s, d, n in schedule:
                if kind == "send":
                    self.comm.send(src.data.ptr + s, n, nccl.NCCL_UINT8, peer, stream)
                elif kind == "recv":
                    self.comm.recv(dst.data.ptr + d, n, nccl.NCCL_UINT8, peer, stream)
        finally:
            nccl.groupEnd()
