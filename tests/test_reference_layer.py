"""The NumPy reference of the full layer: float64 gradients against central finite differences,
and the bf16 production precision against float64."""
import numpy as np
import pytest

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.reference import routing
from cupy_moe.testing import make_moe_inputs, relative_error

CONFIGS = {
    "plain": MoEConfig(hidden_size=12, n_routed_experts=6, num_experts_per_tok=2,
                       moe_intermediate_size=5),
    "grouped": MoEConfig(hidden_size=10, n_routed_experts=8, num_experts_per_tok=3,
                         moe_intermediate_size=4, n_group=4, topk_group=2,
                         routed_scaling_factor=2.5),
    "unnormalized": MoEConfig(hidden_size=9, n_routed_experts=5, num_experts_per_tok=2,
                              moe_intermediate_size=3, norm_topk_prob=False,
                              routed_scaling_factor=1.7),
    "no_shared": MoEConfig(hidden_size=8, n_routed_experts=4, num_experts_per_tok=1,
                           moe_intermediate_size=6, n_shared_experts=0),
    "two_shared": MoEConfig(hidden_size=8, n_routed_experts=6, num_experts_per_tok=2,
                            moe_intermediate_size=3, n_shared_experts=2, n_group=3, topk_group=2),
}

WEIGHTS = ("hidden_states", "router_weight", "expert_gate_weight", "expert_up_weight",
           "expert_down_weight", "shared_expert_gate_weight", "shared_expert_up_weight",
           "shared_expert_down_weight")


def _loss(args, cfg, dy):
    out, _ = cupy_moe.moe_forward(**args, config=cfg)
    return float((out * dy).sum())


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("routing_kind", ["random", "one_expert"])
def test_backward_matches_finite_differences(name, routing_kind):
    cfg = CONFIGS[name]
    T = 5
    args = make_moe_inputs(cfg, T, seed=3, dtype=np.float64, routing=routing_kind)
    # Larger activations than the default init so every term of the gradient is well above FD noise.
    for k in WEIGHTS[2:]:
        if args[k] is not None:
            args[k] = args[k] * 3.0
    args["router_weight"] = args["router_weight"] * 4.0
    dy = np.random.default_rng(7).standard_normal((T, cfg.hidden_size))
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    if routing_kind == "one_expert":
        assert (ctx.tokens_per_expert[:cfg.num_experts_per_tok] == T).all()
        assert (ctx.tokens_per_expert[cfg.num_experts_per_tok:] == 0).all()
    grads = cupy_moe.moe_backward(dy, ctx)
    rng = np.random.default_rng(11)
    eps = 1e-6
    for field in WEIGHTS:
        base = args[field]
        g = getattr(grads, field)
        if base is None:
            assert g is None
            continue
        assert g.shape == base.shape and g.dtype == np.float64
        flat = rng.choice(base.size, size=min(base.size, 24), replace=False)
        for i in flat:
            pos = np.unravel_index(i, base.shape)
            plus, minus = base.copy(), base.copy()
            plus[pos] += eps
            minus[pos] -= eps
            fd = (_loss({**args, field: plus}, cfg, dy) - _loss({**args, field: minus}, cfg, dy)) / (2 * eps)
            assert abs(fd - g[pos]) <= 1e-6 + 1e-5 * abs(fd), (field, pos, fd, g[pos])
    # Experts that got no token have exactly zero weight gradients.
    empty = ctx.tokens_per_expert == 0
    for field in ("expert_gate_weight", "expert_up_weight", "expert_down_weight"):
        assert not getattr(grads, field)[empty].any()


def test_router_gradient_is_not_trivially_zero():
    cfg = CONFIGS["grouped"]
    args = make_moe_inputs(cfg, 6, seed=1, dtype=np.float64)
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    grads = cupy_moe.moe_backward(np.ones_like(out), ctx)
    assert np.abs(grads.router_weight).max() > 1e-6


