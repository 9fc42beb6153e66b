"""Bad input on both paths (NumPy reference and CuPy kernels): every argument of every public
function with a wrong dtype, rank, shape, memory order, array module or Python type; a config that
disagrees with the shapes; bad routing indices; T = 0; NaN and Inf. Errors are TypeError or
ValueError naming the argument, raised before any kernel runs; no input is ever modified (every
input is hashed before and after each call, failing or not)."""
import hashlib

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.testing import make_moe_inputs, make_sol080_inputs

PATHS = [pytest.param("numpy", id="numpy"), pytest.param("cupy", id="cupy", marks=pytest.mark.gpu)]

CFG = MoEConfig(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=8,
                n_group=2, topk_group=1)
T = 5


def _expected_cases(arrays, xp, other) -> int:
    """dtype, rank, shape, list, None for every array; memory orders for >= 2-d ones; module
    mixing where the other module is importable; np.matrix for 2-d ones on the NumPy path."""
    n = 0
    for a in arrays.values():
        n += 5 + 2 * (a.ndim > 1) + (other is not None) + (xp is np and a.ndim == 2)
    return n


@pytest.fixture(params=PATHS)
def path(request):
    if request.param == "cupy":
        request.getfixturevalue("poisoned_memory")
    return request.param


def _xp(path):
    if path == "numpy":
        return np
    import cupy
    return cupy


def _other(path):
    """The other array module, or None on a machine without CuPy (that variant is then left out)."""
    try:
        return _xp("cupy" if path == "numpy" else "numpy")
    except ImportError:
        return None


def _digest(values) -> str:
    h = hashlib.sha256()
    for v in values:
        if v is None or not hasattr(v, "dtype"):
            h.update(repr(v).encode())
            continue
        host = v.get() if hasattr(v, "get") else v
        h.update(f"{host.dtype}{host.shape}{host.strides}".encode())
        h.update(np.ascontiguousarray(host).tobytes())
    return h.hexdigest()


def _expect_error(fn, args, exc, match):
    before = _digest(args.values())
    with pytest.raises(exc, match=match):
        fn(**args)
    assert _digest(args.values()) == before, "an input was modified"


def _to(module, a):
    if module is np:
        return a.get() if hasattr(a, "get") else a
    return module.asarray(a)


def _variants(xp, other, name, a):
    """(label, bad value, exception, message pattern) for one array argument."""
    if xp is np and a.ndim == 2:
        yield "np.matrix", np.asmatrix(a), TypeError, name
    yield "dtype", a.astype(xp.float16), TypeError, name
    yield "rank", a[None], ValueError, name
    yield "shape", (a[..., :-1] if a.ndim > 1 else a[:-1]), ValueError, name
    if a.ndim > 1:
        yield "fortran", xp.asfortranarray(a), ValueError, f"{name}.*contiguous"
        yield "negative stride", a[..., ::-1], ValueError, f"{name}.*contiguous"
    if other is not None:
        yield "other module", _to(other, a), TypeError, name
    yield "list", _to(np, a).astype(np.float32).tolist(), TypeError, name
    yield "None", None, TypeError, f"{name}.*None"


def test_moe_forward_every_argument(path):
    xp, other = _xp(path), _other(path)
    good = make_moe_inputs(CFG, T, seed=0, xp=xp)
    cases = 0
    for name, a in good.items():
        for label, bad, exc, match in _variants(xp, other, name, a):
            if label == "None" and name.startswith("shared"):
                match = f"{name}.*array since config.n_shared_experts"
                exc = ValueError
            args = dict(good, **{name: bad})
            if label == "other module" and name == "hidden_states":
                match = "router_weight"  # the first array fixes the module; the next one is named
            _expect_error(lambda **kw: cupy_moe.moe_forward(**kw, config=CFG), args, exc, match)
            cases += 1
    assert cases == _expected_cases(good, xp, other)


def test_moe_forward_config_disagrees(path):
    xp = _xp(path)
    good = make_moe_inputs(CFG, T, seed=0, xp=xp)
    for other, match in ((MoEConfig(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=4), "expert_gate_weight.*I = 4"),
                         (MoEConfig(hidden_size=32, n_routed_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=8), "hidden_states.*H = 32"),
                         (MoEConfig(hidden_size=16, n_routed_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=8), "router_weight.*E = 4")):
        _expect_error(lambda **kw: cupy_moe.moe_forward(**kw, config=other), good, ValueError, match)
    _expect_error(lambda **kw: cupy_moe.moe_forward(**kw, config=dict(hidden_size=16)), good,
                  TypeError, "config")


