"""sol080 reference against a direct, loop-by-loop transcription of the spec at small shapes."""
import numpy as np
import pytest

import cupy_moe
from cupy_moe._arrays import round_bf16 as bf16
from cupy_moe.testing import make_sol080_inputs, sol080_pass_rule


def _transcription(a):
    f = lambda k: a[k].astype(np.float32)
    g, x = f("grad_output"), f("hidden_states")
    wd, wg, wu, wr = (f(k) for k in ("shared_expert_down_weight", "shared_expert_gate_weight",
                                      "shared_expert_up_weight", "router_weight"))
    gate, up, act = f("shared_gate_output"), f("shared_up_output"), f("shared_activated")
    T, H = g.shape
    E = wr.shape[0]
    K = a["topk_indices"].shape[1]
    d_act = bf16(np.einsum("th,hi->ti", g, wd))
    grad_wd = bf16(np.einsum("th,ti->hi", g, act))
    t = bf16(d_act * up)
    sig = (1.0 / (1.0 + np.exp(-gate.astype(np.float64)))).astype(np.float32)
    d_up = bf16(d_act * bf16(gate * sig))
    d_gate = bf16(t * sig * (1 + gate * (1 - sig)))
    grad_wg = bf16(np.einsum("ti,th->ih", d_gate, x))
    grad_wu = bf16(np.einsum("ti,th->ih", d_up, x))
    h_shared = bf16(bf16(np.einsum("ti,ih->th", d_up, wu)) + bf16(np.einsum("ti,ih->th", d_gate, wg)))
    G = np.zeros((T, E), np.float32)
    for row in range(T):
        q = np.float32(sum(float(v) * float(v) for v in g[row]) / K)
        w = a["topk_weights"][row]
        s = np.float32(w.sum() + np.float32(1e-20))
        c = (q - np.float32(sum(q * wk / s for wk in w))) / s
        for k in range(K):
            G[row, a["topk_indices"][row, k]] += c
    grl = G * a["score_mask"] * a["scores"] * (1 - a["scores"])
    grad_router = np.einsum("te,th->eh", grl, x)
    grad_h = bf16(h_shared + bf16(bf16(grl) @ wr))
    return grad_h, grad_router, grad_wg, grad_wu, grad_wd


@pytest.mark.parametrize("T,H,I,E,K", [(1, 16, 8, 4, 2), (7, 64, 24, 16, 4), (33, 128, 40, 32, 8)])
def test_matches_transcription(T, H, I, E, K):
    a = make_sol080_inputs(T, H, I, E, K, seed=T)
    out = cupy_moe.sol080_backward(**a)
    ref = _transcription(a)
    names = ("grad_hidden_states", "grad_router_weight", "grad_wg", "grad_wu", "grad_wd")
    dtypes = (cupy_moe.bfloat16, np.float32, cupy_moe.bfloat16, cupy_moe.bfloat16, cupy_moe.bfloat16)
    for name, o, r, dt in zip(names, out, ref, dtypes):
        assert o.dtype == dt, name
        assert o.shape == r.shape, name
        o32 = o.astype(np.float32)
        if name == "grad_router_weight":
            # fp32 rounding residue: only its scale is meaningful (sol080.md).
            np.testing.assert_allclose(o32, r, rtol=0, atol=4 * np.abs(r).max() + 1e-30)
        else:
            # Different fp32 summation orders flip an occasional bf16 rounding.
            assert np.mean(np.abs(o32 - r) <= 1e-2 * np.abs(r) + 1e-3) > 0.99, name
        assert sol080_pass_rule(o, r.astype(dt), atol=0.1), name


def test_grad_router_weight_is_nonzero():
    a = make_sol080_inputs(64, 128, 32, 16, 4, seed=1)
    assert np.abs(cupy_moe.sol080_backward(**a)[1]).max() > 0


def test_inputs_not_modified():
    a = make_sol080_inputs(9, 32, 16, 8, 2, seed=4)
    before = {k: v.copy() for k, v in a.items()}
    cupy_moe.sol080_backward(**a)
    for k in a:
        np.testing.assert_array_equal(a[k], before[k], err_msg=k)
