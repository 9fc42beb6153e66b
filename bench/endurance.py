"""Endurance: many forward + backward calls at GLM-4.5-Air size with T drawn at random in
[1, 16384]. Checks: no error; no leak (the bytes in use after each call return to the inputs'
baseline); CuPy's caching pool stays within 10% of what the largest call needed (measured first;
the slack is the pool's fragmentation under a mix of sizes, and the largest excess is printed);
every --check-every'th call agrees with the cuBLAS-composed CuPy peer. The peer allocates from a
pool of its own, emptied after each check: it neither counts against ours nor resets it (an
earlier version emptied the default pool after each check, which re-grew it from a smaller call's
sizes and read as fragmentation).
Progress (calls done, seconds, pool size) is printed at every check; --time-limit stops early
(the report then says how many calls ran).
Usage: PYTHONPATH=. python bench/endurance.py [--calls 2000] [--check-every 200] [--seed 0]
       [--time-limit SECONDS]"""
import argparse
import sys
import time

import numpy as np


def main(argv=None):
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import make_moe_inputs, relative_error
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from benchmark import layer_cupy_peer

    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--check-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=float("inf"))
    a = ap.parse_args(argv)
    cfg = cupy_moe.MoEConfig.glm45_air()
    Tmax = 16384
    rng = np.random.default_rng(a.seed)
    full = make_moe_inputs(cfg, Tmax, seed=a.seed, xp=cp, routing="skewed")
    dy_full = make_moe_inputs(cfg, Tmax, seed=a.seed + 1, xp=cp)["hidden_states"]
    pool, peer_pool = cp.get_default_memory_pool(), cp.cuda.MemoryPool()

    def call(T):
        args = dict(full, hidden_states=full["hidden_states"][:T])
        out, ctx = cupy_moe.moe_forward(**args, config=cfg)
        return out, ctx, cupy_moe.moe_backward(dy_full[:T], ctx)

    call(Tmax)  # the largest call first: its need bounds the pool from here on
    cp.cuda.Device().synchronize()
    bound, baseline = pool.total_bytes(), pool.used_bytes()
    worst, checks, errors, peak, peak_call = 0.0, 0, [], bound, -1
    start = time.perf_counter()
    for i in range(a.calls):
        T = int(rng.integers(1, Tmax + 1))
        out, ctx, g = call(T)
        if i % a.check_every == 0:
            with cp.cuda.using_allocator(peer_pool.malloc):
                p = layer_cupy_peer(dy_full[:T], ctx)
            e = max(relative_error(g.hidden_states, p[0]), relative_error(g.expert_gate_weight, p[2]),
                    relative_error(g.expert_down_weight, p[4]))
            worst, checks = max(worst, e), checks + 1
            if not e < 1e-2:
                errors.append((i, T, e))
            del p
            peer_pool.free_all_blocks()
            print(f"  call {i}: {time.perf_counter() - start:.1f} s, pool "
                  f"{pool.total_bytes() / 2**30:.2f} GiB, worst error so far {worst:.1e}", flush=True)
        del out, ctx, g
        if pool.total_bytes() > peak:
            peak, peak_call = pool.total_bytes(), i
        if pool.used_bytes() != baseline:
            errors.append((i, T, f"{pool.used_bytes() - baseline} bytes still in use after the call"))
            break
        if pool.total_bytes() > 1.10 * bound:
            errors.append((i, T, f"pool grew to {pool.total_bytes()} > 1.1 x {bound}"))
            break
        if time.perf_counter() - start > a.time_limit:
            break
    cp.cuda.Device().synchronize()
    print(f"endurance: {i + 1} of {a.calls} calls in {time.perf_counter() - start:.0f} s, T uniform in [1, {Tmax}], largest call's pool "
          f"{bound / 2**30:.2f} GiB, peak {peak / 2**30:.2f} GiB (+{100 * (peak / bound - 1):.1f}%, "
          f"first reached at call {peak_call}), "
          f"final {pool.total_bytes() / 2**30:.2f} GiB, in use after calls = inputs' baseline; "
          f"{checks} spot checks vs the CuPy peer, "
          f"worst relative error {worst:.1e}; failures: {errors or 'none'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
