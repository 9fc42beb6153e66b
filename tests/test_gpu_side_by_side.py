"""side_by_side on the GPU: two GEMMs at once on their shares of the SMs give bitwise what they
give one after the other, and the caller's stream waits for both."""
import numpy as np
import pytest

from cupy_moe import bfloat16
from cupy_moe.testing import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]


def _bf16(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32).astype(bfloat16)


@pytest.mark.parametrize("transposed", [False, True])
def test_side_by_side_equals_one_after_the_other(transposed, monkeypatch):
    """[2 I x H] = [dg | du]^T x beside dWd = dy^T a (stored transposed or not), K = T = 1031
    lines (no multiple of 64), I = 136, H = 520 (no multiple of a tile): the shared expert's
    weight gradients, small. The result the caller's stream reads right after is complete."""
    import cupy as cp

    from cupy_moe.gpu import side_by_side as S
    from cupy_moe.gpu.gemm import Segment, device_sms, gemm, sm90_applies

    T, I, H = 1031, 136, 520
    rng = np.random.default_rng(3)
    dgu, x, a, dy = (cp.asarray(_bf16(rng, T, w)) for w in (2 * I, H, I, H))
    if not sm90_applies(2 * I, H, [Segment(dgu, 2 * I, x, H, k=T)], False, False):
        pytest.skip("the Hopper main loop does not apply here")
    first = lambda out: dict(m=2 * I, n=H, segments=[Segment(dgu, 2 * I, x, H, k=T)],
                             a_kmajor=False, b_kmajor=False, out=out, ldc=H)
    if transposed:
        second = lambda out: dict(m=I, n=H, segments=[Segment(a, I, dy, H, k=T)], a_kmajor=False,
                                  b_kmajor=False, out=out, ldc=I, out_transposed=True)
    else:
        second = lambda out: dict(m=H, n=I, segments=[Segment(dy, H, a, I, k=T)], a_kmajor=False,
                                  b_kmajor=False, out=out, ldc=I)
    assert S.split_sms((4, 4), (10, 10), device_sms()) == 0  # below the gain worth a fork
    monkeypatch.setattr(S, "MIN_GAIN_STEPS", 0)
    assert S.split_sms((4, 4), (10, 10), device_sms()) > 0  # so this one runs side by side
    outs = [cp.empty((2 * I, H), bfloat16), cp.empty((H, I), bfloat16)]
    S.side_by_side(first(outs[0]), second(outs[1]))
    got = [o.get() for o in outs]  # read on the caller's stream, no other sync
    refs = [cp.empty((2 * I, H), bfloat16), cp.empty((H, I), bfloat16)]
    gemm(**first(refs[0]))
    gemm(**second(refs[1]))
    f = lambda v: cp.asnumpy(v).astype(np.float32)
    want = [f(dgu).T @ f(x), f(dy).T @ f(a)]
    for g, r, w in zip(got, refs, want):
        assert np.isfinite(g.astype(np.float32)).all()
        np.testing.assert_array_equal(g.view(np.uint16), r.get().view(np.uint16))
        assert relative_error(g, w) < 1e-2
