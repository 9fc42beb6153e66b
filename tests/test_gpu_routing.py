"""Router top-k and the routing sort on the GPU against the NumPy reference."""
import numpy as np
import pytest

from cupy_moe import MoEConfig
from cupy_moe.reference import routing as ref_routing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]


def _random_topk(rng, T, E, K):
    return np.argsort(rng.random((T, E)), axis=1)[:, :K].astype(np.int64)


@pytest.mark.parametrize("T,E,K", [(1, 8, 2), (7, 6, 3), (333, 128, 8), (4096, 128, 8),
                                   (1000, 256, 8), (16384, 128, 8)])
@pytest.mark.parametrize("kind", ["random", "one_expert"])
def test_routing_sort(T, E, K, kind):
    import cupy as cp
    from cupy_moe.gpu import routing

    rng = np.random.default_rng(T + E)
    idx = _random_topk(rng, T, E, K)
    if kind == "one_expert":
        idx = np.tile(np.arange(K, dtype=np.int64)[::-1], (T, 1))  # experts >= K get nothing
    got = routing.sort(cp.asarray(idx), E)
    slots, offsets, counts = ref_routing.routing_sort(idx, E)
    np.testing.assert_array_equal(got.sorted_slots.get(), slots)
    np.testing.assert_array_equal(got.expert_offsets.get(), offsets)
    np.testing.assert_array_equal(got.tokens_per_expert.get(), counts)
    inv = np.empty_like(slots)
    inv[slots] = np.arange(slots.size)
    np.testing.assert_array_equal(got.slot_rows.get(), inv)


CONFIGS = [
    MoEConfig(hidden_size=64, n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32),
    MoEConfig(hidden_size=40, n_routed_experts=32, num_experts_per_tok=6, moe_intermediate_size=8,
              n_group=8, topk_group=3, routed_scaling_factor=2.5),
    MoEConfig(hidden_size=24, n_routed_experts=5, num_experts_per_tok=2, moe_intermediate_size=8,
              norm_topk_prob=False, routed_scaling_factor=1.5),
    MoEConfig.deepseek_v3(),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"E{c.n_routed_experts}g{c.n_group}")
@pytest.mark.parametrize("T", [1, 7, 333])
def test_router_topk_given_logits(cfg, T):
    """The selection kernel on the GPU's own logits equals the reference rule on those logits."""
    import cupy as cp
    from cupy_moe import bfloat16
    from cupy_moe.gpu import router

    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, cfg.hidden_size), dtype=np.float32).astype(bfloat16)
    wr = (rng.standard_normal((cfg.n_routed_experts, cfg.hidden_size), dtype=np.float32)
          / np.sqrt(cfg.hidden_size)).astype(bfloat16)
    bias = (0.1 * rng.standard_normal(cfg.n_routed_experts)).astype(np.float32)
    bias[3 % cfg.n_routed_experts] = np.nan if T == 7 else bias[3 % cfg.n_routed_experts]
    scores, idx, w = router.forward(cp.asarray(x), cp.asarray(wr), cp.asarray(bias), cfg)
    s = scores.get()
    ref_s = 1 / (1 + np.exp(-(x.astype(np.float64) @ wr.astype(np.float64).T)))
    # Tensor-core fp32 accumulation over H products: a few 1e-5 relative at H = 7168.
    np.testing.assert_allclose(s, ref_s, rtol=1e-4, atol=1e-6)
    ref_idx = ref_routing.select_experts(s + bias, cfg)
    np.testing.assert_array_equal(idx.get(), ref_idx)
    np.testing.assert_allclose(w.get(), ref_routing.routing_weights(s, ref_idx, cfg), rtol=1e-6)
