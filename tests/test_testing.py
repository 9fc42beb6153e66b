"""cupy_moe.testing: the benchmark's pass rule as a helper (every clause can fail), the relative
error, and the input makers the tests and benchmarks share."""
import importlib

import numpy as np
import pytest

from cupy_moe import MoEConfig, bfloat16
from cupy_moe.testing import make_grad_output, make_moe_inputs, relative_error, sol080_pass_rule


def _ref():
    return np.random.default_rng(0).standard_normal((100, 10)).astype(np.float32)


def test_identical_passes():
    r = _ref()
    res = sol080_pass_rule(r.copy(), r, atol=0.0)
    assert res and res.pass_fraction == 1.0


def test_tolerance_boundary():
    r = _ref()
    # Just inside and just outside atol + rtol * |ref| for every element.
    assert sol080_pass_rule(r + 0.099 + 0.05 * np.abs(r), r, atol=0.1)
    assert not sol080_pass_rule(r + 0.101 + 0.05 * np.abs(r), r, atol=0.1)


def test_one_percent_allowance():
    r = _ref()
    out = r.copy()
    out.flat[:10] += 100  # 1% bad: passes
    assert sol080_pass_rule(out, r, atol=0.01)
    out.flat[10] += 100  # 1.1% bad: fails
    assert not sol080_pass_rule(out, r, atol=0.01)


def test_nan_and_inf_fail_even_when_few():
    r = _ref()
    for bad in (np.nan, np.inf, -np.inf):
        out = r.copy()
        out[0, 0] = bad
        res = sol080_pass_rule(out, r, atol=1e9)
        assert not res and "NaN" in res.reason


def test_all_zero_fails_against_tiny_nonzero_reference():
    r = _ref() * 1e-6
    res = sol080_pass_rule(np.zeros_like(r), r, atol=0.5)
    assert not res and "zero" in res.reason
    assert sol080_pass_rule(np.zeros_like(r), np.zeros_like(r), atol=0.0)


def test_shape_and_dtype_must_match():
    r = _ref()
    assert not sol080_pass_rule(r[:, :5], r, atol=1)
    assert not sol080_pass_rule(r.astype(bfloat16), r, atol=1)
    assert sol080_pass_rule(r.astype(bfloat16), r.astype(bfloat16), atol=0.01)


def test_relative_error():
    r = _ref()
    assert relative_error(r, r) == 0
    assert abs(relative_error(1.01 * r, r) - 0.01) < 1e-6
    out = r.copy()
    out[0, 0] = np.nan
    assert relative_error(out, r) == float("inf")


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_grad_output_is_the_hidden_states_make_moe_inputs_draws(backend):
    """make_grad_output(cfg, T, seed) stands in for make_moe_inputs(cfg, T, seed)["hidden_states"]
    in the benchmarks: the same numbers as before, without a second set of expert weights."""
    xp = importlib.import_module(backend)
    host = np.asarray if xp is np else xp.asnumpy
    cfg = MoEConfig(hidden_size=40, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=8)
    for seed in (1, 7):
        want = host(make_moe_inputs(cfg, 13, seed=seed, xp=xp)["hidden_states"])
        got = host(make_grad_output(cfg, 13, seed=seed, xp=xp))
        assert got.dtype == want.dtype and got.shape == (13, 40)
        assert np.abs(got.astype(np.float32)).sum() > 0
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_relative_error_of_two_cupy_arrays_on_the_device_matches_the_host():
    """Two CuPy arrays are compared on the device (no host copies); the same number as the host's
    form, over more than one chunk (2^24 elements), for bf16 too; NaN or Inf gives inf."""
    import cupy as cp

    rng = np.random.default_rng(3)
    ref = rng.standard_normal((1 << 24) + 5).astype(np.float32)
    out = ref + 0.01 * rng.standard_normal(ref.size).astype(np.float32)
    for o, r in ((out, ref), (out.astype(bfloat16), ref.astype(bfloat16))):
        want = relative_error(o, r)
        assert 1e-3 < want < 0.1
        assert abs(relative_error(cp.asarray(o), cp.asarray(r)) - want) < 1e-9 * want
    bad = cp.asarray(out)
    bad[-1] = cp.inf
    assert relative_error(bad, cp.asarray(ref)) == float("inf")
