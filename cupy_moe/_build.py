"""Kernel build system: cuda_src -> NVRTC -> cubin -> content-hashed disk cache -> cupy.RawModule.

A translation unit is a rendered prelude (the kernel family's `struct Cfg` and parameter structs,
see `render_cfg` / `render_struct`) followed by `#include "<entry>.cu"`. The cache key hashes the
whole cuda_src tree, the prelude, the options and the NVRTC version, so any edit recompiles.
Environment:
  CUPY_MOE_CACHE_DIR  cache folder (default $XDG_CACHE_HOME/cupy_moe or ~/.cache/cupy_moe);
                      set it to an empty string or 'off' to disable the disk cache.
  CUPY_MOE_NVRTC      path of libnvrtc to use (see _nvrtc).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from . import _nvrtc

_HERE = Path(__file__).resolve().parent


def cuda_src_dir() -> Path:
    """cuda_src inside an installed wheel (cupy_moe/cuda_src) or beside the package in a checkout."""
    for cand in (_HERE / "cuda_src", _HERE.parent / "cuda_src"):
        if (cand / "gemm.cu").is_file():
            return cand
    raise FileNotFoundError(f"cuda_src not found next to {_HERE}")


def entry_files() -> list:
    """Every kernel entry file (cuda_src/*.cu)."""
    return sorted(p.name for p in cuda_src_dir().glob("*.cu"))


@lru_cache(maxsize=1)
def _tree_hash() -> str:
    h = hashlib.sha256()
    root = cuda_src_dir()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".cu", ".cuh") and p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def render_cfg(cfg, name: str = "Cfg") -> str:
    """A frozen dataclass of ints/bools -> `struct Cfg { static constexpr int BM = 128; ... };`."""
    lines = [f"struct {name} {{"]
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, bool):
            lines.append(f"  static constexpr bool {f.name} = {'true' if v else 'false'};")
        elif isinstance(v, int):
            lines.append(f"  static constexpr int {f.name} = {v};")
        else:
            raise TypeError(f"{name}.{f.name}: only int and bool fields render, got {type(v).__name__}")
    lines.append("};")
    return "\n".join(lines) + "\n"


def render_struct(cls) -> str:
    """A ctypes.Structure with `_c_types_` C spellings -> its C++ definition (one layout for both),
    and a compile-time check that the C++ compiler agrees on its size."""
    import ctypes

    name = cls.__name__
    lines = [f"struct {name} {{"]
    for (fname, ftype), ctype in zip(cls._fields_, cls._c_types_):
        dim = f"[{ftype._length_}]" if hasattr(ftype, "_length_") else ""
        lines.append(f"  {ctype} {fname}{dim};")
    lines.append("};")
    lines.append(f"static_assert(sizeof({name}) == {ctypes.sizeof(cls)}, \"{name}: size differs from Python\");")
    return "\n".join(lines) + "\n"


def target_arch(compute_capability: str = "90") -> str:
    # wgmma and setmaxnreg need the arch-specific sm_90a target on Hopper.
    return "sm_90a" if compute_capability == "90" else f"sm_{compute_capability}"


def compile_options(arch: str, verbose: bool = False) -> list:
    opts = [f"--gpu-architecture={arch}", "--std=c++17", f"--include-path={cuda_src_dir()}"]
    if verbose:
        opts.append("--ptxas-options=-v")
    return opts


def _cache_dir():
    env = os.environ.get("CUPY_MOE_CACHE_DIR")
    if env is not None:
        return None if env.strip() in ("", "off", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cupy_moe"


def compile_entry(entry: str, prelude: str = "", arch: str = "sm_90a", verbose: bool = False):
    """Compile cuda_src/<entry> after `prelude`; returns (path of the cubin, NVRTC log).

    The cubin comes from the disk cache when the key matches; otherwise it is compiled and written
    atomically (temporary file + rename), so concurrent processes never see half a file. With the
    cache disabled the cubin goes to a folder that lives as long as the process.
    """
    source = f"{prelude}\n#include \"{entry}\"\n"
    options = compile_options(arch, verbose)
    key = hashlib.sha256("\0".join(
        [_tree_hash(), entry, source, *options, repr(_nvrtc.version())]).encode()).hexdigest()
    folder = _cache_dir() or Path(_process_dir().name)
    path = folder / f"{Path(entry).stem}-{key[:32]}.cubin"
    if path.is_file() and not verbose:
        return path, ""
    cubin, log = _nvrtc.compile_to_cubin(source, f"{Path(entry).stem}_tu.cu", options)
    try:
        _atomic_write(path, cubin)
    except OSError:  # a read-only or full cache folder: fall back to the process folder
        path = Path(_process_dir().name) / path.name
        _atomic_write(path, cubin)
    return path, log


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(data)
    os.replace(f.name, path)


@lru_cache(maxsize=1)
def _process_dir():
    return tempfile.TemporaryDirectory(prefix="cupy_moe-")


_modules = {}  # (device, entry, prelude) -> cupy.RawModule
TRACE_DEFINE = "#define CUPY_MOE_TRACE 1\n"


def tracing() -> bool:
    """Whether kernels are built with trace.cuh's records (CUPY_MOE_TRACE=1, bench/sm_timeline.py)."""
    return os.environ.get("CUPY_MOE_TRACE") == "1"


def load_module(entry: str, prelude: str = ""):
    """The cupy.RawModule of an entry for the current device (compiled and loaded at most once).
    With CUPY_MOE_TRACE=1 in the environment every kernel records its blocks' SMs and times
    (cuda_src/common/trace.cuh; read by bench/sm_timeline.py): other cubins, the same math."""
    import cupy

    if tracing():
        prelude = TRACE_DEFINE + prelude
    watchdog = os.environ.get("CUPY_MOE_WATCHDOG") == "1"
    if watchdog:
        prelude = WATCHDOG_DEFINE + prelude
    dev = cupy.cuda.Device()
    k = (dev.id, entry, prelude)
    mod = _modules.get(k)
    if mod is None:
        path, _ = compile_entry(entry, prelude, target_arch(dev.compute_capability))
        mod = _modules[k] = cupy.RawModule(path=str(path))
        if watchdog:
            _point_watchdog(mod)
    return mod


WATCHDOG_DEFINE = "#define CUPY_MOE_WATCHDOG 1\n"
WATCHDOG_RECORDS = 1024  # (cuda_src/common/hopper.cuh: kWatchdogRecords, WatchdogRecord)


@lru_cache(maxsize=1)
def watchdog_records():
    """The host-mapped records every CUPY_MOE_WATCHDOG=1 module writes its stuck waits into
    (fields block, thread, bar, parity, written): a NumPy view that a host thread can read while a
    kernel hangs (bench/NOTES.md v0.53). Each module counts its own records from slot 0, for the
    module's lifetime: read them after the first hang, not across several modules' hangs."""
    import cupy
    import numpy as np

    dtype = np.dtype([(f, "<u4") for f in ("block", "thread", "bar", "parity", "written")])
    view = np.frombuffer(cupy.cuda.alloc_pinned_memory(WATCHDOG_RECORDS * dtype.itemsize), dtype,
                         WATCHDOG_RECORDS)  # (the view keeps the pinned block alive)
    view[:] = 0
    return view


def _point_watchdog(mod):
    import cupy
    import numpy as np

    try:
        ptr = mod.get_global("cupy_moe_watchdog_out")
    except cupy.cuda.driver.CUDADriverError:  # (an entry without hopper.cuh)
        return
    # Pinned memory is mapped at its host address under unified addressing.
    ptr.copy_from_host(np.array([watchdog_records().ctypes.data], np.uint64).ctypes.data, 8)
