import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _gpu_reason():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__})"
    if n == 0:
        return "no CUDA device"
    cc = cupy.cuda.Device(0).compute_capability
    if cc != "90":
        return f"needs an sm_90 GPU, found sm_{cc}"
    return None


GPU_SKIP_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {GPU_SKIP_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poisoned_memory():
    """Every CuPy allocation starts as 0xFF bytes (NaN in bf16/fp32, -1 in ints), so an output
    element that no kernel wrote shows up in the comparison."""
    import cupy

    pool = cupy.cuda.MemoryPool()

    def alloc(size):
        mem = pool.malloc(size)
        cupy.cuda.runtime.memsetAsync(mem.ptr, 0xFF, size, cupy.cuda.get_current_stream().ptr)
        return mem

    cupy.cuda.set_allocator(alloc)
    try:
        yield
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        pool.free_all_blocks()
