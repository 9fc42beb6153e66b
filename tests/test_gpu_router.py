"""The router's GPU stages that the layer tests reach only at some sizes: the split-K weight
gradient (every split count, both GEMM main loops) against NumPy in float64."""
import numpy as np
import pytest

from cupy_moe import bfloat16

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]


# (T, E, H): one token; a single split; 2-3 splits of uneven size; E = 6 (strides not a multiple of
# 8: the portable main loop); E = 128 at GLM size with as many splits as fill the GPU; E = 256
# (two row blocks per half). stacked: the split pieces as one GEMM of [hi; lo] rows (x read once),
# or (router.STACKED = False, the A/B path) as two reductions of E rows.
@pytest.mark.parametrize("stacked,cluster,paired", [(True, True, True), (True, True, False), (True, False, True),
                                                    (False, False, True)])
@pytest.mark.parametrize("T,E,H", [(1, 128, 256), (300, 16, 640), (777, 128, 512), (1031, 6, 136),
                                   (8192, 128, 4096), (2053, 256, 384), (1879, 128, 4096), (515, 128, 200)])
def test_weight_gradient(T, E, H, stacked, cluster, paired, monkeypatch):
    """cluster (gemm.SPLIT_CLUSTER): the stacked pieces summed inside the GEMM, a cluster per
    output tile (E a multiple of 128; at every T here, past the T where the library stops choosing
    it), of its pieces with both [hi; lo] halves in each CTA (paired: gemm.PAIRED_HALVES) or of
    its 2 x splits (piece, half) tiles; or through global memory."""
    import cupy as cp
    from cupy_moe.gpu import gemm, router

    monkeypatch.setattr(router, "STACKED", stacked)
    monkeypatch.setattr(gemm, "SPLIT_CLUSTER", cluster)
    monkeypatch.setattr(gemm, "PAIRED_HALVES", paired)
    monkeypatch.setattr(router, "_CLUSTER_SUM_MAX_T", 1 << 30)
    rng = np.random.default_rng(T + E)
    grl = rng.standard_normal((T, E)) * 1e-3
    hi = grl.astype(np.float32).astype(bfloat16)
    lo = (grl - hi.astype(np.float64)).astype(np.float32).astype(bfloat16)
    x = rng.standard_normal((T, H), dtype=np.float32).astype(bfloat16)
    hi_lo = cp.asarray(np.concatenate([hi, lo], axis=1))  # [T, 2E], backward_logits' layout
    out = cp.empty((E, H), cp.float32)
    router.weight_gradient(hi_lo, cp.asarray(x), out)
    ref = (hi.astype(np.float64) + lo.astype(np.float64)).T @ x.astype(np.float64)
    got = out.get()
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    again = cp.empty((E, H), cp.float32)
    router.weight_gradient(hi_lo, cp.asarray(x), again)
    np.testing.assert_array_equal(again.get(), got)  # deterministic
