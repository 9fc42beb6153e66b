"""Array-module dispatch and the bf16 dtype, shared by both paths."""
from __future__ import annotations

import ml_dtypes
import numpy as np

#: The bf16 dtype of every bf16 array, NumPy and CuPy alike.
bfloat16 = np.dtype(ml_dtypes.bfloat16)


def is_cupy_array(a) -> bool:
    # Checked by module name so the NumPy path never imports CuPy.
    return type(a).__module__.split(".")[0] == "cupy"


def is_array(a) -> bool:
    # np.matrix is an ndarray whose `*` multiplies matrices: never a valid input here.
    return (isinstance(a, np.ndarray) and not isinstance(a, np.matrix)) or is_cupy_array(a)


def array_module(named_arrays):
    """Return numpy or cupy for a sequence of (name, array) pairs; None entries are skipped.

    Raises TypeError naming the first argument that is not an array, or that comes from the other
    module than the first array (mixing NumPy and CuPy is never silently copied across).
    """
    first_name, first_gpu = None, None
    for name, a in named_arrays:
        if a is None:
            continue
        if not is_array(a):
            raise TypeError(f"{name}: expected a numpy.ndarray or cupy.ndarray, got {type(a).__name__}")
        gpu = is_cupy_array(a)
        if first_name is None:
            first_name, first_gpu = name, gpu
        elif gpu != first_gpu:
            kinds = {True: "cupy.ndarray", False: "numpy.ndarray"}
            raise TypeError(f"{name}: expected a {kinds[first_gpu]} like {first_name}, "
                            f"got a {kinds[gpu]} (NumPy and CuPy arrays cannot be mixed)")
    if first_name is None:
        raise TypeError("expected at least one array argument")
    if first_gpu:
        import cupy
        return cupy
    return np


def round_bf16(a: np.ndarray) -> np.ndarray:
    """Round to bf16 (nearest-even) and return the value as float32 (NumPy)."""
    return np.asarray(a, dtype=np.float32).astype(bfloat16).astype(np.float32)
