import dataclasses

import pytest

from cupy_moe import MoEConfig


def test_presets_match_spec():
    air, glm, ds = MoEConfig.glm45_air(), MoEConfig.glm45(), MoEConfig.deepseek_v3()
    assert (air.hidden_size, air.n_routed_experts, air.num_experts_per_tok,
            air.moe_intermediate_size, air.n_group, air.topk_group,
            air.routed_scaling_factor) == (4096, 128, 8, 1408, 1, 1, 1.0)
    assert (glm.hidden_size, glm.n_routed_experts, glm.moe_intermediate_size,
            glm.routed_scaling_factor) == (5120, 160, 1536, 2.5)
    assert (ds.hidden_size, ds.n_routed_experts, ds.moe_intermediate_size, ds.n_group,
            ds.topk_group, ds.routed_scaling_factor) == (7168, 256, 2048, 8, 4, 2.5)
    for c in (air, glm, ds):
        assert c.n_shared_experts == 1 and c.norm_topk_prob
        assert c.shared_intermediate_size == c.moe_intermediate_size


def test_frozen():
    c = MoEConfig.glm45_air()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.hidden_size = 1


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(hidden_size=0), ValueError, "hidden_size"),
    (dict(hidden_size=4.0), TypeError, "hidden_size"),
    (dict(n_routed_experts=10, n_group=4), ValueError, "n_group"),
    (dict(n_group=2, topk_group=3), ValueError, "topk_group"),
    (dict(num_experts_per_tok=9), ValueError, "num_experts_per_tok"),
    (dict(n_group=4, topk_group=1, num_experts_per_tok=3), ValueError, "num_experts_per_tok"),
    (dict(n_routed_experts=4, n_group=4, num_experts_per_tok=1), ValueError, "two best"),
    (dict(routed_scaling_factor=0.0), ValueError, "routed_scaling_factor"),
    (dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor"),
    (dict(norm_topk_prob=1), TypeError, "norm_topk_prob"),
    (dict(n_shared_experts=-1), ValueError, "n_shared_experts"),
])
def test_invalid(kwargs, exc, words):
    base = dict(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=8)
    base.update(kwargs)
    with pytest.raises(exc, match=words):
        MoEConfig(**base)
