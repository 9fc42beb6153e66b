"""moe_forward / moe_backward on the GPU against the NumPy reference, end to end."""
import dataclasses

import numpy as np
import pytest

import cupy_moe
from cupy_moe import MoEConfig, bfloat16
from cupy_moe.reference import layer as ref_layer
from cupy_moe.testing import ctx_to_numpy, make_moe_inputs, relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]

SMALL = {
    "aligned": MoEConfig(hidden_size=128, n_routed_experts=16, num_experts_per_tok=4,
                         moe_intermediate_size=72),
    "odd": MoEConfig(hidden_size=36, n_routed_experts=6, num_experts_per_tok=2,
                     moe_intermediate_size=13, routed_scaling_factor=1.7),
    "grouped": MoEConfig(hidden_size=64, n_routed_experts=32, num_experts_per_tok=6,
                         moe_intermediate_size=24, n_group=8, topk_group=3,
                         routed_scaling_factor=2.5),
    "no_shared_unnormalized": MoEConfig(hidden_size=48, n_routed_experts=8, num_experts_per_tok=2,
                                        moe_intermediate_size=16, n_shared_experts=0,
                                        norm_topk_prob=False),
}


def test_forward_rejects_a_config_past_the_gpu_limits():
    import cupy as cp

    cfg = MoEConfig(hidden_size=16, n_routed_experts=64, num_experts_per_tok=33, moe_intermediate_size=8)
    with pytest.raises(ValueError, match="num_experts_per_tok: the GPU path supports up to 32"):
        cupy_moe.moe_forward(**make_moe_inputs(cfg, 3, seed=0, xp=cp), config=cfg)


def _check(cfg, T, routing, seed=0, tol=1e-2):
    import cupy as cp

    # Drawn on the device (GLM-size weights in well under a second), then copied for the reference.
    gargs = make_moe_inputs(cfg, T, seed=seed, routing=routing, xp=cp)
    args = {k: None if v is None else v.get() for k, v in gargs.items()}
    out, ctx = cupy_moe.moe_forward(**gargs, config=cfg)
    hctx = ctx_to_numpy(ctx, host_inputs=args)
    # Routing: scores close to the reference, selection = the reference rule on the GPU's scores.
    ref_scores, _, _ = ref_layer.route(args["hidden_states"].astype(np.float32),
                                       args["router_weight"].astype(np.float32),
                                       args["e_score_correction_bias"], cfg)
    np.testing.assert_allclose(hctx.scores, ref_scores, rtol=1e-4, atol=1e-6)
    from cupy_moe.reference.routing import routing_weights, select_experts
    np.testing.assert_array_equal(hctx.topk_indices,
                                  select_experts(hctx.scores + args["e_score_correction_bias"], cfg))
    np.testing.assert_allclose(hctx.topk_weights,
                               routing_weights(hctx.scores, hctx.topk_indices, cfg), rtol=1e-6)
    # The experts given the GPU's routing.
    ref_out, ref_ctx = ref_layer.forward_routed(
        *(args[k] for k in ("hidden_states", "router_weight", "expert_gate_weight",
                            "expert_up_weight", "expert_down_weight", "shared_expert_gate_weight",
                            "shared_expert_up_weight", "shared_expert_down_weight")),
        cfg, hctx.scores, hctx.topk_indices, hctx.topk_weights)
    for f in ("tokens_per_expert", "expert_offsets", "sorted_slots", "slot_rows"):
        np.testing.assert_array_equal(getattr(hctx, f), getattr(ref_ctx, f), err_msg=f)
    assert relative_error(out, ref_out) < tol
    for f in ("gate", "up", "act", "shared_gate", "shared_up", "shared_act"):
        if getattr(ref_ctx, f) is not None:
            assert relative_error(getattr(hctx, f), getattr(ref_ctx, f)) < tol, f
    # Backward from the same saved state.
    dy = np.random.default_rng(seed + 1).standard_normal((T, cfg.hidden_size),
                                                          dtype=np.float32).astype(bfloat16)
    grads = cupy_moe.moe_backward(cp.asarray(dy), ctx)
    ref = ref_layer.backward(dy, hctx)
    for f in grads._fields:
        got, want = getattr(grads, f), getattr(ref, f)
        if want is None:
            assert got is None
            continue
        got = got.get()
        assert got.dtype == want.dtype and got.shape == want.shape, f
        if f == "router_weight" and cfg.num_experts_per_tok == 1 and cfg.norm_topk_prob:
            # One normalized weight is identically the scaling factor: the exact gradient is 0 and
            # both sides hold rounding noise, so a relative error means nothing; bound the noise.
            assert np.abs(got).max() < 1e-4, (f, np.abs(got).max())
            continue
        assert relative_error(got, want) < tol, (f, relative_error(got, want))
    empty = hctx.tokens_per_expert == 0
    for f in ("expert_gate_weight", "expert_up_weight", "expert_down_weight"):
        assert not getattr(grads, f).get()[empty].astype(np.float32).any(), f
    return hctx


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("T", [1, 7, 64, 333, 4096])
@pytest.mark.parametrize("routing", ["random", "one_expert"])
def test_small_configs(name, T, routing):
    ctx = _check(SMALL[name], T, routing, seed=T)
    if routing == "one_expert":
        assert ctx.tokens_per_expert[0] == T


@pytest.mark.slow
@pytest.mark.parametrize("T,routing", [(64, "random"), (333, "skewed")])
def test_glm45_air(T, routing):
    _check(MoEConfig.glm45_air(), T, routing, seed=5)


