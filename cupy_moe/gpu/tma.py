"""Tensor maps (CUtensorMap) for the Hopper GEMM's TMA loads, encoded by the CUDA driver.

A tensor map describes a bf16 (or, for fp32 results, fp32) tensor of up to 3 dimensions (innermost
first) and the box one TMA copy moves to or from shared memory, with the 128-byte swizzle the
wgmma descriptors expect and zeros for out-of-bounds elements. It travels by value in the kernel's
parameter block.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache



class TmaDesc(ctypes.Structure):
    """CUtensorMap: 128 opaque bytes (64-byte aligned in the kernel's parameter block)."""
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


_BFLOAT16 = 9             # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
_FLOAT32 = 7              # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
_TYPES = {"bf16": (_BFLOAT16, 2), "f32": (_FLOAT32, 4)}  # name -> (driver type, bytes)
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_OOB_FILL_ZEROS = 0


@lru_cache(maxsize=1)
def _encode_tiled():
    lib = ctypes.CDLL("libcuda.so.1")  # the driver CuPy already runs on
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


_encoded = {}  # (address, dims, strides, box, dtype) -> encoded bytes: repeated calls skip the driver


def encode(desc, address: int, dims, strides, box, dtype: str = "bf16") -> None:
    """Fill `desc` (a TmaDesc) for a bf16 tensor (dtype 'f32': fp32) at `address`: dims innermost
    first (elements), strides of dims[1:] in elements (multiples of 16 bytes), box extents in
    elements (<= 256; the innermost one 128-byte swizzle row: 64 bf16 or 32 fp32)."""
    key = (address, tuple(dims), tuple(strides), tuple(box), dtype)
    cached = _encoded.get(key)
    if cached is not None:
        ctypes.memmove(ctypes.addressof(desc), cached, ctypes.sizeof(TmaDesc))
        return
    _encode(desc, address, dims, strides, box, dtype)
    if len(_encoded) > 4096:
        _encoded.clear()
    _encoded[key] = bytes(desc)


def _encode(desc, address, dims, strides, box, dtype) -> None:
    kind, size = _TYPES[dtype]
    rank = len(dims)
    d = (ctypes.c_uint64 * rank)(*dims)
    s = (ctypes.c_uint64 * (rank - 1))(*(size * int(x) for x in strides))
    b = (ctypes.c_uint32 * rank)(*box)
    e = (ctypes.c_uint32 * rank)(*([1] * rank))
    rc = _encode_tiled()(ctypes.addressof(desc), kind, rank, ctypes.c_void_p(address), d, s, b,
                         e, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled returned CUresult {rc} for address {address:#x}, "
                           f"dims {tuple(dims)}, strides {tuple(strides)}, box {tuple(box)}")
