"""Kernel launch: arguments as ctypes values, the current CuPy stream, checked by the driver.

Every kernel takes plain values or one by-value parameter struct (a ctypes.Structure whose C++
definition is rendered from it, see _build.render_struct); the driver copies them at launch.

Launches are programmatic dependent launches (cuLaunchKernelEx with the programmatic stream
serialization attribute): a kernel may be launched while the grid before it on the stream is
still finishing, and waits in wait_prior_grids() (cuda_src/common/types.cuh), which every kernel
calls before touching memory, so its launch latency and set-up overlap that grid's tail. Graph
capture keeps these as programmatic edges. CUPY_MOE_PDL=0 (or PDL = False) launches plainly.
"""
from __future__ import annotations

import ctypes
import os
from functools import lru_cache

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
PDL = os.environ.get("CUPY_MOE_PDL", "1") != "0"
_smem_set = {}
_functions = {}  # (module, name) -> CUfunction handle


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte union at 8
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


_PDL_ATTRIBUTE = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
_PDL_ATTRIBUTE.value[0] = 1  # programmaticStreamSerializationAllowed


@lru_cache(maxsize=1)
def _launch_kernel_ex():
    """The driver's cuLaunchKernelEx (CUDA 12+), or None where the driver library lacks it."""
    try:
        f = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return f


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


def _function(module, name: str, shared_mem: int) -> int:
    """The kernel's CUfunction handle, allowed shared_mem bytes of dynamic shared memory."""
    from cupy.cuda import driver

    key = (id(module), name)
    fn = _functions.get(key)
    if fn is None:  # modules live as long as the process (_build caches them), so ids stay valid
        f = module.get_function(name)
        fn = _functions[key] = getattr(f, "kernel", f).ptr  # RawKernel's .kernel is the CUfunction
    if shared_mem > 48 * 1024 and _smem_set.get(fn, 0) < shared_mem:
        driver.funcSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
        _smem_set[fn] = shared_mem
    return fn


def max_active_clusters(module, name: str, threads: int, shared_mem: int, cluster: int):
    """How many clusters of `cluster` CTAs of the kernel the device holds at once (a cluster's
    CTAs share a GPC, so this is not SMs // cluster), or None where the driver cannot say."""
    try:
        f = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
    fn = _function(module, name, shared_mem)
    attrs = (_LaunchAttribute * 1)(_cluster_attribute(cluster))
    config = _LaunchConfig((ctypes.c_uint * 3)(cluster, 1, 1), (ctypes.c_uint * 3)(threads, 1, 1),
                           int(shared_mem), None, attrs, 1)
    count = ctypes.c_int(0)
    return count.value if f(ctypes.byref(count), fn, ctypes.byref(config)) == 0 else None


def _cluster_attribute(size: int) -> _LaunchAttribute:
    attr = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    attr.value[0], attr.value[1], attr.value[2] = size, 1, 1
    return attr


def launch(module, name: str, grid, block, args, shared_mem: int = 0, cluster: int = 1) -> None:
    """Launch module's kernel `name` on the current stream. A grid with a zero extent is a no-op
    (empty problems, e.g. T = 0); any driver error raises CUDADriverError here. cluster > 1:
    consecutive groups of that many CTAs along x form thread-block clusters (grid[0] a multiple)."""
    import cupy
    from cupy.cuda import driver

    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
    if min(grid) <= 0:
        return
    fn = _function(module, name, shared_mem)
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    stream = cupy.cuda.get_current_stream().ptr
    attrs = ([_PDL_ATTRIBUTE] if PDL else []) + ([_cluster_attribute(cluster)] if cluster > 1 else [])
    launch_ex = _launch_kernel_ex() if attrs else None
    if launch_ex is None:
        if cluster > 1:
            raise RuntimeError("a cluster launch needs the driver's cuLaunchKernelEx (CUDA 12+)")
        driver.launchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                            int(shared_mem), stream, ctypes.addressof(params), 0)
        return
    assert grid[0] % cluster == 0, (grid, cluster)
    array = (_LaunchAttribute * len(attrs))(*attrs)
    config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), int(shared_mem),
                           stream, array, len(attrs))
    status = launch_ex(ctypes.byref(config), fn, ctypes.addressof(params), None)
    if status != 0:
        raise driver.CUDADriverError(status)
