"""Expert parallelism on the GPU: W = 1 through the expert-parallel code path (SingleRankGroup
and, where NCCL is available, NcclGroup) gives bitwise the single-GPU results; W = 2 and 4 ranks
simulated as threads sharing one GPU (ThreadGroup) give the single-GPU results on the same global
inputs; on a machine with several GPUs, W processes over NCCL do too."""
import os
import sys

import numpy as np
import pytest

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.parallel import NcclGroup, SingleRankGroup, run_world
from cupy_moe.testing import make_moe_inputs, relative_error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_parallel import EXPERT_FIELDS, _run_world  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]

# Odd sizes (the portable main loop) and 16-byte aligned ones (the Hopper main loop).
CONFIGS = {
    "odd": MoEConfig(hidden_size=24, n_routed_experts=8, num_experts_per_tok=3,
                     moe_intermediate_size=6, n_shared_experts=0, n_group=2, topk_group=2,
                     routed_scaling_factor=1.5),
    "aligned": MoEConfig(hidden_size=128, n_routed_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=64, n_group=4, topk_group=2, n_shared_experts=1),
}
GRAD_FIELDS = ("hidden_states", "router_weight") + EXPERT_FIELDS + (
    "shared_expert_gate_weight", "shared_expert_up_weight", "shared_expert_down_weight")


def _global(cfg, T, seed, routing="random"):
    import cupy as cp

    g = make_moe_inputs(cfg, T, seed=seed, routing=routing)
    dy = np.random.default_rng(seed + 1).standard_normal((T, cfg.hidden_size)).astype(
        cupy_moe.bfloat16)
    return {k: None if v is None else cp.asarray(v) for k, v in g.items()}, cp.asarray(dy)


def _one_gpu(cfg, g, dy):
    out, ctx = cupy_moe.moe_forward(**g, config=cfg)
    return out, cupy_moe.moe_backward(dy, ctx)


def _assert_bitwise(a, b, what):
    assert (a is None) == (b is None), what
    if a is not None:
        np.testing.assert_array_equal(a.get().view(np.uint8), b.get().view(np.uint8), err_msg=what)


@pytest.mark.parametrize("cfg_name", sorted(CONFIGS))
@pytest.mark.parametrize("routing", ["random", "one_expert"])
def test_single_rank_group_is_bitwise_one_gpu(cfg_name, routing):
    cfg = CONFIGS[cfg_name]
    g, dy = _global(cfg, 37, seed=3, routing=routing)
    ref_out, ref = _one_gpu(cfg, g, dy)
    out, ctx = cupy_moe.moe_forward(**g, config=cfg, ep_group=SingleRankGroup())
    assert ctx.expert_parallel is not None and ctx.gate is None
    grads = cupy_moe.moe_backward(dy, ctx)
    _assert_bitwise(out, ref_out, "out")
    for f in GRAD_FIELDS:
        _assert_bitwise(getattr(grads, f), getattr(ref, f), f)


@pytest.mark.parametrize("cfg_name", sorted(CONFIGS))
@pytest.mark.parametrize("sizes", [[20, 17], [7, 0, 25, 3]])
@pytest.mark.parametrize("routing", ["random", "one_expert"])
def test_thread_world_on_one_gpu_equals_one_gpu(cfg_name, sizes, routing):
    """W ranks as threads sharing the GPU (a rank with no tokens; all tokens on one expert)."""
    cfg = CONFIGS[cfg_name]
    W, T = len(sizes), sum(sizes)
    g, dy = _global(cfg, T, seed=5, routing=routing)
    ref_out, ref = _one_gpu(cfg, g, dy)
    cuts = np.cumsum([0] + sizes)
    shards = [g["hidden_states"][cuts[r]:cuts[r + 1]] for r in range(W)]
    dys = [dy[cuts[r]:cuts[r + 1]] for r in range(W)]
    results = _run_world(W, shards, g, dys, cfg)
    f32 = lambda a: a.get().astype(np.float32)
    cat = lambda arrays: np.concatenate([f32(a) for a in arrays])
    assert relative_error(cat([r[0] for r in results]), f32(ref_out)) < 1e-2
    assert relative_error(cat([r[1].hidden_states for r in results]), f32(ref.hidden_states)) < 1e-2
    for f in EXPERT_FIELDS:  # each rank holds its experts' whole gradient
        got = cat([getattr(r[1], f) for r in results])
        assert np.isfinite(got).all() and relative_error(got, f32(getattr(ref, f))) < 1e-2, f
    for f in GRAD_FIELDS[-3:] + ("router_weight",):  # replicated: the ranks' shares sum up
        if getattr(ref, f) is None:
            continue
        got = sum(f32(getattr(r[1], f)) for r in results)
        assert relative_error(got, f32(getattr(ref, f))) < 1e-2, f


