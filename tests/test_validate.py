"""Bad input on the NumPy path: a clear TypeError/ValueError naming the argument."""
import dataclasses

import numpy as np
import pytest

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.testing import make_moe_inputs, make_sol080_inputs

CFG = MoEConfig(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=8,
                n_group=2, topk_group=1)


def _fwd(**over):
    args = make_moe_inputs(CFG, 5, seed=0)
    args.update(over)
    return cupy_moe.moe_forward(**args, config=CFG)


@pytest.mark.parametrize("name", ["hidden_states", "router_weight", "expert_gate_weight",
                                  "expert_up_weight", "expert_down_weight",
                                  "shared_expert_gate_weight", "shared_expert_up_weight",
                                  "shared_expert_down_weight", "e_score_correction_bias"])
def test_forward_rejects_bad_arrays(name):
    a = make_moe_inputs(CFG, 5, seed=0)[name]
    with pytest.raises(TypeError, match=name):
        _fwd(**{name: a.astype(np.float16)})
    with pytest.raises(ValueError, match=name):
        _fwd(**{name: a[..., :-1] if a.ndim > 1 else a[:-1]})
    with pytest.raises(ValueError, match=name):
        _fwd(**{name: a[None]})
    if a.ndim > 1:
        nc = np.asfortranarray(a) if a.shape[-1] > 1 else a[::-1]
        with pytest.raises(ValueError, match=f"{name}.*contiguous"):
            _fwd(**{name: nc})
        with pytest.raises(ValueError, match=f"{name}.*contiguous"):
            _fwd(**{name: a[..., ::-1]})
    with pytest.raises(TypeError, match=name):
        _fwd(**{name: a.tolist()})


def test_forward_config_disagreement():
    args = make_moe_inputs(CFG, 5, seed=0)
    other = MoEConfig(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=4)
    with pytest.raises(ValueError, match="expert_gate_weight.*I = 4"):
        cupy_moe.moe_forward(**args, config=other)
    with pytest.raises(TypeError, match="config"):
        cupy_moe.moe_forward(**args, config={"hidden_size": 16})
    no_shared = MoEConfig(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2,
                          moe_intermediate_size=8, n_shared_experts=0)
    with pytest.raises(ValueError, match="shared_expert_gate_weight.*None"):
        cupy_moe.moe_forward(**args, config=no_shared)
    with pytest.raises(ValueError, match="shared_expert_up_weight.*array"):
        _fwd(shared_expert_up_weight=None)


def test_gpu_config_limits():
    from cupy_moe import validate

    at = MoEConfig(hidden_size=16, n_routed_experts=64, num_experts_per_tok=validate.GPU_MAX_TOPK,
                   moe_intermediate_size=8)
    validate.gpu_config(at)
    with pytest.raises(ValueError, match="num_experts_per_tok: the GPU path supports up to 32 .* got 33"):
        validate.gpu_config(dataclasses.replace(at, num_experts_per_tok=33))
    many_groups = MoEConfig(hidden_size=16, n_routed_experts=256, num_experts_per_tok=2,
                            moe_intermediate_size=8, n_group=128, topk_group=1)
    with pytest.raises(ValueError, match="n_group: the GPU path supports up to 64 groups, got 128"):
        validate.gpu_config(many_groups)
    # The NumPy path has neither limit.
    args = make_moe_inputs(dataclasses.replace(at, num_experts_per_tok=33), 3, seed=0)
    out, _ = cupy_moe.moe_forward(**args, config=dataclasses.replace(at, num_experts_per_tok=33))
    assert out.shape == (3, 16) and np.isfinite(out.astype(np.float32)).all()


def test_mixed_precisions_rejected():
    args = make_moe_inputs(CFG, 5, seed=0)
    with pytest.raises(TypeError, match="router_weight.*bfloat16"):
        _fwd(router_weight=args["router_weight"].astype(np.float64))


def test_backward_checks():
    out, ctx = _fwd()
    with pytest.raises(ValueError, match="grad_output"):
        cupy_moe.moe_backward(out[:-1], ctx)
    with pytest.raises(TypeError, match="grad_output"):
        cupy_moe.moe_backward(out.astype(np.float32), ctx)
    with pytest.raises(ValueError, match="grad_output.*contiguous"):
        cupy_moe.moe_backward(np.asfortranarray(out), ctx)
    with pytest.raises(TypeError, match="ctx"):
        cupy_moe.moe_backward(out, {"hidden_states": out})


