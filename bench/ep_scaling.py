"""Expert-parallel scaling: tokens per second per GPU of forward + backward at GLM-4.5-Air size,
T tokens per rank, W = 1, 2, 4 ranks (one GPU each, NCCL; W larger than the GPU count is
skipped), next to the single-GPU layer without a group. CUDA events, median of --reps.
Usage: PYTHONPATH=. python bench/ep_scaling.py [--tokens 4096] [--reps 10] [--worlds 1,2,4]"""
import argparse
import sys

import numpy as np


def _inputs(T, seed, cfg, rank=0, world=1):
    import cupy as cp

    from cupy_moe.testing import make_moe_inputs

    args = make_moe_inputs(cfg, T, seed=seed + rank, xp=cp, routing="random")
    El = cfg.n_routed_experts // world
    for f in ("expert_gate_weight", "expert_up_weight", "expert_down_weight"):
        args[f] = cp.ascontiguousarray(args[f][rank * El:(rank + 1) * El])
    dy = make_moe_inputs(cfg, T, seed=seed + 100 + rank, xp=cp)["hidden_states"]
    return args, dy


def _time(step, reps):
    import cupy as cp

    step()
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def rank_main(group, T, reps):
    import cupy_moe

    cfg = cupy_moe.MoEConfig.glm45_air()
    args, dy = _inputs(T, 0, cfg, group.rank, group.world_size)

    def step():
        out, ctx = cupy_moe.moe_forward(**args, config=cfg, ep_group=group)
        cupy_moe.moe_backward(dy, ctx)
    return _time(step, reps)


def _single_gpu(T, reps, group):
    import cupy_moe

    cfg = cupy_moe.MoEConfig.glm45_air()
    args, dy = _inputs(T, 0, cfg)

    def step():
        out, ctx = cupy_moe.moe_forward(**args, config=cfg, ep_group=group)
        cupy_moe.moe_backward(dy, ctx)
    return _time(step, reps)


def main(argv=None):
    import cupy as cp

    from cupy_moe.parallel import SingleRankGroup, run_world

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--worlds", default="1,2,4")
    a = ap.parse_args(argv)
    T = a.tokens
    print(f"GLM-4.5-Air forward + backward, {T} tokens per GPU; median of {a.reps}")
    print(f"{'setup':<34}{'ms':>9}{'tokens/s per GPU':>20}")
    for name, group in (("one GPU, no group", None), ("one GPU, SingleRankGroup", SingleRankGroup())):
        ms = _single_gpu(T, a.reps, group)
        print(f"{name:<34}{ms:9.2f}{T / ms * 1e3:20.0f}")
    cp.get_default_memory_pool().free_all_blocks()
    gpus = cp.cuda.runtime.getDeviceCount()
    for W in (int(w) for w in a.worlds.split(",")):
        if W > gpus:
            print(f"{'W = %d over NCCL' % W:<34}{'skipped: ' + str(gpus) + ' GPU(s)':>29}")
            continue
        ms = max(run_world(W, rank_main, T, a.reps, transport="nccl"))
        print(f"{'W = %d over NCCL (slowest rank)' % W:<34}{ms:9.2f}{T / ms * 1e3:20.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