def _selection_brute_force(c, cfg):
    """Row by row with Python sorting; the spec's rule written out directly."""
    T, E = c.shape
    per = E // cfg.n_group
    out = []
    for t in range(T):
        groups = [sorted(c[t, g * per:(g + 1) * per], reverse=True) for g in range(cfg.n_group)]
        gscore = [grp[0] + grp[1] if per > 1 else grp[0] for grp in groups]
        kept = sorted(range(cfg.n_group), key=lambda g: (-gscore[g], g))[:cfg.topk_group]
        if cfg.n_group == 1:
            kept = [0]
        cands = [e for e in range(E) if e // per in kept]
        out.append(sorted(cands, key=lambda e: (-c[t, e], e))[:cfg.num_experts_per_tok])
    return np.array(out)


@pytest.mark.parametrize("name", ["plain", "grouped", "two_shared"])
def test_selection_rule(name):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(5)
    c = rng.standard_normal((50, cfg.n_routed_experts)).astype(np.float32)
    c[::7, 1] = c[::7, 0]  # exact ties: the lower index must win
    got = routing.select_experts(c, cfg)
    np.testing.assert_array_equal(got, _selection_brute_force(c, cfg))


def test_routing_sort_is_stable_counting_sort():
    rng = np.random.default_rng(0)
    E, T, K = 7, 40, 3
    # Expert 6 on every even token (a popular expert), the rest random and distinct per row.
    idx = np.stack([np.r_[6, rng.choice(6, K - 1, replace=False)] if t % 2 == 0
                    else rng.choice(E, K, replace=False) for t in range(T)])
    slots, offsets, counts = routing.routing_sort(idx, E)
    assert sorted(slots.tolist()) == list(range(T * K))
    assert offsets[0] == 0 and offsets[-1] == T * K
    for e in range(E):
        rows = slots[offsets[e]:offsets[e + 1]]
        assert (idx.ravel()[rows] == e).all()
        assert (np.diff(rows // K) > 0).all()  # tokens strictly ascending within an expert
        assert counts[e] == len(rows)


@pytest.mark.parametrize("name", ["plain", "grouped", "unnormalized", "two_shared"])
def test_bf16_precision_tracks_float64(name):
    cfg = CONFIGS[name]
    T = 33
    args = make_moe_inputs(cfg, T, seed=9)
    args64 = {k: None if v is None else v.astype(np.float64) for k, v in args.items()}
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    out64, ctx64 = cupy_moe.moe_forward(**args64, config=cfg)
    assert out.dtype == cupy_moe.bfloat16
    # Same routing decisions here (no near-ties at this seed); compare everything downstream.
    np.testing.assert_array_equal(ctx.topk_indices, ctx64.topk_indices)
    assert relative_error(out, out64) < 1e-2
    dy = np.random.default_rng(2).standard_normal((T, cfg.hidden_size)).astype(np.float32)
    g = cupy_moe.moe_backward(dy.astype(cupy_moe.bfloat16), ctx)
    g64 = cupy_moe.moe_backward(dy.astype(cupy_moe.bfloat16).astype(np.float64), ctx64)
    assert g.router_weight.dtype == np.float32
    for field in WEIGHTS:
        a, b = getattr(g, field), getattr(g64, field)
        if b is None:
            continue
        assert relative_error(a, b) < 2e-2, field


def test_zero_tokens():
    cfg = CONFIGS["grouped"]
    args = make_moe_inputs(cfg, 0, seed=1)
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    assert out.shape == (0, cfg.hidden_size)
    g = cupy_moe.moe_backward(out, ctx)
    assert g.hidden_states.shape == (0, cfg.hidden_size)
    assert not g.expert_gate_weight.astype(np.float32).any()
    assert not g.router_weight.any()


def test_nan_propagates_without_crash():
    cfg = CONFIGS["grouped"]
    args = make_moe_inputs(cfg, 4, seed=1)
    x = args["hidden_states"].copy()
    x[1, 0] = np.nan
    args["hidden_states"] = x
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    assert np.isnan(out.astype(np.float32)[1]).all()
    assert np.isfinite(out.astype(np.float32)[[0, 2, 3]]).all()
    # NaN scores still give distinct, in-range experts.
    assert len(set(ctx.topk_indices[1].tolist())) == cfg.num_experts_per_tok