def _sol(**over):
    a = make_sol080_inputs(6, 32, 16, 8, 2, seed=0)
    a.update(over)
    return cupy_moe.sol080_backward(**a)


@pytest.mark.parametrize("name", list(make_sol080_inputs(2, 16, 8, 4, 2)))
def test_sol080_rejects_bad_arrays(name):
    a = make_sol080_inputs(6, 32, 16, 8, 2, seed=0)[name]
    wrong = np.float64 if a.dtype != np.float64 else np.float32
    with pytest.raises(TypeError, match=name):
        _sol(**{name: a.astype(wrong)})
    with pytest.raises(ValueError, match=name):
        _sol(**{name: a[None]})
    if a.ndim == 2 and name not in ("grad_output",):
        with pytest.raises(ValueError, match=name):
            _sol(**{name: np.ascontiguousarray(a[:, :-1]) if a.shape[1] > 1 else a[:-1]})
        with pytest.raises(ValueError, match=f"{name}.*contiguous"):
            _sol(**{name: a[::-1] if a.shape[0] > 1 else a[:, ::-1]})
    with pytest.raises(TypeError, match=name):
        _sol(**{name: None})


def test_sol080_topk_values():
    a = make_sol080_inputs(6, 32, 16, 8, 2, seed=0)
    idx = a["topk_indices"].copy()
    idx[3, 1] = 8
    with pytest.raises(ValueError, match=r"topk_indices.*\[0, 8\).*8"):
        _sol(topk_indices=idx)
    idx[3, 1] = -1
    with pytest.raises(ValueError, match="topk_indices.*-1"):
        _sol(topk_indices=idx)
    idx[3, 1] = idx[3, 0]
    with pytest.raises(ValueError, match="topk_indices.*row 3"):
        _sol(topk_indices=idx)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_sol080_checks_skipped_only_for_a_signature_that_passed(monkeypatch):
    """A repeated call with the same types, dtypes, shapes and strides skips the structural
    checks (they depend on nothing else), still checks the index values, and any other
    signature is checked in full."""
    from cupy_moe import validate

    monkeypatch.setattr(validate, "_sol080_passed", {})
    structure = []
    real = validate._sol080_structure
    monkeypatch.setattr(validate, "_sol080_structure", lambda a: structure.append(1) or real(a))
    a = make_sol080_inputs(6, 32, 16, 8, 2, seed=0)
    _sol()
    _sol()
    assert len(structure) == 1  # the second call reused the first one's result
    idx = a["topk_indices"].copy()
    idx[2, 0] = 8
    with pytest.raises(ValueError, match=r"topk_indices.*\[0, 8\)"):
        _sol(topk_indices=idx)  # same signature: the values are still checked
    with pytest.raises(ValueError, match="hidden_states.*contiguous"):
        _sol(hidden_states=np.asfortranarray(a["hidden_states"]))  # other strides: full checks
    with pytest.raises(TypeError, match="scores"):
        _sol(scores=a["scores"].astype(np.float64))
    with pytest.raises(TypeError, match="scores"):
        _sol(scores=np.asmatrix(a["scores"]))  # an ndarray subclass: its type differs
    assert len(structure) == 4 and len(validate._sol080_passed) == 1


def test_sol080_array_lookalike_gets_the_full_checks():
    """An object with dtype, shape and strides that is no array (here with an unhashable shape)
    is named by the full checks, never looked up in the cache."""
    import types

    a = make_sol080_inputs(6, 32, 16, 8, 2, seed=0)["scores"]
    fake = types.SimpleNamespace(dtype=a.dtype, shape=list(a.shape), strides=a.strides)
    with pytest.raises(TypeError, match="scores: expected a numpy.ndarray or cupy.ndarray"):
        _sol(scores=fake)


def test_mixing_numpy_and_other_objects():
    a = make_sol080_inputs(6, 32, 16, 8, 2, seed=0)
    with pytest.raises(TypeError, match="hidden_states"):
        _sol(hidden_states=a["hidden_states"].tolist())


def test_inputs_not_modified_forward_backward():
    args = make_moe_inputs(CFG, 7, seed=2)
    before = {k: None if v is None else v.copy() for k, v in args.items()}
    out, ctx = cupy_moe.moe_forward(**args, config=CFG)
    dy = out.copy()
    cupy_moe.moe_backward(dy, ctx)
    np.testing.assert_array_equal(dy, out)
    for k, v in args.items():
        if v is not None:
            np.testing.assert_array_equal(v, before[k], err_msg=k)
