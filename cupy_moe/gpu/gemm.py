"""Launcher of the GEMM engine (cuda_src/gemm.cu): config, parameter struct and grid.

C[m, n] = sum over segments s of A_s(m, :) @ B_s(:, n), bf16 operands, fp32 accumulation.
An operand is K-major when its memory rows run along K (x in x @ W^T, W in x @ W^T) and MN-major
when they run along M or N (W in x @ W, both operands of a weight gradient).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from .. import _build, _launch
from .._launch import cdiv

MAX_SEGMENTS = 4
GROUPINGS = {"none": 0, "m": 1, "k": 2}
EPILOGUES = {"bf16": 0, "f32": 1, "f32_accumulate": 2}


class GemmParams(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_void_p * MAX_SEGMENTS), ("b", ctypes.c_void_p * MAX_SEGMENTS),
        ("lda", ctypes.c_int64 * MAX_SEGMENTS), ("ldb", ctypes.c_int64 * MAX_SEGMENTS),
        ("b_group_stride", ctypes.c_int64 * MAX_SEGMENTS), ("seg_k", ctypes.c_int32 * MAX_SEGMENTS),
        ("num_segments", ctypes.c_int32),
        ("c", ctypes.c_void_p), ("ldc", ctypes.c_int64), ("c_group_stride", ctypes.c_int64),
        ("m", ctypes.c_int32), ("n", ctypes.c_int32),
        ("group_offsets", ctypes.c_void_p), ("num_groups", ctypes.c_int32),
        ("gather_a", ctypes.c_void_p), ("gather_b", ctypes.c_void_p), ("gather_div", ctypes.c_int32),
    ]
    _c_types_ = ["const void*", "const void*", "i64", "i64", "i64", "int", "int", "void*", "i64",
                 "i64", "int", "int", "const int*", "int", "const int*", "const int*", "int"]


@dataclass(frozen=True)
class GemmConfig:
    BM: int = 128
    BN: int = 128
    BK: int = 32
    WARPS_M: int = 2
    WARPS_N: int = 4
    STAGES: int = 4
    A_KMAJOR: bool = True
    B_KMAJOR: bool = True
    VEC_A: bool = True
    VEC_B: bool = True
    GATHER_A: bool = False
    GATHER_B: bool = False
    GROUPING: int = 0
    EPILOGUE: int = 0

    @property
    def threads(self) -> int:
        return self.WARPS_M * self.WARPS_N * 32

    @property
    def smem_bytes(self) -> int:
        a = (self.BM if self.A_KMAJOR else self.BK) * ((self.BK if self.A_KMAJOR else self.BM) + 8)
        b = (self.BN if self.B_KMAJOR else self.BK) * ((self.BK if self.B_KMAJOR else self.BN) + 8)
        return self.STAGES * (a + b) * 2


def prelude(cfg: GemmConfig) -> str:
    return (f"#include \"common/types.cuh\"\nconstexpr int MAX_SEGMENTS = {MAX_SEGMENTS};\n"
            + _build.render_struct(GemmParams) + _build.render_cfg(cfg))


@lru_cache(maxsize=None)
def _module(cfg: GemmConfig):
    return _build.load_module("gemm.cu", prelude(cfg))


@dataclass
class Segment:
    """One K segment: A (lda), B (ldb) and its reduction length k (ignored when K-grouped).
    b_group_stride: elements between consecutive experts' B (M-grouped)."""

    a: object
    lda: int
    b: object
    ldb: int
    k: int = 0
    b_group_stride: int = 0


def _aligned(*values) -> bool:
    return all(int(v) % 8 == 0 for v in values)


def _addr(x) -> int:
    return x if isinstance(x, int) else x.data.ptr


def gemm(*, m: int, n: int, segments: Sequence[Segment], a_kmajor: bool, b_kmajor: bool,
         out, ldc: int, epilogue: str = "bf16", grouping: str = "none",
         group_offsets=None, num_groups: int = 0, c_group_stride: int = 0,
         gather_a=None, gather_b=None, gather_div: int = 1) -> None:
    """Launch one GEMM on the current stream.

    grouping='m': rows are experts' segments group_offsets[g]:group_offsets[g+1] of m total rows,
    B of group g at b + g * b_group_stride. grouping='k': group g reduces over memory lines
    group_offsets[g]:group_offsets[g+1] of both (MN-major) operands into C + g * c_group_stride,
    writing zeros for an empty group. gather_a / gather_b: int32 maps of the operand's memory lines
    (line -> map[line] // gather_div).
    """
    assert 1 <= len(segments) <= MAX_SEGMENTS
    if m == 0 or n == 0:
        return  # nothing to write (an M-grouped grid would otherwise still launch its group slack)
    # 16-byte loads need every line start and every valid extent on an 8-element boundary.
    vec_a = all(_aligned(_addr(s.a) // 2, s.lda, s.k if a_kmajor else m) for s in segments)
    vec_b = all(_aligned(_addr(s.b) // 2, s.ldb, s.b_group_stride, s.k if b_kmajor else n)
                for s in segments)
    cfg = GemmConfig(A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, VEC_A=vec_a, VEC_B=vec_b,
                     GATHER_A=gather_a is not None, GATHER_B=gather_b is not None,
                     GROUPING=GROUPINGS[grouping], EPILOGUE=EPILOGUES[epilogue])
    p = GemmParams()
    for i, s in enumerate(segments):
        p.a[i], p.b[i] = _addr(s.a), _addr(s.b)
        p.lda[i], p.ldb[i], p.b_group_stride[i], p.seg_k[i] = s.lda, s.ldb, s.b_group_stride, s.k
    p.num_segments = len(segments)
    p.c, p.ldc, p.c_group_stride = _addr(out), ldc, c_group_stride
    p.m, p.n = m, n
    p.group_offsets = 0 if group_offsets is None else _addr(group_offsets)
    p.num_groups = num_groups
    p.gather_a = 0 if gather_a is None else _addr(gather_a)
    p.gather_b = 0 if gather_b is None else _addr(gather_b)
    p.gather_div = gather_div
    tiles_n, tiles_m = cdiv(n, cfg.BN), cdiv(m, cfg.BM)
    if grouping == "m":
        grid = (tiles_n, tiles_m + num_groups, 1)
    elif grouping == "k":
        grid = (tiles_n, tiles_m, num_groups)
    else:
        grid = (tiles_n, tiles_m, 1)
    _launch.launch(_module(cfg), "gemm_kernel", grid, (cfg.threads,), [p], cfg.smem_bytes)


def example_configs():
    """Configs the CPU compile test builds: every operand major, grouping and epilogue."""
    out = []
    for grouping in (0, 1, 2):
        for a_k, b_k in ((True, True), (True, False), (False, False)):
            if grouping == 1 and not a_k or grouping == 2 and (a_k or b_k):
                continue
            for vec in (True, False):
                out.append(GemmConfig(A_KMAJOR=a_k, B_KMAJOR=b_k, VEC_A=vec, VEC_B=vec,
                                      GATHER_A=grouping == 1, GATHER_B=grouping == 2,
                                      GROUPING=grouping, EPILOGUE=grouping % 3))
    return out
