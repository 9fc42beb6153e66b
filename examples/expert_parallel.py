"""Expert-parallel MoE layer over W processes of one host: NumPy ranks over queues, or with --gpu
one GPU per rank over NCCL (CuPy arrays, cupy_moe.parallel.NcclGroup; no PyTorch).

Every rank builds the same global inputs from a seed, keeps its T/W tokens and its E/W experts,
and runs moe_forward / moe_backward with its group; the parent checks that the ranks together
computed what one process computes on the global inputs (the NumPy reference).
Usage: python examples/expert_parallel.py [--world 4] [--tokens 96] [--gpu]
"""
import argparse
import sys
import time

import numpy as np

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.parallel import run_world
from cupy_moe.testing import make_moe_inputs, relative_error

CFG = MoEConfig(hidden_size=64, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                n_group=2, topk_group=2)
EXPERT_WEIGHTS = ("expert_gate_weight", "expert_up_weight", "expert_down_weight")


def global_inputs(tokens, seed):
    args = make_moe_inputs(CFG, tokens, seed=seed)
    dy = np.random.default_rng(seed + 1).standard_normal((tokens, CFG.hidden_size)).astype(
        cupy_moe.bfloat16)
    return args, dy


def shard(n, world_size, rank):
    cuts = np.linspace(0, n, world_size + 1).astype(int)
    return slice(cuts[rank], cuts[rank + 1])


def rank_step(group, tokens, seed, gpu=False):
    """One rank: its tokens, its experts, forward + backward through the group (host results)."""
    args, dy = global_inputs(tokens, seed)
    if gpu:
        import cupy as cp
        args = {k: None if v is None else cp.asarray(v) for k, v in args.items()}
        dy = cp.asarray(dy)
    mine = shard(tokens, group.world_size, group.rank)
    el = CFG.n_routed_experts // group.world_size
    args["hidden_states"] = args["hidden_states"][mine]
    for f in EXPERT_WEIGHTS:
        args[f] = args[f][group.rank * el:(group.rank + 1) * el]
    start = time.perf_counter()
    out, ctx = cupy_moe.moe_forward(**args, config=CFG, ep_group=group)
    grads = cupy_moe.moe_backward(dy[mine], ctx)._asdict()
    if gpu:
        out, grads = out.get(), {k: None if v is None else v.get() for k, v in grads.items()}
    return out, grads, time.perf_counter() - start


def check_world(world_size, tokens, seed=0, gpu=False):
    """Run the world; returns (worst relative error vs one process, per-rank seconds)."""
    results = run_world(world_size, rank_step, tokens, seed, gpu,
                        transport="nccl" if gpu else "queue")
    args, dy = global_inputs(tokens, seed)
    ref_out, ref_ctx = cupy_moe.moe_forward(**args, config=CFG)
    ref = cupy_moe.moe_backward(dy, ref_ctx)._asdict()
    f = lambda a: np.asarray(a, np.float64)
    errors = [relative_error(f(np.concatenate([r[0] for r in results])), f(ref_out)),
              relative_error(f(np.concatenate([r[1]["hidden_states"] for r in results])),
                             f(ref["hidden_states"]))]
    for name in EXPERT_WEIGHTS:
        errors.append(relative_error(f(np.concatenate([r[1][name] for r in results])), f(ref[name])))
    for name in ("router_weight", "shared_expert_gate_weight"):  # replicated: shares sum up
        errors.append(relative_error(sum(f(r[1][name]) for r in results), f(ref[name])))
    return max(errors), [r[2] for r in results]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--gpu", action="store_true", help="one GPU per rank, NCCL between them")
    a = ap.parse_args(argv)
    err, seconds = check_world(a.world, a.tokens, gpu=a.gpu)
    print(f"{a.world} {'GPU' if a.gpu else 'CPU'} ranks, {a.tokens} tokens, {CFG.n_routed_experts} experts: worst relative "
          f"error vs one process {err:.1e}")
    for r, s in enumerate(seconds):
        print(f"  rank {r}: {len(range(*shard(a.tokens, a.world, r).indices(a.tokens)))} tokens, "
              f"{CFG.n_routed_experts // a.world} experts, forward+backward {s * 1e3:.1f} ms")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
