"""A minimal ctypes binding to NVRTC: CUDA C++ source -> cubin, with no GPU and no CUDA toolkit.

NVRTC is found, in order: $CUPY_MOE_NVRTC (a path), the NVIDIA pip wheels on sys.path
(nvidia-cuda-nvrtc-cu12 / -cu13), $CUDA_PATH and /usr/local/cuda, then the loader's search path.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from functools import lru_cache


class NVRTCError(RuntimeError):
    """Compilation failed; the message carries NVRTC's log."""


def _candidates():
    env = os.environ.get("CUPY_MOE_NVRTC")
    if env:
        yield env
        return
    found = []
    for root in sys.path:
        for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu*/lib/libnvrtc.so*"):
            found += glob.glob(os.path.join(root, pattern))
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            found += glob.glob(os.path.join(root, "lib64", "libnvrtc.so*"))
    # Prefer the newest major; skip the '.alt' build and builtins libraries.
    found = [f for f in found if ".alt." not in f and "builtins" not in f]
    found.sort(key=lambda f: [int(p) for p in f.rsplit(".so", 1)[-1].split(".") if p.isdigit()],
               reverse=True)
    yield from found
    lib = ctypes.util.find_library("nvrtc")
    if lib:
        yield lib
    yield from ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")


@lru_cache(maxsize=None)
def _lib():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NVRTCError("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set CUPY_MOE_NVRTC); "
                     "tried: " + "; ".join(errors or ["nothing"]))


def _check(result: int, what: str) -> None:
    if result != 0:
        msg = _lib().nvrtcGetErrorString(result).decode()
        raise NVRTCError(f"{what}: {msg}")


def version() -> tuple:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_lib().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def compile_to_cubin(source: str, name: str, options) -> tuple:
    """Compile one translation unit; returns (cubin bytes, log text). Raises NVRTCError."""
    lib = _lib()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        result = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log_text = log.value.decode(errors="replace")
        if result != 0:
            raise NVRTCError(f"compiling {name} failed:\n{log_text}")
        _check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw, log_text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
