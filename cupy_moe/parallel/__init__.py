"""Expert parallelism: the routed experts sharded over W ranks, token rows moved by all-to-all.

Each rank holds E / W experts (rank r owns experts r*E/W ... (r+1)*E/W - 1) and its own tokens;
the router and the shared expert are replicated (data parallel: their gradients, and the
routed-expert weights' gradients of replicated experts if any, are the caller's to all-reduce).
Pass a group as moe_forward(..., ep_group=group); moe_backward follows the context.
"""
from .groups import (ExpertParallelGroup, NcclGroup, QueueGroup, SingleRankGroup, ThreadGroup,
                     thread_groups)
from .launch import run_world

__all__ = ["ExpertParallelGroup", "NcclGroup", "QueueGroup", "SingleRankGroup", "ThreadGroup",
           "run_world", "thread_groups"]
