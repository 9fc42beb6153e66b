"""Kernel launch: arguments as ctypes values, the current CuPy stream, checked by the driver.

Every kernel takes plain values or one by-value parameter struct (a ctypes.Structure whose C++
definition is rendered from it, see _build.render_struct); the driver copies them at launch.
"""
from __future__ import annotations

import ctypes

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_smem_set = {}
_functions = {}  # (module, name) -> CUfunction handle


def ptr(a) -> ctypes.c_void_p:
    """Device pointer of a CuPy array (or an int address, or None for null)."""
    if a is None:
        return ctypes.c_void_p(0)
    if isinstance(a, int):
        return ctypes.c_void_p(a)
    return ctypes.c_void_p(a.data.ptr)


def i32(v) -> ctypes.c_int32:
    return ctypes.c_int32(int(v))


def i64(v) -> ctypes.c_int64:
    return ctypes.c_int64(int(v))


def f32(v) -> ctypes.c_float:
    return ctypes.c_float(float(v))


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def grid_stride_blocks(n: int, threads: int = 256) -> int:
    """Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than n
    needs (0 for n = 0, which launch() treats as a no-op)."""
    return min(132 * 8, cdiv(n, threads))


def launch(module, name: str, grid, block, args, shared_mem: int = 0) -> None:
    """Launch module's kernel `name` on the current stream. A grid with a zero extent is a no-op
    (empty problems, e.g. T = 0); any driver error raises CUDADriverError here."""
    import cupy
    from cupy.cuda import driver

    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
    if min(grid) <= 0:
        return
    key = (id(module), name)
    fn = _functions.get(key)
    if fn is None:  # modules live as long as the process (_build caches them), so ids stay valid
        f = module.get_function(name)
        fn = _functions[key] = getattr(f, "kernel", f).ptr  # RawKernel's .kernel is the CUfunction
    if shared_mem > 48 * 1024 and _smem_set.get(fn, 0) < shared_mem:
        driver.funcSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
        _smem_set[fn] = shared_mem
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    stream = cupy.cuda.get_current_stream().ptr
    driver.launchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                        int(shared_mem), stream, ctypes.addressof(params), 0)