def test_moe_backward_arguments(path):
    xp, other = _xp(path), _other(path)
    good = make_moe_inputs(CFG, T, seed=0, xp=xp)
    out, ctx = cupy_moe.moe_forward(**good, config=CFG)
    dy = out.copy()
    for label, bad, exc, match in _variants(xp, other, "grad_output", dy):
        if label == "other module":
            match = "grad_output.*like the forward"
        if label == "None":
            match = "grad_output.*got NoneType"
        _expect_error(lambda **kw: cupy_moe.moe_backward(**kw), dict(grad_output=bad, ctx=ctx),
                      exc, match)
    _expect_error(lambda **kw: cupy_moe.moe_backward(**kw), dict(grad_output=dy, ctx={"x": 1}),
                  TypeError, "ctx")
    assert _digest(good.values()) == _digest(make_moe_inputs(CFG, T, seed=0, xp=xp).values())


def _sol_inputs(xp, T_=6):
    return make_sol080_inputs(T_, 32, 16, 8, 2, seed=0, xp=xp)


def test_sol080_every_argument(path):
    xp, other = _xp(path), _other(path)
    good = _sol_inputs(xp)
    cases = 0
    for name, a in good.items():
        for label, bad, exc, match in _variants(xp, other, name, a):
            if label == "dtype" and a.dtype == np.float16:
                continue
            if label == "other module" and name == "grad_output":
                match = "hidden_states"
            _expect_error(cupy_moe.sol080_backward, dict(good, **{name: bad}), exc, match)
            cases += 1
    assert cases == _expected_cases(good, xp, other)


def test_sol080_bad_routing(path):
    xp = _xp(path)
    good = _sol_inputs(xp)
    idx = _to(np, good["topk_indices"]).copy()
    for value, match in ((8, r"topk_indices.*\[0, 8\).*8"), (-1, "topk_indices.*-1")):
        bad = idx.copy()
        bad[3, 1] = value
        _expect_error(cupy_moe.sol080_backward, dict(good, topk_indices=_to(xp, bad)), ValueError, match)
    bad = idx.copy()
    bad[4, 1] = bad[4, 0]
    _expect_error(cupy_moe.sol080_backward, dict(good, topk_indices=_to(xp, bad)), ValueError,
                  "topk_indices.*row 4")
    wide = make_sol080_inputs(6, 32, 16, 4, 4, seed=0, xp=xp)  # K = E is fine, K > E is not
    cupy_moe.sol080_backward(**wide)
    too_many = dict(wide, topk_indices=xp.zeros((6, 5), xp.int64), topk_weights=xp.zeros((6, 5), xp.float32))
    _expect_error(cupy_moe.sol080_backward, too_many, ValueError, "topk_indices.*K <= E")


def test_zero_tokens(path):
    xp = _xp(path)
    args = make_moe_inputs(CFG, 0, seed=0, xp=xp)
    before = _digest(args.values())
    out, ctx = cupy_moe.moe_forward(**args, config=CFG)
    g = cupy_moe.moe_backward(out, ctx)
    assert out.shape == (0, CFG.hidden_size) and g.hidden_states.shape == (0, CFG.hidden_size)
    assert not any(float(abs(getattr(g, f).astype(xp.float32)).sum()) for f in g._fields[1:])
    assert _digest(args.values()) == before
    s = _sol_inputs(xp, 0)
    before = _digest(s.values())
    res = cupy_moe.sol080_backward(**s)
    assert res[0].shape == (0, 32) and not float(abs(res[1]).sum())
    assert _digest(s.values()) == before


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_propagate(path, bad):
    """A non-finite input value reaches the outputs that depend on it and nothing crashes; rows
    of other tokens stay finite in the forward."""
    xp = _xp(path)
    args = make_moe_inputs(CFG, T, seed=0, xp=xp)
    x = _to(np, args["hidden_states"]).copy()
    x[2, 3] = bad
    args["hidden_states"] = _to(xp, x)
    before = _digest(args.values())
    out, ctx = cupy_moe.moe_forward(**args, config=CFG)
    g = cupy_moe.moe_backward(out, ctx)
    host = _to(np, out).astype(np.float32)
    assert not np.isfinite(host[2]).all()
    assert np.isfinite(np.delete(host, 2, axis=0)).all()
    assert not np.isfinite(_to(np, g.hidden_states).astype(np.float32)).all()
    assert _digest(args.values()) == before
    s = _sol_inputs(xp)
    gout = _to(np, s["grad_output"]).copy()
    gout[1, 0] = bad
    s["grad_output"] = _to(xp, gout)
    res = cupy_moe.sol080_backward(**s)
    assert not np.isfinite(_to(np, res[0]).astype(np.float32)).all()


def test_non_native_byte_order_is_named():
    s = _sol_inputs(np)
    _expect_error(cupy_moe.sol080_backward, dict(s, scores=s["scores"].astype(">f4")), TypeError,
                  r"scores: expected dtype float32, got float32 in non-native byte order \(>f4\)")
