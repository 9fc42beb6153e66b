"""The two precisions of the NumPy reference.

`BF16` is the production policy and mirrors the GPU path: bf16 storage, fp32 arithmetic. Every
place a GPU kernel writes a bf16 array to memory, the reference calls `store` (round to bf16,
nearest-even) at the same point; between those points it computes in fp32. `FLOAT64` stores
nothing rounded and computes in float64: the oracle for finite-difference gradient checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._arrays import bfloat16, round_bf16


@dataclass(frozen=True)
class Precision:
    name: str
    acc: np.dtype      # arithmetic dtype (fp32 / float64); also the router's and dWr's dtype
    storage: np.dtype  # dtype of stored activations and bf16 outputs

    def load(self, a: np.ndarray) -> np.ndarray:
        """Read an array into the arithmetic dtype (bf16 -> fp32 is exact)."""
        return np.asarray(a).astype(self.acc)

    def store(self, a: np.ndarray) -> np.ndarray:
        """A value that the GPU path writes to memory in bf16; returned in the arithmetic dtype."""
        return round_bf16(a) if self.storage == bfloat16 else np.asarray(a, dtype=self.acc)

    def out(self, a: np.ndarray) -> np.ndarray:
        """Cast an already-stored value to the output dtype (exact)."""
        return np.asarray(a).astype(self.storage)


BF16 = Precision("bf16", np.dtype(np.float32), bfloat16)
FLOAT64 = Precision("float64", np.dtype(np.float64), np.dtype(np.float64))


def precision_for(dtype) -> Precision:
    return BF16 if np.dtype(dtype) == bfloat16 else FLOAT64


def sigmoid(z: np.ndarray) -> np.ndarray:
    # exp of -|z| keeps both tails finite without overflow warnings.
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


def silu_and_grad(g: np.ndarray):
    """silu(g) = g*sig(g) and silu'(g) = sig(g) * (1 + g * (1 - sig(g)))."""
    s = sigmoid(g)
    return g * s, s * (1 + g * (1 - s))
