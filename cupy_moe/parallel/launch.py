"""Start W processes on one host, one rank each, and collect what each returns.

    results = run_world(W, fn, *args)   # fn(group, *args) runs in every rank's process

Ranks are fresh processes (the 'spawn' start method: no state inherited from the caller, as GPU
programs need), connected by a QueueGroup. fn must be importable (a module-level function).
"""
from __future__ import annotations

import multiprocessing as mp

from .groups import QueueGroup


def _rank_main(fn, inboxes, rank, results, args):
    try:
        results.put((rank, True, fn(QueueGroup(inboxes, rank), *args)))
    except BaseException as exc:  # reported by the parent, with the rank
        results.put((rank, False, f"{type(exc).__name__}: {exc}"))


def run_world(world_size: int, fn, *args, timeout: float = 600.0):
    """Run fn(group, *args) on world_size ranks; returns the results in rank order."""
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(world_size)]
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, inboxes, r, results, args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out, failures = [None] * world_size, []
    try:
        for _ in range(world_size):
            rank, ok, value = results.get(timeout=timeout)
            if ok:
                out[rank] = value
            else:
                failures.append(f"rank {rank}: {value}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not failures else 0.1)
            if p.is_alive():
                p.terminate()
    if failures:
        raise RuntimeError("; ".join(failures))
    return out
