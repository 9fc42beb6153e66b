"""The memory-bound kernels of cupy_moe/gpu/elementwise.py against NumPy."""
import numpy as np
import pytest

from cupy_moe import bfloat16

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]


@pytest.mark.parametrize("rows,width,div", [(1, 8, 1), (97, 4096, 8), (33, 36, 3), (0, 16, 2)])
def test_gather_rows(rows, width, div):
    import cupy as cp
    from cupy_moe.gpu.elementwise import gather_rows

    rng = np.random.default_rng(rows + width)
    src = rng.standard_normal((max(rows // div, 1) + 3, width), dtype=np.float32).astype(bfloat16)
    index = rng.integers(0, src.shape[0] * div, rows).astype(np.int32)
    got = gather_rows(cp.asarray(src), cp.asarray(index), div).get()
    np.testing.assert_array_equal(got.view(np.uint16), src[index // div].view(np.uint16))


@pytest.mark.parametrize("tokens,width,K", [(1, 8, 1), (7, 264, 8), (333, 4096, 8), (5, 36, 6),
                                            (64, 520, 2), (3, 16, 33)])
def test_rows_by_expert_equals_the_gather(tokens, width, K):
    """The scatter from token order (a warp per token, K destinations) gives bitwise the gather
    into the experts' order, every destination row written (poisoned memory shows a missed one):
    widths off 8 (element path), off 256 (a partial last pass of the warp), K > 32."""
    import cupy as cp
    from cupy_moe.gpu.elementwise import gather_rows, rows_by_expert

    rng = np.random.default_rng(tokens * width + K)
    src = rng.standard_normal((tokens, width), dtype=np.float32).astype(bfloat16)
    sorted_slots = rng.permutation(tokens * K).astype(np.int32)  # row r holds slot sorted_slots[r]
    slot_rows = np.empty_like(sorted_slots)
    slot_rows[sorted_slots] = np.arange(tokens * K, dtype=np.int32)
    got = rows_by_expert(cp.asarray(src), cp.asarray(slot_rows), K).get()
    want = gather_rows(cp.asarray(src), cp.asarray(sorted_slots), K).get()
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(got.view(np.uint16), src[sorted_slots // K].view(np.uint16))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 4099, 1_000_003])
def test_swiglu_forward_vector_and_element_paths(n):
    """a = bf16(silu(g) u): 16-byte chunks where gate, up and a are 16-byte aligned, element by
    element where not (views one element in) and for the last n % 8: bitwise the same values, and
    within bf16's rounding of NumPy's fp32 (every element written: the output is poisoned)."""
    import cupy as cp
    from cupy_moe.gpu.elementwise import swiglu_forward

    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n + 1, dtype=np.float32) * 6).astype(bfloat16)  # sigmoid's tails too
    u = rng.standard_normal(n + 1, dtype=np.float32).astype(bfloat16)
    gd, ud = cp.asarray(g), cp.asarray(u)
    aligned = swiglu_forward(gd[:n], ud[:n]).get()
    shifted = swiglu_forward(gd[1:], ud[1:]).get()  # 2-byte offsets: the element path
    gf, uf = g.astype(np.float32), u.astype(np.float32)
    want = (gf * (1 / (1 + np.exp(-gf))) * uf).astype(bfloat16)
    for got, ref in ((aligned, want[:n]), (shifted, want[1:])):
        assert not np.isnan(got.astype(np.float32)).any()
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=1e-2, atol=1e-3)
    # The shifted inputs through the vector path too: copied into fresh (aligned) arrays.
    again = swiglu_forward(gd[1:].copy(), ud[1:].copy()).get()
    np.testing.assert_array_equal(again.view(np.uint16), shifted.view(np.uint16))
