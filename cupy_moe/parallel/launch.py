"""Start W processes on one host, one rank each, and collect what each returns.

    results = run_world(W, fn, *args)                    # CPU ranks over queues (QueueGroup)
    results = run_world(W, fn, *args, transport="nccl")  # rank r on GPU r over NCCL (NcclGroup)

fn(group, *args) runs in every rank's process. Ranks are fresh processes (the 'spawn' start
method: no state inherited from the caller, as GPU programs need); fn must be importable (a
module-level function) and return something picklable (host arrays). No PyTorch involved.
"""
from __future__ import annotations

import multiprocessing as mp

from .groups import NcclGroup, QueueGroup

TRANSPORTS = ("queue", "nccl")


def _rank_main(fn, transport, link, rank, world_size, results, args):
    try:
        if transport == "nccl":
            import cupy

            cupy.cuda.Device(rank).use()
            group = NcclGroup(rank, world_size, link)
        else:
            group = QueueGroup(link, rank)
        results.put((rank, True, fn(group, *args)))
    except BaseException as exc:  # reported by the parent, with the rank
        results.put((rank, False, f"{type(exc).__name__}: {exc}"))


def run_world(world_size: int, fn, *args, transport: str = "queue", timeout: float = 600.0):
    """Run fn(group, *args) on world_size ranks; returns the results in rank order."""
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport: expected one of {TRANSPORTS}, got {transport!r}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    if transport == "nccl":
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < world_size:
            raise ValueError(f"world_size: {world_size} ranks need as many GPUs, this host has "
                             f"{cupy.cuda.runtime.getDeviceCount()}")
        links = [NcclGroup.unique_id()] * world_size
    else:
        inboxes = [ctx.Queue() for _ in range(world_size)]
        links = [inboxes] * world_size
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, transport, links[r], r, world_size, results, args), daemon=True)
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
