"""Property-based tests on tiny random configs (hypothesis): the float64 NumPy path against
central finite differences, and the GPU path against the NumPy path."""
import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property tests need hypothesis (the test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.testing import make_moe_inputs


@st.composite
def configs(draw):
    groups = draw(st.integers(1, 3))
    per_group = draw(st.integers(2, 4)) if groups > 1 else draw(st.integers(1, 8))
    E = groups * per_group
    topk_group = draw(st.integers(1, groups))
    K = draw(st.integers(1, min(4, topk_group * per_group)))
    return MoEConfig(hidden_size=draw(st.integers(4, 16)), n_routed_experts=E, num_experts_per_tok=K,
                     moe_intermediate_size=draw(st.integers(2, 8)),
                     n_shared_experts=draw(st.integers(0, 2)), n_group=groups, topk_group=topk_group,
                     norm_topk_prob=draw(st.booleans()),
                     routed_scaling_factor=draw(st.sampled_from([1.0, 1.7, 2.5])))


FIELDS = ("hidden_states", "router_weight", "expert_gate_weight", "expert_up_weight",
          "expert_down_weight", "shared_expert_gate_weight", "shared_expert_up_weight",
          "shared_expert_down_weight")


@settings(max_examples=30, deadline=None, derandomize=True)
@given(cfg=configs(), T=st.integers(1, 6), seed=st.integers(0, 2**16),
       routing=st.sampled_from(["random", "one_expert", "skewed"]))
def test_numpy_backward_matches_finite_differences(cfg, T, seed, routing):
    args = make_moe_inputs(cfg, T, seed=seed, dtype=np.float64, routing=routing)
    for k in FIELDS[2:]:  # activations well above finite-difference noise
        if args[k] is not None:
            args[k] = args[k] * 3.0
    args["router_weight"] = args["router_weight"] * 4.0
    dy = np.random.default_rng(seed + 1).standard_normal((T, cfg.hidden_size))
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    grads = cupy_moe.moe_backward(dy, ctx)

    def loss(field, value):
        o, c = cupy_moe.moe_forward(**{**args, field: value}, config=cfg)
        # A selection change under the perturbation is a kink, not a gradient: skip that probe.
        same = np.array_equal(c.topk_indices, ctx.topk_indices)
        return float((o * dy).sum()), same

    rng = np.random.default_rng(seed + 2)
    eps = 1e-6
    for field in FIELDS:
        base, g = args[field], getattr(grads, field)
        if base is None:
            assert g is None
            continue
        for i in rng.choice(base.size, size=min(base.size, 4), replace=False):
            pos = np.unravel_index(i, base.shape)
            plus, minus = base.copy(), base.copy()
            plus[pos] += eps
            minus[pos] -= eps
            (lp, s1), (lm, s2) = loss(field, plus), loss(field, minus)
            if not (s1 and s2):
                continue
            fd = (lp - lm) / (2 * eps)
            assert abs(fd - g[pos]) <= 1e-6 + 1e-5 * abs(fd), (cfg, field, pos, fd, g[pos])


@pytest.mark.gpu
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs(), T=st.integers(1, 40), seed=st.integers(0, 2**16),
       routing=st.sampled_from(["random", "one_expert", "skewed"]))
def test_gpu_matches_numpy(poisoned_memory, cfg, T, seed, routing):
    from test_gpu_layer import _check  # the end-to-end comparison the GPU layer tests use

    _check(cfg, T, routing, seed=seed)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(data=st.data(), W=st.sampled_from([1, 2, 3, 4]), seed=st.integers(0, 2**16))
def test_expert_parallel_world_equals_one_process(data, W, seed):
    """Random configs whose experts split over W ranks, random token counts per rank (zeros
    included), float64: the simulated world computes what one process computes."""
    from test_parallel import _run_world_with

    per_rank = data.draw(st.integers(1, 4))
    K = data.draw(st.integers(1, min(3, W * per_rank)))
    cfg = MoEConfig(hidden_size=data.draw(st.integers(4, 12)), n_routed_experts=W * per_rank,
                    num_experts_per_tok=K, moe_intermediate_size=data.draw(st.integers(2, 6)),
                    n_shared_experts=data.draw(st.integers(0, 1)),
                    norm_topk_prob=data.draw(st.booleans()))
    sizes = data.draw(st.lists(st.integers(0, 5), min_size=W, max_size=W))
    _run_world_with(cfg, sizes, seed, np.float64, "random", tol=1e-10)