# DeepSeek-V3's sizes and group rule (H = 7168, I = 2048, 8 groups of which 4 are kept) with 64
# experts instead of 256: every GEMM and epilogue shape of the model at a quarter of its 22.5 GB of
# expert weights, so the NumPy reference takes a minute, not several. (Its 256-expert routing is
# tested in test_gpu_routing.py; the whole model against the CuPy and PyTorch peers by
# bench/benchmark.py --layer --model deepseek_v3.)
MODELS = {"glm45": MoEConfig.glm45(),
          "deepseek_v3_64": dataclasses.replace(MoEConfig.deepseek_v3(), n_routed_experts=64)}


@pytest.mark.slow
@pytest.mark.parametrize("model,T,routing", [("glm45", 1, "random"), ("glm45", 333, "skewed"),
                                             ("deepseek_v3_64", 61, "random"),
                                             ("deepseek_v3_64", 97, "one_expert")])
def test_glm45_and_deepseek_v3_sizes(model, T, routing):
    """The other two model classes the library names: GLM-4.5 (H = 5120, I = 1536, 160 experts) at
    full size, DeepSeek-V3's shapes as above (at T = 61 some experts get no token; with
    "one_expert" all 97 meet in group 0's experts)."""
    ctx = _check(MODELS[model], T, routing, seed=T + 3)
    if routing == "one_expert":
        assert ctx.tokens_per_expert[0] == T


def test_zero_tokens():
    import cupy as cp

    cfg = SMALL["grouped"]
    args = {k: None if v is None else cp.asarray(v) for k, v in make_moe_inputs(cfg, 0).items()}
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    assert out.shape == (0, cfg.hidden_size)
    g = cupy_moe.moe_backward(out, ctx)
    assert g.hidden_states.shape == (0, cfg.hidden_size)
    for f in g._fields[1:]:
        assert not getattr(g, f).astype(cp.float32).any(), f


@pytest.mark.parametrize("name,T,routing", [("aligned", 333, "random"), ("aligned", 64, "one_expert"),
                                            ("grouped", 7, "random")])
@pytest.mark.parametrize("transposed", [True, False])
def test_dwd_stored_transposed_or_not(name, T, routing, transposed, monkeypatch):
    """CUPY_MOE_LAYER_DWD_TRANSPOSED: each expert's dWd as (aw^T dy)^T, stored transposed (the
    default), or as dy^T aw; against the reference, empty experts' zeros included (the "grouped"
    config's I = 24 takes the transposed store too)."""
    from cupy_moe.gpu import layer

    monkeypatch.setattr(layer, "DWD_TRANSPOSED", transposed)
    _check(SMALL[name], T, routing, seed=T)


@pytest.mark.parametrize("name,T,routing", [("aligned", 333, "random"), ("aligned", 4096, "skewed"),
                                            ("odd", 64, "random"), ("no_shared_unnormalized", 97, "random")])
def test_row_moves_beside_the_shared_expert(name, T, routing, monkeypatch):
    """The dy scatter beside the shared expert's d_act and the combine beside the routed dWg
    (layer.BESIDE; 40 SMs forced to them at these small sizes): against the reference, and
    bitwise what one after the other gives (with and without a shared expert)."""
    from cupy_moe.gpu import layer

    cfg = SMALL[name]
    monkeypatch.setattr(layer, "free_sms", lambda *args: 40)
    _check(cfg, T, routing, seed=T + 2)
    _assert_backward_bits_kept(cfg, T, routing, T + 2, 11,
                               lambda: monkeypatch.setattr(layer, "BESIDE", False))


@pytest.mark.parametrize("name,T,routing", [("aligned", 333, "random"), ("aligned", 4096, "skewed"),
                                            ("odd", 64, "random")])
def test_shared_weight_gradients_side_by_side(name, T, routing, monkeypatch):
    """The shared expert's [dWsg; dWsu] beside dWsd (side_by_side, forced at these small sizes):
    against the reference, and bitwise what one GEMM after the other gives. ("odd" keeps dgs and
    dus apart: its sizes are off the Hopper loop.)"""
    from cupy_moe.gpu import side_by_side

    cfg = SMALL[name]
    ctx = _check(cfg, T, routing, seed=T + 1)
    monkeypatch.setattr(side_by_side, "MIN_GAIN_STEPS", 0)
    forced = _check(cfg, T, routing, seed=T + 1)
    np.testing.assert_array_equal(ctx.topk_indices, forced.topk_indices)
    _assert_backward_bits_kept(cfg, T, routing, T + 1, 9,
                               lambda: monkeypatch.setattr(side_by_side, "MIN_GAIN_STEPS", 1 << 30))


def _assert_backward_bits_kept(cfg, T, routing, seed, dy_seed, switch):
    """moe_backward of one forward's context (inputs drawn with seed, dy with dy_seed) before and
    after switch() (a monkeypatch of how the backward schedules its launches): bitwise the same
    gradients, None only where the config has no shared expert."""
    import cupy as cp

    gargs = make_moe_inputs(cfg, T, seed=seed, routing=routing, xp=cp)
    _, gctx = cupy_moe.moe_forward(**gargs, config=cfg)
    dy = cp.asarray(np.random.default_rng(dy_seed).standard_normal((T, cfg.hidden_size),
                                                                   dtype=np.float32).astype(bfloat16))
    before = cupy_moe.moe_backward(dy, gctx)
    switch()
    after = cupy_moe.moe_backward(dy, gctx)
    for f in before._fields:
        a, b = getattr(before, f), getattr(after, f)
        if a is None or b is None:
            assert a is None and b is None and not cfg.n_shared_experts, f
            continue
        np.testing.assert_array_equal(cp.asnumpy(a).view(np.uint8), cp.asnumpy(b).view(np.uint8),
                                      err_msg=f)
