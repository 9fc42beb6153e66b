"""The benchmark's pass rule as a helper: every clause can fail."""
import numpy as np

from cupy_moe import bfloat16
from cupy_moe.testing import relative_error, sol080_pass_rule


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
