"""cupy_moe.testing: the input makers the tests and benchmarks share."""
import importlib

import numpy as np
import pytest

from cupy_moe import MoEConfig
from cupy_moe.testing import make_grad_output, make_moe_inputs


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
