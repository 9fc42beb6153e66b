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