def _nccl_available():
    try:
        from cupy.cuda import nccl
        return bool(getattr(nccl, "available", True))
    except Exception:
        return False


@pytest.mark.skipif(not _nccl_available(), reason="cupy.cuda.nccl is not available")
def test_nccl_group_of_one_is_bitwise_one_gpu():
    cfg = CONFIGS["aligned"]
    g, dy = _global(cfg, 41, seed=7)
    ref_out, ref = _one_gpu(cfg, g, dy)
    group = NcclGroup(0, 1, NcclGroup.unique_id())
    out, ctx = cupy_moe.moe_forward(**g, config=cfg, ep_group=group)
    grads = cupy_moe.moe_backward(dy, ctx)
    _assert_bitwise(out, ref_out, "out")
    for f in GRAD_FIELDS:
        _assert_bitwise(getattr(grads, f), getattr(ref, f), f)


def _nccl_rank(group, T, seed):
    """A rank of an NCCL world (module level: spawned processes import it)."""
    import cupy as cp

    cfg = CONFIGS["aligned"]
    g, dy = _global(cfg, T, seed)
    W, r = group.world_size, group.rank
    cuts = np.linspace(0, T, W + 1).astype(int)
    El = cfg.n_routed_experts // W
    args = dict(g, hidden_states=g["hidden_states"][cuts[r]:cuts[r + 1]])
    for f in EXPERT_FIELDS:
        args[f] = g[f][r * El:(r + 1) * El]
    out, ctx = cupy_moe.moe_forward(**args, config=cfg, ep_group=group)
    grads = cupy_moe.moe_backward(dy[cuts[r]:cuts[r + 1]], ctx)
    cp.cuda.Device().synchronize()
    return out.get(), {f: None if getattr(grads, f) is None else getattr(grads, f).get()
                       for f in GRAD_FIELDS}


@pytest.mark.parametrize("W", [2, 4])
def test_nccl_world_equals_one_gpu(W):
    import cupy as cp

    if not _nccl_available():
        pytest.skip("cupy.cuda.nccl is not available")
    if cp.cuda.runtime.getDeviceCount() < W:
        pytest.skip(f"needs {W} GPUs, this machine has {cp.cuda.runtime.getDeviceCount()}")
    cfg, T = CONFIGS["aligned"], 61
    g, dy = _global(cfg, T, seed=11)
    ref_out, ref = _one_gpu(cfg, g, dy)
    results = run_world(W, _nccl_rank, T, 11, transport="nccl")
    f32 = lambda a: np.asarray(a).astype(np.float32)
    assert relative_error(np.concatenate([f32(o) for o, _ in results]), f32(ref_out.get())) < 1e-2
    for f in ("hidden_states",) + EXPERT_FIELDS:
        got = np.concatenate([f32(gr[f]) for _, gr in results])
        assert relative_error(got, f32(getattr(ref, f).get())) < 1e-2, f
    for f in GRAD_FIELDS[-3:] + ("router_weight",):
        got = sum(f32(gr[f]) for _, gr in results)
        assert relative_error(got, f32(getattr(ref, f).get())) < 1e-2, f


def test_permutations_move_rows_like_fancy_indexing_and_skip_the_identity():
    import cupy as cp

    from cupy_moe.parallel.gpu_layer import _Permutation

    rng = np.random.default_rng(4)
    order = rng.permutation(37)
    perm = _Permutation.of(order)
    for width in (12, 64):  # element copies and 16-byte vectors
        rows = cp.asarray(rng.standard_normal((37, width)).astype(cupy_moe.bfloat16))
        assert (perm(rows) == rows[cp.asarray(order)]).all()
    values = cp.asarray(rng.standard_normal(37).astype(np.float32))
    assert (perm(values) == values[cp.asarray(order)]).all()
    identity = _Permutation.of(np.arange(37))
    assert identity.index is None and identity(values) is values
