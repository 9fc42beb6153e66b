"""Transports of the expert-parallel layer: an all-to-all of small count tables and of row blocks.

A group is what one rank sees: its rank, the world size, and two collectives that every rank of
the group calls in the same order:
  exchange_counts(table [W, n] int64) -> [W, n]: row d goes to rank d; row s of the result came
      from rank s.
  exchange_rows(rows [sum(send_counts), ...], send_counts [W], recv_counts [W]) -> rows: the
      first send_counts[0] rows go to rank 0, the next send_counts[1] to rank 1, ...; the result
      holds recv_counts[s] rows from each rank s, in rank order.
SingleRankGroup is W = 1 (every exchange is the identity), ThreadGroup simulates W ranks as
threads of one process (tests), QueueGroup connects W processes of one host (launch.run_world); an
NCCL group for one process per GPU is the next step (issue 7) and plugs in behind the same calls.
"""
from __future__ import annotations

import threading

import numpy as np


class ExpertParallelGroup:
    """Interface of a transport (see the module docstring)."""

    rank: int
    world_size: int

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
        return np.concatenate(got)


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
