"""Launcher of the GEMM engine: config, parameter struct, main loop and grid.

C[m, n] = sum over segments s of A_s(m, :) @ B_s(:, n), bf16 operands, fp32 accumulation.
An operand is K-major when its memory rows run along K (x in x @ W^T, W in x @ W^T) and MN-major
when they run along M or N (W in x @ W, both operands of a weight gradient).

Two main loops take the same parameters: the Hopper one (cuda_src/gemm_sm90.cu: TMA, wgmma,
warp-specialised, persistent) whenever the device is sm_90 and every address and stride is
16-byte aligned, and the portable one (cuda_src/gemm.cu: cp.async + mma.sync, any shape) otherwise.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from .. import _build, _launch
from .._launch import cdiv
from . import settings
from .tma import TmaDesc, encode

MAX_SEGMENTS = 4
# Which way the Hopper loop's consumer warpgroups share tiles: "auto" (ping-pong for K-grouped
# GEMMs where 256-wide cooperative tiles do not pay (wide_tiles_pay): their short per-expert
# reductions gain from the hidden epilogue; cooperative elsewhere, where 128 x 256 tiles need less
# shared-memory bandwidth per FLOP than ping-pong's 128 x 128, bench/NOTES.md v0.3), or True /
# False for every GEMM (tests and benchmarks compare both; CUPY_MOE_PINGPONG=1 / 0 sets it).
PINGPONG = {"1": True, "0": False}.get(os.environ.get("CUPY_MOE_PINGPONG", ""), "auto")
# Whether the Hopper loop's fused SwiGLU backward runs on spare producer warps from accumulators
# staged in shared memory, overlapped with the next tile's main loop (else the consumer warpgroups
# run it after each tile's main loop, the tensor cores idle); CUPY_MOE_STAGED_EPILOGUE=0 turns it
# off for a process (A/B, tests).
STAGED_EPILOGUE = os.environ.get("CUPY_MOE_STAGED_EPILOGUE", "1") != "0"
# Staging units per consumer warpgroup for the bf16 TMA stores of cooperative 128 x 256 tiles
# (Sm90Config.STORE_RING): 2 (16 KB reused as the stores read it, so 4 stages fit beside it) or 0
# (64 rows x 256 in one buffer, 3 stages). CUPY_MOE_STORE_RING sets it (A/B).
STORE_RING = int(os.environ.get("CUPY_MOE_STORE_RING", "2"))
if STORE_RING not in (0, 2):
    raise ValueError(f"CUPY_MOE_STORE_RING: expected 0 or 2, got {STORE_RING}")
# The same for ping-pong 128 x 128 tiles (each warpgroup stages its whole tile, 32 KB, else): 2
# units of 64 x 64 a warpgroup, which frees a 6th stage. SOL-080's short-K weight gradients alone
# ([2816 x K] x [K x 4096]): K = 384 / 512 -0.7..-1.0 us (-4%), K = 64 / 192 within +-0.4; the
# call (grad_Wd ping-pong up to T = 4096, grad_[Wg; Wu] up to 512) -0.5 / -0.7 us on the mean in
# two A/Bs (3072 / 3089 / 4093 -0.9..-1.7, 192 +0.9..+1.2); the same bits (bench/NOTES.md v0.51).
# CUPY_MOE_PINGPONG_STORE_RING = 2 | 0 (A/B).
PINGPONG_STORE_RING = int(os.environ.get("CUPY_MOE_PINGPONG_STORE_RING", "2"))
if PINGPONG_STORE_RING not in (0, 2):
    raise ValueError(f"CUPY_MOE_PINGPONG_STORE_RING: expected 0 or 2, got {PINGPONG_STORE_RING}")
# Benchmarks only: Sm90Config fields forced onto every Hopper config choose() makes (tile studies;
# the caller keeps the result within shared memory). Empty in normal use.
CONFIG_OVERRIDE: dict = {}
# k_splits with a bf16 or SwiGLU epilogue: the pieces of a tile form a thread-block cluster and are
# summed over DSMEM before the epilogue (Cfg::SPLIT_CLUSTER). 0: the fp32 pieces go through
# global memory and the caller's kernel instead (A/B; see gpu/sol080.py).
SPLIT_CLUSTER = os.environ.get("CUPY_MOE_SPLIT_CLUSTER", "1") != "0"
# sum_groups_and_halves (SOL-080's router wgrad: [hi; lo]^T x in token pieces) with each CTA
# multiplying both halves' rows against one load of x and adding them in registers
# (Sm90Config.PAIR_ROWS), the cluster over the pieces alone: half the CTAs' operand bytes per
# FLOP and no halves to sum over DSMEM. 0: a CTA per (piece, half), all in the cluster (A/B;
# CUPY_MOE_PAIRED_HALVES=0).
PAIRED_HALVES = os.environ.get("CUPY_MOE_PAIRED_HALVES", "1") != "0"
# Ungrouped, unsplit 128 x 256 GEMMs walk their tiles in bands of BAND_ROWS row tiles (each band's
# columns in turn, its rows fastest: Sm90Config.BAND_M), so that the 16 CTAs of a GPC, which take
# consecutive tiles, share four A row blocks and four B column blocks instead of one A row block
# and sixteen of B (bench/NOTES.md v0.31: 1-3% a GEMM alone, SOL-080 -0.4..-1.5 us on the mean).
# Narrower tiles (BAND_NARROW_ROWS) and grouped GEMMs (BAND_GROUPED_ROWS: M-grouped over all row
# tiles, K-grouped within each group) gained nothing or lost, and keep the plain order (1).
# CUPY_MOE_BAND_ROWS / _BAND_NARROW / _BAND_GROUPED set them (A/B).
BAND_ROWS = int(os.environ.get("CUPY_MOE_BAND_ROWS", "4"))
BAND_NARROW_ROWS = int(os.environ.get("CUPY_MOE_BAND_NARROW", "1"))
BAND_GROUPED_ROWS = int(os.environ.get("CUPY_MOE_BAND_GROUPED", "1"))
# Except M-grouped GEMMs whose one expert's B (the sum over segments of k x n bf16) is most of the
# L2 (50 MB on H100 / H200): their row tiles go in bands of WIDE_B_BAND. In the plain order an
# expert's row tiles of one column are claimed tiles_n apart, a whole expert's B between them, and
# DeepSeek-V3's 58.7 MB [Wg; Wu] a expert leaves L2 in between: its routed dgrad alone ran 7.0-7.1
# ms balanced (6.1-6.2 with one weight for all experts), 6.1-6.3 in bands of 4 row tiles (2: 6.3,
# 8: 6.4, 16: 7.3), -7..-10% with random routing too, the DeepSeek-V3 layer -4%. At ~30 MB a
# expert (GLM-4.5's dgrad, DeepSeek-V3's fused dgrad) bands read +-3% by routing, and at
# GLM-4.5-Air's 23 MB no gain or a loss (bench/grouped_alone.py, bench/NOTES.md v0.57).
# CUPY_MOE_WIDE_B_BAND / CUPY_MOE_WIDE_B_BYTES set them (A/B; a band of 1 is the plain order).
WIDE_B_BAND = int(os.environ.get("CUPY_MOE_WIDE_B_BAND", "4"))
WIDE_B_BYTES = int(os.environ.get("CUPY_MOE_WIDE_B_BYTES", str(40 << 20)))
# K-major A boxes that reach past the map's last row (zero-filled by the TMA unit) slow the loads
# of every CTA of the GEMM, not only their own: SOL-080's dgrad shape alone at T = 449 ran 25.3-26.0
# us against 20.5-20.6 with the last row tile's box cut to its rows, d_act's at 2053 48.5 against
# 46.8 (bench/NOTES.md v0.45). So the last row tile of an ungrouped GEMM loads exactly its m % 128
# rows (_prepare_sm90, mainloop_wgmma.cuh). In the whole SOL-080 call the gain is small (-0.1..-0.6
# us over the 11 workloads with such tiles, in three A/Bs). Not done, measured: MN-major K tails
# shifted back inside the map as K-grouped tiles do (+0.2..+2.9 us a SOL-080 call), B's atoms past
# n left unloaded (no gain). CUPY_MOE_TAIL_BOXES=0: the 128-row box (A/B).
TAIL_BOXES = os.environ.get("CUPY_MOE_TAIL_BOXES", "1") != "0"
# An ungrouped GEMM with MN-major A and B (a weight gradient over tokens) loads a segment's short
# last k-step by boxes of exactly its lines and the stage's other lines by bulk copies of zeros
# (Sm90Config.K_TAIL), instead of boxes whose lines past K the TMA unit zero-fills (the cost
# above); CUPY_MOE_K_TAIL_BOXES=0: those boxes (A/B).
K_TAIL_BOXES = os.environ.get("CUPY_MOE_K_TAIL_BOXES", "1") != "0"

# fp32 results (epilogue 'f32': the layer's dx_rest) leave through shared memory and TMA stores, as
# bf16 ones do, instead of from registers (4.5 us a 128 x 256 tile, the tensor cores idle).
# CUPY_MOE_F32_TMA=0: from registers (A/B; the same bits).
F32_TMA = os.environ.get("CUPY_MOE_F32_TMA", "1") != "0"
# Which Hopper launches claim their tiles as the CTAs go (an atomic counter pair per launch,
# cuda_src/gemm/tile_feed.cuh) instead of each CTA taking every gridDim-th tile: "grouped" (M- and
# K-grouped GEMMs, whose tiles differ in cost at the experts' ends: +1-6% on the grouped GEMM
# table, layer backward -0.8%), "all", or "none". The same bits either way. Dense GEMMs keep the
# static order: SOL-080, whose concurrent dense GEMMs share the SMs, measured 1.3 us slower on
# its mean with claims for all of them (bench/NOTES.md v0.10); it asks for them per launch
# (gemm(dynamic=True)) where a GEMM's CTAs start staggered (sol080.CLAIMS, v0.28).
# CUPY_MOE_DYNAMIC_TILES sets it (A/B).
_dynamic_tiles = os.environ.get("CUPY_MOE_DYNAMIC_TILES", "grouped")
DYNAMIC_TILES = {"0": "none", "1": "all"}.get(_dynamic_tiles, _dynamic_tiles)
if DYNAMIC_TILES not in ("grouped", "all", "none"):
    raise ValueError(f"CUPY_MOE_DYNAMIC_TILES: expected grouped, all or none (or 1 / 0), got {DYNAMIC_TILES!r}")
GROUPINGS = {"none": 0, "m": 1, "k": 2}
EPILOGUES = {"bf16": 0, "f32": 1, "f32_accumulate": 2, "swiglu_backward": 3}
ENGINES = ("auto", "sm90", "mma")


def wide_tiles_pay(n: int, grouping: int) -> bool:
    """Whether cooperative 128 x 256 tiles beat 128-wide ones for n outputs: where 256 divides n,
    and for K-grouped weight gradients also where the last tile's padding costs at most 10% (n =
    1408: 1370 vs 1446 us for ping-pong 128 x 128, bench/tile_study.py; their per-expert
    reductions are short, so the wide tile's lower operand traffic per FLOP decides)."""
    if n % 256 == 0:
        return True
    return grouping == GROUPINGS["k"] and cdiv(n, 256) * 256 <= 1.1 * n


class GemmParams(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_void_p * MAX_SEGMENTS), ("b", ctypes.c_void_p * MAX_SEGMENTS),
        ("lda", ctypes.c_int64 * MAX_SEGMENTS), ("ldb", ctypes.c_int64 * MAX_SEGMENTS),
        ("b_group_stride", ctypes.c_int64 * MAX_SEGMENTS), ("seg_k", ctypes.c_int32 * MAX_SEGMENTS),
        # Rows of A each segment has (0: all m); the Hopper loop skips it for tiles past them.
        ("seg_m", ctypes.c_int32 * MAX_SEGMENTS),
        ("num_segments", ctypes.c_int32),
        ("c", ctypes.c_void_p), ("ldc", ctypes.c_int64), ("c_group_stride", ctypes.c_int64),
        ("m", ctypes.c_int32), ("n", ctypes.c_int32),
        ("group_offsets", ctypes.c_void_p), ("num_groups", ctypes.c_int32),
        ("gather_a", ctypes.c_void_p), ("gather_b", ctypes.c_void_p), ("gather_div", ctypes.c_int32),
        # The SwiGLU-backward epilogue's operands (rows and leading dimension of C).
        ("e_gate", ctypes.c_void_p), ("e_up", ctypes.c_void_p), ("e_act", ctypes.c_void_p),
        ("e_row_weight", ctypes.c_void_p), ("e_row_index", ctypes.c_void_p),
        ("e_dg", ctypes.c_void_p), ("e_du", ctypes.c_void_p),
        ("e_aw", ctypes.c_void_p), ("e_row_partial", ctypes.c_void_p), ("e_partial_ld", ctypes.c_int32),
        ("e_contract", ctypes.c_int32), ("e_ld_grad", ctypes.c_int64),
        # Nonzero at launch time: the kernel does nothing (a failed input check; see cancelled()).
        ("cancel", ctypes.c_void_p),
        # The Hopper loop's tile claims (cuda_src/gemm/tile_feed.cuh): two zeroed ints of this
        # launch's own, or null for the static order.
        ("tile_counter", ctypes.c_void_p),
        # Sm90Config.ROW_SPLIT: rows [0, c2_rows) of the result as fp32 to c2 (ldc2), the rest as
        # bf16 to c from its row 0.
        ("c2", ctypes.c_void_p), ("ldc2", ctypes.c_int64), ("c2_rows", ctypes.c_int32),
        # The Hopper loop's persistent order starts at this tile (ungrouped GEMMs; see
        # _heavy_tiles_rotation).
        ("tile_rotation", ctypes.c_int32),
        # Ungrouped Hopper loop, K-major A: the rows of the last row tile (m % BM, 0 when none),
        # which its segments with all m rows load by a box of exactly that many
        # (GemmSm90Params::tma_a_half).
        ("a_tail_rows", ctypes.c_int32),
        # Sm90Config.K_TAIL: 8 KB of zeros (a short k-step's missing lines come from there).
        ("zeros", ctypes.c_void_p),
    ]
    _c_types_ = ["const void*", "const void*", "i64", "i64", "i64", "int", "int", "int", "void*", "i64",
                 "i64", "int", "int", "const int*", "int", "const int*", "const int*", "int",
                 "const void*", "const void*", "const void*", "const float*", "const int*", "void*", "void*",
                 "void*", "float*", "int", "int", "i64", "const int*", "int*",
                 "void*", "i64", "int", "int", "int", "const void*"]


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


def _sm90_params_struct():
    # tma_a_half: a K-major A's map again with boxes of 64 rows, for tiles with at most 64 real rows
    # (ungrouped, for a segment with all m rows: boxes of the last row tile's rows, a_tail_rows);
    # with Sm90Config.K_TAIL, an MN-major A's map with boxes of its segment's last k-step's lines,
    # and tma_b_tail B's
    fields = [("tma_a", TmaDesc * MAX_SEGMENTS), ("tma_b", TmaDesc * MAX_SEGMENTS), ("tma_c", TmaDesc),
              ("tma_a_half", TmaDesc * MAX_SEGMENTS), ("tma_b_tail", TmaDesc * MAX_SEGMENTS), ("base", GemmParams)]
    types = ["TmaDesc", "TmaDesc", "TmaDesc", "TmaDesc", "TmaDesc", "GemmParams"]
    pad = -(ctypes.sizeof(TmaDesc) * (4 * MAX_SEGMENTS + 1) + ctypes.sizeof(GemmParams)) % 64
    if pad:  # C++ rounds the size up to TmaDesc's 64-byte alignment; the driver copies that many
        fields.append(("pad", ctypes.c_uint8 * pad))
        types.append("unsigned char")
    return type("GemmSm90Params", (ctypes.Structure,), {"_fields_": fields, "_c_types_": types})


GemmSm90Params = _sm90_params_struct()


@dataclass(frozen=True)
class Sm90Config:
    """The Hopper main loop's config (cuda_src/gemm/mainloop_wgmma.cuh); BM = 128, BK = 64."""
    BN: int = 128
    STAGES: int = 6
    A_KMAJOR: bool = True
    B_KMAJOR: bool = True
    GATHER_A: bool = False
    GATHER_B: bool = False
    GROUPING: int = 0
    EPILOGUE: int = 0
    C_TMA: bool = False  # bf16 results leave through shared memory and TMA stores
    PINGPONG: bool = False  # consumer warpgroups take whole tiles in turn (else share each tile)
    E_STAGED: bool = False  # SwiGLU backward on the producer's spare warps from staged fp32 da'
    SPLIT_K: bool = False  # fp32 pieces of the reduction (ungrouped GEMMs; the kernel reads
    # their count in GemmParams.num_groups)
    SPLIT_CLUSTER: bool = False  # the pieces of a tile are a cluster that sums them itself
    PACKED_CONTRACT: bool = True  # SOL-080's SwiGLU contract with bf16x2 products (same bits;
    # False: element by element, the A/B path through CONFIG_OVERRIDE)
    ROW_SPLIT: bool = False  # the result's first rows as fp32 elsewhere (gemm(f32_head))
    SEG_ROWS: bool = False  # segments with rows of their own (Segment.m), a rotated tile order
    DYNAMIC: bool = False  # tiles claimed as the CTAs go (DYNAMIC_TILES; GemmParams.tile_counter)
    BAND_M: int = 1  # ungrouped, unsplit tiles in bands of this many row tiles (scheduler.cuh; band_rows)
    STATIC_SHUFFLE: bool = False  # static tiles with neighbouring CTAs on unrelated tiles (tile_feed.cuh;
    # A/B through CONFIG_OVERRIDE only: bench/placement.py)
    C_TRANS: bool = False  # the result stored transposed (gemm(out_transposed)), by TMA
    M_FASTEST: bool = False  # tiles in row-fastest order (A/B through CONFIG_OVERRIDE only)
    STORE_RING: int = 0  # C_TMA: 64 x 64 staging units per consumer warpgroup, reused as
    # their stores read them (0: one per unit of its rows)
    DESC_STEP: bool = True  # wgmma descriptors stepped by an add per k16 step (the same bits;
    # False: built whole at each step, the A/B path through CONFIG_OVERRIDE)
    DESC_LO32: bool = True  # and the steps in their low 32-bit words, the high ones constant (the
    # same bits; False: 64-bit adds, the A/B path)
    SLIM_CONSUMER: bool = True  # releases by an elected lane, an idle warpgroup's k-loop apart (the
    # same bits; False: __syncwarp + lane 0, the idle test in the MMA loop; the A/B path)
    DEFER_STORE: int = 32  # registers a thread may hold a finished tile's last bf16 results in,
    # stored by TMA under the next tile's first k-steps (the same bits; 0: all at the tile's end)
    EARLY_SETUP: bool = True  # the CTA's barriers and tensor-map prefetches before its wait for
    # the grid before it, under that grid's tail (mainloop_wgmma.cuh set_up; the same bits; SOL-080
    # -0.5 us on the mean, bench/NOTES.md v0.33; False: after the wait, the A/B path)
    HELP_LAST: bool = False  # E_STAGED: the consumers share the CTA's last tile's epilogue rows
    # with the epilogue warps (sm90_epilogues.cuh swiglu_epilogue_warps; the same bits). choose()
    # sets it for ungrouped GEMMs (SOL-080's d_act, whose completion the dgrad waits for); the
    # layer's M-grouped dgrad, 47 tiles a CTA, keeps the leaner consumer (118 registers, not 127)
    PAIR_ROWS: bool = False  # sum_groups_and_halves with both halves in each CTA (a stage holds
    # A's rows of both; two accumulator blocks added at the tile's end) and the cluster over the
    # groups alone (PAIRED_HALVES)
    K_TAIL: bool = False  # ungrouped, MN-major A and B: a segment's short last k-step by boxes of its
    # lines, the rest of the stage by bulk copies of zeros (K_TAIL_BOXES)
    SKIP_K16: bool = True  # K-grouped, a group's short last k-step: its k16 steps made wholly of
    # lines it must not count are not issued, only the lines of the step they split are zeroed
    # (False: all such lines zeroed and multiplied, the A/B path through CONFIG_OVERRIDE)
    CLUSTER_ROWS: int = 4  # SPLIT_CLUSTER: rows a warp sums at once over DSMEM (the same bits)
    CLUSTER_RELAXED_EXIT: bool = True  # SPLIT_CLUSTER: the last cluster barrier without release
    # semantics, so it does not wait for the sums' global stores (the same bits; the router
    # wgrad's epilogue 3.5 -> 3.1 us at T = 997 / 2053)

    BM = 128
    BK = 64
    THREADS = 384
    # sm_90's opt-in shared memory per block, less the static shared memory of a traced build
    # (trace.cuh's TraceScope slot, which the 1024-aligned dynamic block rounds up to 1024 bytes:
    # without it a config that fills the limit, an M-grouped GEMM over DeepSeek-V3's 256
    # experts, fails to launch under bench/sm_timeline.py).
    SMEM_LIMIT = 227 * 1024 - (1024 if _build.tracing() else 0)

    @property
    def threads(self) -> int:
        return self.THREADS + (128 if self.E_STAGED else 0)  # the epilogue warpgroup

    @property
    def stage_bytes(self) -> int:
        return ((2 if self.PAIR_ROWS else 1) * self.BM + self.BN) * self.BK * 2

    def smem_bytes(self, num_groups: int) -> int:
        stage = self.stage_bytes
        if not self.C_TMA:
            staging = 0
        elif self.STORE_RING:
            staging = 2 * self.STORE_RING * 64 * 64 * 2  # two consumer warpgroups' rings of 64 x 64 units
        else:
            staging = (2 if self.PINGPONG else 1) * self.BM * self.BN * (4 if self.EPILOGUE == EPILOGUES["f32"] else 2)
        epilogue = self.BM * self.BN * 4 + 16 if self.E_STAGED else 0
        feed = 4 * (4 + 8 + 8) + 16  # TileFeed: 4 slots, their full and empty barriers, 1 int
        return 1024 + self.STAGES * (stage + 16) + staging + epilogue + 16 + feed + 4 * (num_groups + 1)

    @classmethod
    def choose(cls, m_tiles: int, n: int, sms: int, num_groups: int = 0, pingpong: bool = False,
               wide: bool = False, **flags) -> "Sm90Config":
        """Cooperative: 128 for the staged SwiGLU epilogue, else BN 256 where asked (wide) or
        where wide_tiles_pay and every SM still gets a tile, 64 for narrow outputs, else 128.
        Ping-pong: BN 64 for narrow outputs, else 128 (a warpgroup holds the whole 128 x BN
        accumulator). STAGES: as many as fit, at most 8 (ping-pong) or 4 / 6 / 8 by BN, one
        fewer with TMA stores unless they go through a store ring (STORE_RING at cooperative BN
        256, PINGPONG_STORE_RING at ping-pong BN 128)."""
        if pingpong:
            bn = 64 if n <= 64 else 128
            most, ring = 8, PINGPONG_STORE_RING if flags.get("C_TMA", False) and bn == 128 else 0
        else:
            if flags.get("E_STAGED") or flags.get("SPLIT_CLUSTER"):
                bn = 128
            elif wide or wide_tiles_pay(n, flags.get("GROUPING", 0)) and m_tiles * cdiv(n, 256) >= sms:
                bn = 256
            elif n <= 64:
                bn = 64
            else:
                bn = 128
            ring = STORE_RING if flags.get("C_TMA", False) and bn == 256 else 0
            most = {256: 4, 128: 6, 64: 8}[bn] - (flags.get("C_TMA", False) and bn > 64 and not ring)
        if flags.get("E_STAGED") and not flags.get("GROUPING", 0):
            flags = dict(flags, HELP_LAST=True)
        probe = cls(BN=bn, STAGES=0, PINGPONG=pingpong, STORE_RING=ring, **flags)
        fit = (cls.SMEM_LIMIT - probe.smem_bytes(num_groups)) // (probe.stage_bytes + 16)
        return cls(BN=bn, STAGES=min(most, fit), PINGPONG=pingpong, STORE_RING=ring, **flags)


def sm90_prelude(cfg: Sm90Config) -> str:
    # The host's view of the shared-memory layout (where the scheduler's table starts, past the
    # 1024-byte alignment slack) and of the block size it launches, checked against the kernel's
    # own at compile time.
    table = cfg.smem_bytes(0) - 1024 - 4
    return (f"#include \"common/hopper.cuh\"\nconstexpr int MAX_SEGMENTS = {MAX_SEGMENTS};\n"
            f"enum : int {{ HOST_TABLE_OFFSET = {table}, HOST_THREADS = {cfg.threads} }};\n"
            + _build.render_struct(GemmParams) + _build.render_struct(GemmSm90Params)
            + _build.render_cfg(cfg))


@lru_cache(maxsize=None)
def _sm90_module(cfg: Sm90Config):
    return _build.load_module("gemm_sm90.cu", sm90_prelude(cfg))


@lru_cache(maxsize=None)
def _device_info(device_id: int):
    import cupy

    dev = cupy.cuda.Device(device_id)
    return dev.compute_capability, dev.attributes["MultiProcessorCount"]


def device_traits() -> tuple:
    """(compute capability, SM count) of the current device: what the plans built on it read."""
    import cupy

    return _device_info(cupy.cuda.Device().id)


def device_sms() -> int:
    """Streaming multiprocessors of the current device."""
    return device_traits()[1]


@dataclass
class Segment:
    """One K segment: A (lda), B (ldb) and its reduction length k (K-grouped: the operands' memory
    lines, i.e. the last group offset). b_group_stride: elements between consecutive experts' B
    (M-grouped). m > 0: A has only its first m rows (the rest count as zeros; tiles past them
    skip the segment), e.g. a second reduction that reaches the first rows of the result only."""

    a: object
    lda: int
    b: object
    ldb: int
    k: int = 0
    b_group_stride: int = 0
    m: int = 0  # rows of A this segment has, the rest zeros (0: all; the Hopper loop only)


@dataclass
class SwigluBackward:
    """Operands of the SwiGLU-backward epilogue: C (the unweighted gradient da' of the activation,
    never stored) -> dg, du (bf16, like gate), and for routed experts (weights given) aw =
    bf16(w a) and dw[row] = <da', a>, where w of row r is weights[row_index[r]] (or weights[r]).
    Every [rows, n] array shares C's leading dimension, except dg and du with ld_grad (when not
    0). contract_rounding: SOL-080's rounding points (sol080.md steps 3-4: da' rounded to bf16
    first, t = bf16(da' u), du = da' bf16(silu(g))), without routing weights; the Hopper loop
    only (see sm90_applies)."""

    gate: object
    up: object
    dg: object
    du: object
    act: object = None
    weights: object = None
    row_index: object = None
    aw: object = None
    dw: object = None
    ld_grad: int = 0
    contract_rounding: bool = False


def _aligned(*values) -> bool:
    return all(int(v) % 8 == 0 for v in values)


def _addr(x) -> int:
    return x if isinstance(x, int) else x.data.ptr


def gemm(**kwargs) -> None:
    """Launch one GEMM on the current stream (the arguments and what they mean: prepare's)."""
    launch = prepare(**kwargs)
    if launch is not None:
        launch.run(kwargs.get("swiglu") if kwargs.get("epilogue") == "swiglu_backward" else None)


def launch_tiles(**kwargs) -> int:
    """The output tiles (a Hopper loop's persistent grid shares them out) of the gemm() call with
    these arguments; 0 off the Hopper loop or where nothing runs. Prepares the call (cached)."""
    launch = prepare(**kwargs)
    return launch.tiles if launch is not None and launch.kind == "sm90" else 0


def prepare(*, m: int, n: int, segments: Sequence[Segment], a_kmajor: bool, b_kmajor: bool,
            out, ldc: int, epilogue: str = "bf16", grouping: str = "none",
            group_offsets=None, num_groups: int = 0, c_group_stride: int = 0,
            gather_a=None, gather_b=None, gather_div: int = 1, engine: str = "auto",
            swiglu: SwigluBackward | None = None, k_splits: int = 1, cancel: int | None = None,
            even_rounds: bool = False, wide: bool = False, sum_groups_and_halves: bool = False,
            f32_head: tuple | None = None, dynamic: bool | None = None,
            pingpong: bool | None = None, out_transposed: bool = False,
            max_ctas: int = 0, band: int = 0) -> "_Launch | None":
    """The prepared launch of one GEMM (gemm() runs it), None where there is nothing to compute.

    grouping='m': rows are experts' segments group_offsets[g]:group_offsets[g+1] of m total rows,
    B of group g at b + g * b_group_stride. grouping='k': group g reduces over memory lines
    group_offsets[g]:group_offsets[g+1] of both (MN-major) operands into C + g * c_group_stride,
    writing zeros for an empty group; without group_offsets, the lines split into num_groups
    equal pieces (split-K into per-piece partials). gather_a / gather_b: int32 maps of the operand's memory lines
    (line -> map[line] // gather_div). engine: 'auto' (the Hopper main loop when it applies),
    'sm90' (it or ValueError), 'mma' (the portable main loop). epilogue='swiglu_backward' takes
    `swiglu` (out is ignored); where the Hopper loop does not apply, it runs as an fp32 GEMM and
    the elementwise kernel. k_splits = S > 1 (ungrouped, epilogue 'f32'): split-K, the reduction (all segments' k in
    order) cut into S pieces whose fp32 products go to out + s * c_group_stride; the caller sums
    them (in a fixed order: deterministic). For GEMMs with few output tiles and a long reduction
    (k_splits_for). Where the Hopper loop does not apply, piece 0 holds the whole product and the
    others zeros. k_splits = S > 1 with epilogue 'bf16' or 'swiglu_backward' (no routed-expert
    outputs): the pieces are summed inside the kernel, out is the result as without the split
    (the Hopper loop: each tile's S pieces form a thread-block cluster, S <= 8, that sums them
    over distributed shared memory in piece order; elsewhere the GEMM runs unsplit; with
    SPLIT_CLUSTER off, S must be 1 here). cancel: the device address of an int that, nonzero when the kernel starts,
    makes it do nothing (the top-k check's verdict, read by launches enqueued before the host has
    it). even_rounds: the Hopper loop's persistent grid takes the fewest CTAs that keep its number
    of rounds (tiles per CTA, even_round_ctas) instead of one per SM: as fast alone, and the SMs
    it leaves free serve a kernel on another stream from the start, not only in the last round.
    wide: 128 x 256 tiles where the Hopper loop's cooperative consumers would otherwise take 128
    (the staged SwiGLU epilogue keeps 128).
    sum_groups_and_halves (grouping='k' in num_groups equal pieces, epilogue 'f32', m a multiple
    of 256): out [m / 2, n] = the sum over the pieces of rows r and r + m / 2 (the router's
    stacked [hi; lo] rows), inside the kernel: with PAIRED_HALVES each CTA multiplies rows r and
    r + m / 2 of its piece and adds them, and a cluster of the num_groups pieces of each output
    tile adds those in piece order; else a cluster of 2 x num_groups CTAs adds them in (piece,
    half) order (num_groups may drop until every cluster is resident); where the Hopper loop does
    not apply, one ungrouped GEMM over the two halves.
    f32_head = (out2, ld2, rows) (epilogue 'bf16', ungrouped, unsplit; the Hopper loop only, as
    Segment.m): rows [0, rows) of the result go to out2 as fp32 (leading dimension ld2), the rest
    to out as bf16 from its row 0 (two results of one reduction over the same B: SOL-080's router
    weight gradient above [grad_Wg; grad_Wu]).
    dynamic, pingpong (None: DYNAMIC_TILES, PINGPONG decide): this launch's tile claims and
    ping-pong consumers, for plans that choose them per GEMM (the same bits either way).
    out_transposed (epilogue 'bf16', ungrouped or K-grouped; the Hopper loop with 16-byte aligned
    rows only, else ValueError): out holds the result transposed, element (r, c) at
    out[c * ldc + r] (+ g * c_group_stride). A product whose rows tile better than its columns
    (grad_Wd = (act^T g)^T: 1408 rows in 11 tiles of 128, 4096 columns in 16 of 256) keeps wide
    tiles without padding.
    max_ctas > 0: the Hopper loop's persistent grid takes at most this many CTAs (SMs left to a
    kernel beside it from the start).
    band > 0: this launch's bands of row tiles (Sm90Config.BAND_M, where its order takes bands:
    band_rows) instead of BAND_ROWS, BAND_NARROW_ROWS or BAND_GROUPED_ROWS; the same bits.

    A launch's parameter block depends only on addresses and sizes, so it is built once per
    distinct call and replayed from a cache afterwards (repeated calls on the same buffers, as a
    training loop makes them, skip the host work of building it).
    """
    assert 1 <= len(segments) <= MAX_SEGMENTS and engine in ENGINES
    assert k_splits == 1 or grouping == "none" and (
        epilogue == "f32" and c_group_stride >= m * ldc or epilogue in ("bf16", "swiglu_backward"))
    if m == 0 or n == 0:
        return None  # nothing to write (an M-grouped grid would otherwise still launch its group slack)
    import cupy

    opt = lambda a: 0 if a is None else _addr(a)
    sw = swiglu if epilogue == "swiglu_backward" else None
    key = (cupy.cuda.Device().id, PINGPONG, STAGED_EPILOGUE, DYNAMIC_TILES, STORE_RING, PINGPONG_STORE_RING,
           F32_TMA, PAIRED_HALVES,
           BAND_ROWS, BAND_NARROW_ROWS, BAND_GROUPED_ROWS, WIDE_B_BAND, WIDE_B_BYTES, TAIL_BOXES, K_TAIL_BOXES,
           tuple(sorted(CONFIG_OVERRIDE.items())),
           m, n, a_kmajor, b_kmajor, opt(out), ldc, epilogue, grouping, opt(group_offsets),
           num_groups, c_group_stride, opt(gather_a), opt(gather_b), gather_div, engine, k_splits,
           cancel, even_rounds, wide, sum_groups_and_halves,
           None if f32_head is None else (_addr(f32_head[0]),) + tuple(f32_head[1:]), dynamic, pingpong,
           out_transposed, max_ctas, band,
           tuple((_addr(s.a), s.lda, _addr(s.b), s.ldb, s.k, s.b_group_stride, s.m) for s in segments),
           None if sw is None else tuple(opt(a) for a in (sw.gate, sw.up, sw.dg, sw.du, sw.act,
                                                         sw.weights, sw.row_index, sw.aw, sw.dw))
           + (sw.ld_grad, sw.contract_rounding))
    if k_splits > 1 and epilogue != "f32":
        assert SPLIT_CLUSTER and k_splits <= 8 and (sw is None or sw.act is None and sw.aw is None), \
            "in-kernel split-K sums: at most 8 pieces, no routed-expert SwiGLU outputs"
    if f32_head is not None or any(s.m for s in segments):
        assert k_splits == 1 and not sum_groups_and_halves and gather_a is None and gather_b is None and (
            f32_head is None or (epilogue == "bf16" and grouping == "none" and 0 < f32_head[2] < m
                                 and _addr(f32_head[0]) % 8 == 0 and f32_head[1] % 2 == 0))
        if engine == "mma":
            raise ValueError("Segment.m and f32_head need the sm90 GEMM")
        engine = "sm90"
    if sum_groups_and_halves:
        assert (SPLIT_CLUSTER and grouping == "k" and group_offsets is None and epilogue == "f32"
                and m % 256 == 0 and 1 <= num_groups <= 4 and len(segments) == 1 and not a_kmajor)
        if engine == "mma" or not sm90_applies(m, n, segments, a_kmajor, b_kmajor, out, ldc):
            s = segments[0]
            halves = [Segment(s.a, s.lda, s.b, s.ldb, k=s.k),
                      Segment(_addr(s.a) + m, s.lda, s.b, s.ldb, k=s.k)]  # m / 2 bf16 along m
            return prepare(m=m // 2, n=n, segments=halves, a_kmajor=a_kmajor, b_kmajor=b_kmajor,
                           out=out, ldc=ldc, epilogue="f32", engine=engine, cancel=cancel)
    launch = _prepared.get(key)
    if launch is None:
        launch = _prepare(m, n, segments, a_kmajor, b_kmajor, out, ldc, epilogue, grouping,
                          group_offsets, num_groups, c_group_stride, gather_a, gather_b,
                          gather_div, engine, sw, cancel, k_splits, even_rounds, wide,
                          sum_groups_and_halves, f32_head, dynamic, pingpong, out_transposed, max_ctas,
                          band)
        if len(_prepared) >= 1024:
            _prepared.clear()
        _prepared[key] = launch
    return launch


_prepared = {}  # the gemm() call's addresses and sizes -> _Launch


@dataclass
class _Launch:
    """A prepared launch: the parameter block as bytes, replayed by run()."""

    kind: str          # 'sm90', 'mma' or 'unfused' (SwiGLU backward as GEMM + elementwise)
    module: object
    name: str
    grid: tuple
    threads: int
    smem: int
    params: bytes
    param_type: type
    cluster: int = 1   # CTAs per thread-block cluster (the split-K pieces of a tile)
    m: int = 0
    n: int = 0
    tiles_n: int = 0   # sm90 SwiGLU epilogue: row partials per row
    tiles: int = 0     # sm90: the output tiles the persistent grid shares out
    zero_bytes: tuple = ()  # (address, bytes) zeroed after the launch (split-K off the Hopper loop)

    def run(self, sw) -> None:
        import cupy

        P = self.param_type.from_buffer_copy(self.params)
        base = P.base if self.kind == "sm90" else P
        partial = da = None
        if self.kind == "sm90" and sw is not None and sw.dw is not None:
            partial = cupy.empty((self.m, self.tiles_n), cupy.float32)
            base.e_row_partial, base.e_partial_ld = partial.data.ptr, self.tiles_n
        if self.kind == "unfused":
            da = cupy.empty((self.m, self.n), cupy.float32)
            base.c, base.ldc = da.data.ptr, self.n
        _launch.launch(self.module, self.name, self.grid, (self.threads,), [P], self.smem,
                       cluster=self.cluster)
        if self.zero_bytes:
            address, size = self.zero_bytes
            cupy.cuda.runtime.memsetAsync(address, 0, size, cupy.cuda.get_current_stream().ptr)
        if partial is not None:
            from .elementwise import row_partial_sums

            row_partial_sums(partial, sw.dw)
        if da is not None:
            from .elementwise import swiglu_backward

            swiglu_backward(da, sw.gate, sw.up, sw.act, sw.weights, sw.row_index,
                            out=(sw.dg, sw.du, sw.dw, sw.aw))


def _prepare(m, n, segments, a_kmajor, b_kmajor, out, ldc, epilogue, grouping, group_offsets,
             num_groups, c_group_stride, gather_a, gather_b, gather_div, engine, sw,
             cancel=None, k_splits=1, even_rounds=False, wide=False, halves=False,
             f32_head=None, dynamic=None, pingpong=None, out_transposed=False, max_ctas=0,
             band=0) -> _Launch:
    p = GemmParams()
    p.cancel = cancel or 0
    for i, s in enumerate(segments):
        p.a[i], p.b[i] = _addr(s.a), _addr(s.b)
        p.lda[i], p.ldb[i], p.b_group_stride[i], p.seg_k[i] = s.lda, s.ldb, s.b_group_stride, s.k
        p.seg_m[i] = s.m
    p.num_segments = len(segments)
    p.c, p.ldc, p.c_group_stride = (0 if out is None else _addr(out)), ldc, c_group_stride
    p.m, p.n = m, n
    p.group_offsets = 0 if group_offsets is None else _addr(group_offsets)
    p.num_groups = k_splits if k_splits > 1 else num_groups  # the kernel reads the pieces here
    p.gather_a = 0 if gather_a is None else _addr(gather_a)
    p.gather_b = 0 if gather_b is None else _addr(gather_b)
    p.gather_div = gather_div
    if f32_head is not None:
        p.c2, p.ldc2, p.c2_rows = _addr(f32_head[0]), f32_head[1], f32_head[2]
    if sw is not None:
        p.e_gate, p.e_up, p.e_dg, p.e_du = (_addr(a) for a in (sw.gate, sw.up, sw.dg, sw.du))
        p.e_act, p.e_row_weight, p.e_row_index, p.e_aw = (
            0 if a is None else _addr(a) for a in (sw.act, sw.weights, sw.row_index, sw.aw))
        p.e_ld_grad, p.e_contract = sw.ld_grad, int(sw.contract_rounding)
    flags = dict(A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, GATHER_A=gather_a is not None,
                 GATHER_B=gather_b is not None, GROUPING=GROUPINGS[grouping],
                 EPILOGUE=EPILOGUES[epilogue])
    why = "the mma engine" if engine == "mma" else _sm90_unsupported(
        m, n, segments, a_kmajor, b_kmajor, out, ldc, c_group_stride, flags["GATHER_A"], flags["GATHER_B"])
    if out_transposed:
        why = why or _transposed_store_unsupported(epilogue, grouping, k_splits, f32_head, ldc, c_group_stride)
        if why is not None:
            raise ValueError(f"out_transposed does not apply: {why}")
        flags["C_TRANS"] = True
    if engine != "mma":
        if why is None:
            return _prepare_sm90(p, segments, m, n, grouping, num_groups,
                                 dict(flags, ROW_SPLIT=f32_head is not None), k_splits, even_rounds,
                                 wide, halves, dynamic, pingpong, max_ctas, band)
        if engine == "sm90":
            raise ValueError(f"the sm90 GEMM does not apply: {why}")
    if sw is not None and (sw.contract_rounding or sw.ld_grad):
        raise ValueError("the SwiGLU epilogue's contract rounding and ld_grad need the sm90 GEMM")
    if k_splits > 1 and epilogue != "f32":  # summed in the kernel: here simply not split
        k_splits, p.num_groups = 1, num_groups
    if k_splits > 1:  # split-K: the whole product into piece 0
        p.num_groups = 0
        launch = _prepare_mma(p, segments, m, n, grouping, 0, flags)
        launch.zero_bytes = (_addr(out) + 4 * c_group_stride, 4 * c_group_stride * (k_splits - 1))
        return launch
    if sw is not None:  # the portable loop has no fused epilogue: fp32 da', then the kernel
        launch = _prepare_mma(p, segments, m, n, grouping, num_groups,
                              dict(flags, EPILOGUE=EPILOGUES["f32"]))
        launch.kind, launch.m, launch.n = "unfused", m, n
        return launch
    return _prepare_mma(p, segments, m, n, grouping, num_groups, flags)


def sm90_applies(m, n, segments, a_kmajor, b_kmajor, out=None, ldc=None) -> bool:
    """Whether gemm() takes the Hopper main loop for these operands (no gathers)."""
    return _sm90_unsupported(m, n, segments, a_kmajor, b_kmajor, out, n if ldc is None else ldc,
                             0, False, False) is None


def transposed_applies(m, n, segments, a_kmajor, b_kmajor, out, ldc, c_group_stride=0,
                       grouping="none") -> bool:
    """Whether gemm(out_transposed=True) takes these operands (bf16 result, no gathers, unsplit)."""
    return (_sm90_unsupported(m, n, segments, a_kmajor, b_kmajor, out, ldc, c_group_stride, False, False)
            or _transposed_store_unsupported("bf16", grouping, 1, None, ldc, c_group_stride)) is None


def _transposed_store_unsupported(epilogue, grouping, k_splits, f32_head, ldc, c_group_stride):
    """None when a result the Hopper loop computes can leave transposed (by TMA stores of whole
    tiles), else the reason."""
    if epilogue == "bf16" and grouping in ("none", "k") and k_splits == 1 and f32_head is None and (
            ldc % 8 == 0 and c_group_stride % 8 == 0):
        return None
    return "a transposed result needs bf16 TMA stores (ungrouped or K-grouped, rows of 8)"


def _sm90_unsupported(m, n, segments, a_kmajor, b_kmajor, out, ldc, c_group_stride, copy_a, copy_b):
    """None when the Hopper main loop applies, else the reason. TMA needs 16-byte aligned
    addresses and strides; gathered operands (cp.async) move whole 16-byte chunks, so their line
    lengths must be multiples of 8; the epilogue stores element pairs."""
    cc, _ = device_traits()
    if cc != "90":
        return f"compute capability {cc}, not 90"
    for s in segments:
        if _addr(s.a) % 16 or _addr(s.b) % 16:
            return "an operand address is not 16-byte aligned"
        if s.lda % 8 or s.ldb % 8 or s.b_group_stride % 8:
            return "an operand stride is not a multiple of 8 elements"
        if copy_a and (s.k if a_kmajor else m) % 8 or copy_b and (s.k if b_kmajor else n) % 8:
            return "a copied operand's line length is not a multiple of 8 elements"
    if n % 2 or ldc % 2 or c_group_stride % 2 or out is not None and _addr(out) % 16:
        return "the output is not stored in element pairs"
    return None


def band_rows(cfg: Sm90Config, band: int = 0) -> int:
    """Sm90Config.BAND_M for a config (band > 0, a launch's own, or BAND_ROWS, BAND_NARROW_ROWS,
    BAND_GROUPED_ROWS): unsplit tiles in the columns-fastest order only, and not where a static
    order is rotated to spread a segment's heavy first rows (SEG_ROWS without claims:
    _heavy_tiles_rotation counts those rows' tiles first)."""
    if cfg.SPLIT_K or cfg.SPLIT_CLUSTER or cfg.M_FASTEST or cfg.SEG_ROWS and not cfg.DYNAMIC:
        return 1
    return band or (BAND_GROUPED_ROWS if cfg.GROUPING else BAND_ROWS if cfg.BN == 256 else BAND_NARROW_ROWS)


def m_grouped_band(segments, n: int) -> int:
    """The bands of an M-grouped GEMM's row tiles (0: band_rows' default): WIDE_B_BAND where one
    expert's B is over WIDE_B_BYTES."""
    return WIDE_B_BAND if 2 * n * sum(s.k for s in segments) > WIDE_B_BYTES else 0


def even_round_ctas(tiles: int, sms: int) -> int:
    """The fewest CTAs that keep a persistent grid of `tiles` at its number of rounds on `sms`
    SMs (187 tiles on 132 SMs: 2 rounds, 94 CTAs instead of 132)."""
    return cdiv(tiles, cdiv(tiles, sms)) if tiles > 0 else 0


def _prepare_sm90(p, segments, m, n, grouping, num_groups, flags, k_splits=1,
                  even_rounds=False, wide=False, halves=False, dynamic=None, pingpong=None,
                  max_ctas=0, band=0) -> _Launch:
    sms = device_sms()
    m_tiles = cdiv(m, Sm90Config.BM) + (num_groups if grouping == "m" else 0)
    c_rows = m - p.c2_rows  # the bf16 result's rows (all of them without a row split)
    if pingpong is None and PINGPONG == "auto":
        pingpong = grouping == "k" and not wide_tiles_pay(n, GROUPINGS[grouping])
    elif pingpong is None:
        pingpong = bool(PINGPONG)
    # TMA stores need 16-byte rows and group strides; fp32 ones whole cooperative tiles, unsplit.
    f32_out = flags["EPILOGUE"] == EPILOGUES["f32"]
    c_tma = (flags["EPILOGUE"] == EPILOGUES["bf16"] and p.ldc % 8 == 0 and p.c_group_stride % 8 == 0
             or F32_TMA and f32_out and not pingpong and k_splits == 1 and p.ldc % 4 == 0
             and p.c_group_stride % 4 == 0)
    # Split-K pieces summed in the kernel (bf16 / SwiGLU results), or K-groups and row halves
    # (sum_groups_and_halves): a cluster per output tile.
    cluster = k_splits > 1 and flags["EPILOGUE"] != EPILOGUES["f32"] or halves
    if cluster:
        pingpong = c_tma = False
    staged = not pingpong and not cluster and _epilogue_staged(p, n, flags)
    # Claims need a counter pair of the launch's own (none is made inside a stream capture: that
    # launch keeps the static order). A cluster's CTAs take one tile each, their rank's: no claims.
    if dynamic is None:
        dynamic = DYNAMIC_TILES == "all" or DYNAMIC_TILES == "grouped" and grouping != "none"
    claims = dynamic and not cluster
    counter = _tile_counter() if claims else 0
    paired = halves and PAIRED_HALVES  # both halves in each CTA (Sm90Config.PAIR_ROWS)
    k_tail = (K_TAIL_BOXES and grouping == "none" and not flags["A_KMAJOR"] and not flags["B_KMAJOR"]
              and not flags["GATHER_A"] and not flags["GATHER_B"] and k_splits == 1 and not paired
              and any(s.k % Sm90Config.BK for s in segments))
    zeros = _zeros() if k_tail else 0
    k_tail = k_tail and zeros != 0
    flags = dict(flags, DYNAMIC=counter != 0, SEG_ROWS=any(s.m for s in segments), PAIR_ROWS=paired,
                 K_TAIL=k_tail)
    cfg = Sm90Config.choose(m_tiles * k_splits, n, sms, num_groups if grouping == "m" else 0,
                            pingpong, wide=wide and not staged and not cluster, C_TMA=c_tma,
                            E_STAGED=staged, SPLIT_K=k_splits > 1, SPLIT_CLUSTER=cluster, **flags)
    if grouping == "m" and not band:
        band = m_grouped_band(segments, n)
    cfg = dataclasses.replace(cfg, BAND_M=band_rows(cfg, band))
    if CONFIG_OVERRIDE:
        cfg = dataclasses.replace(cfg, **CONFIG_OVERRIDE)
    P = GemmSm90Params()
    P.base = p
    P.base.tile_counter = counter
    if c_tma:
        c_groups = num_groups if grouping == "k" else 1
        # The map is the stored array's: C's, or with C_TRANS C^T's (n rows of m).
        cols, rows = (m, n) if cfg.C_TRANS else (n, c_rows)
        encode(P.tma_c, p.c, (cols, rows, c_groups), (p.ldc, p.c_group_stride if c_groups > 1 else p.ldc * rows),
               (32 if f32_out else 64, 64, 1), "f32" if f32_out else "bf16")  # a box: 64 rows of 128 bytes
    copy_a, copy_b = cfg.GATHER_A, cfg.GATHER_B
    groups = num_groups if grouping == "m" else 1
    # TAIL_BOXES: the last row tile of an ungrouped GEMM loads exactly its rows (Plan::HALF_A's
    # map, mainloop_wgmma.cuh); the rest of the stage keeps older rows, which reach only result
    # rows past m (never stored).
    tail = m % cfg.BM if (TAIL_BOXES and grouping == "none" and cfg.A_KMAJOR and not copy_a
                          and not cfg.PINGPONG) else 0
    P.base.a_tail_rows = tail
    P.base.zeros = zeros if cfg.K_TAIL else 0
    for i, s in enumerate(segments):
        if s.k == 0:
            continue  # no reduction tiles: the map is never read
        if not copy_a:  # A is never grouped: 2-D (a unit third dimension)
            rows = s.m or m  # rows past a segment's own read as zeros
            dims = (s.k, rows) if cfg.A_KMAJOR else (rows, s.k)
            box = (64, cfg.BM) if cfg.A_KMAJOR else (64, 64)
            encode(P.tma_a[i], _addr(s.a), dims + (1,), (s.lda, s.lda * dims[1]), box + (1,))
            if cfg.A_KMAJOR:  # (read by cooperative tiles of at most 64 real rows: Plan::HALF_A)
                half = tail if tail and not s.m else 64  # (a segment of fewer rows needs the zeros)
                encode(P.tma_a_half[i], _addr(s.a), dims + (1,), (s.lda, s.lda * dims[1]), (64, half, 1))
            elif cfg.K_TAIL and s.k % cfg.BK:  # (the segment's last k-step: its lines alone)
                encode(P.tma_a_half[i], _addr(s.a), dims + (1,), (s.lda, s.lda * dims[1]), (64, s.k % cfg.BK, 1))
        if not copy_b:
            dims = (s.k, n) if cfg.B_KMAJOR else (n, s.k)
            box = (64, cfg.BN) if cfg.B_KMAJOR else (64, 64)
            gstride = s.b_group_stride if groups > 1 else s.ldb * dims[1]
            encode(P.tma_b[i], _addr(s.b), dims + (groups,), (s.ldb, gstride), box + (1,))
            if cfg.K_TAIL and s.k % cfg.BK:
                encode(P.tma_b_tail[i], _addr(s.b), dims + (groups,), (s.ldb, gstride), (64, s.k % cfg.BK, 1))
    tiles_n = cdiv(n, cfg.BN)
    if grouping == "k":
        tiles = num_groups * cdiv(m // 2 if paired else m, cfg.BM) * tiles_n
    else:
        tiles = m_tiles * tiles_n * k_splits
    ctas = even_round_ctas(tiles, sms) if even_rounds else min(tiles, sms)
    if max_ctas:
        ctas = min(ctas, max_ctas)
    if cfg.SEG_ROWS and grouping == "none" and not cfg.DYNAMIC:
        heavy = cdiv(max(s.m for s in segments), cfg.BM) * tiles_n
        P.base.tile_rotation = _heavy_tiles_rotation(tiles, ctas, heavy)
    module, smem = _sm90_module(cfg), cfg.smem_bytes(num_groups if grouping == "m" else 0)
    size = 1  # CTAs per cluster
    if cluster:
        # One tile per CTA (a piece waits for its cluster, never for a later tile of its own), so
        # every cluster should be resident at once: a cluster's CTAs share a GPC, and fewer
        # pieces per tile fit more clusters (the sum is the same in any number of pieces, in
        # order, up to rounding; the choice depends on the shape alone: deterministic).
        pieces, per_piece = (num_groups, 1 if paired else 2) if halves else (k_splits, 1)
        outputs = tiles // (pieces * per_piece)  # output tiles = clusters
        while pieces > (1 if halves else 2) and outputs > (_launch.max_active_clusters(
                module, "gemm_sm90_kernel", cfg.threads, smem, pieces * per_piece) or outputs):
            pieces -= 1
        P.base.num_groups = pieces
        size = pieces * per_piece
        ctas = tiles = outputs * size
    return _Launch("sm90", module, "gemm_sm90_kernel", (ctas,), cfg.threads, smem, bytes(P),
                   GemmSm90Params, cluster=size, m=m, n=n, tiles_n=tiles_n, tiles=tiles)


def _zeroed_once(cache: dict, size: int, dtype):
    """The current device's zeroed array in `cache` (device id -> array), allocated at its first
    use; None inside a stream capture before that (its zeroing would not be ordered before the
    captured launches)."""
    import cupy

    dev = cupy.cuda.Device().id
    array = cache.get(dev)
    if array is None:
        stream = cupy.cuda.get_current_stream()
        if stream.is_capturing():
            return None
        array = cache[dev] = cupy.zeros(size, dtype)
        stream.synchronize()  # zeroed before a launch on any stream reads it
    return array


_zero_blocks = {}  # device id -> 8 KB of zeros, never written after their allocation


def _zeros() -> int:
    """The address of 8 KB of zeros on the current device (Sm90Config.K_TAIL's missing lines), or
    0 inside a stream capture before any was allocated (that launch then loads past K)."""
    import cupy

    block = _zeroed_once(_zero_blocks, 8192, cupy.uint8)
    return 0 if block is None else block.data.ptr


_COUNTER_PAIRS = 1 << 16
_counters = {}  # device id -> zeroed int32 array of _COUNTER_PAIRS pairs
_next_pair = {}  # device id -> the next pair to give


def _tile_counter() -> int:
    """The address of a pair of zeroed ints of a prepared launch's own (the kernel leaves them
    zeroed when it ends), or 0 (static order) for a launch prepared inside a stream capture before
    any was allocated. Pairs are handed out in turn and come round again only after 65536
    prepared launches (gemm()'s cache keeps 1024)."""
    import cupy

    counters = _zeroed_once(_counters, 2 * _COUNTER_PAIRS, cupy.int32)
    if counters is None:
        return 0
    dev = cupy.cuda.Device().id
    pair = _next_pair.get(dev, 0)
    _next_pair[dev] = (pair + 1) % _COUNTER_PAIRS
    return counters.data.ptr + 8 * pair


def _heavy_tiles_rotation(tiles: int, ctas: int, heavy: int) -> int:
    """Where a persistent grid of `ctas` starts its order of `tiles` so that the first `heavy`
    tiles (longer reductions: a segment that reaches only the first rows) fall to CTAs that take
    one tile fewer: the grid's first round at positions r .. r + heavy - 1, r = tiles % ctas
    (CTAs r and up take tiles // ctas tiles, the rest one more). 0 when nothing is heavy, when
    the rounds are whole, or when there are more heavy tiles than such CTAs. SOL-080's fused
    weight gradient at T = 8192: 368 tiles on 132 CTAs, 16 heavy; unrotated the 16 CTAs with
    three tiles also take the heavy ones, a fourth round's worth (+35 us)."""
    r = tiles % ctas if ctas else 0
    if heavy == 0 or r == 0 or heavy > ctas - r:
        return 0
    return (tiles - r) % tiles


def k_splits_for(m: int, n: int, k: int, most: int = 8, sms: int | None = None) -> int:
    """Split-K pieces for an ungrouped GEMM: none when its 128 x 128 output tiles occupy at least
    half the SMs; else as many as the SMs hold, at most `most`, each piece at least 8 k-tiles of 64
    (a small-T SOL-080 d_act has 22 tiles of 64 k-tiles: one SM each streams 2 MB of operands
    while 110 SMs idle)."""
    tiles, sms = cdiv(m, 128) * cdiv(n, 128), sms or device_sms()
    if tiles == 0 or 2 * tiles > sms:
        return 1
    return max(1, min(most, sms // tiles, cdiv(k, 64) // 8))


def _epilogue_staged(p, n, flags) -> bool:
    """Whether the Hopper loop stages the SwiGLU backward's accumulators for its epilogue warps:
    they move 4 elements at a time (8-byte aligned arrays, rows on 4-element boundaries) over
    128-wide tiles (n > 64), and the producer's threads are free (no gathered operand)."""
    if (flags["EPILOGUE"] != EPILOGUES["swiglu_backward"] or not STAGED_EPILOGUE or n <= 64
            or flags["GATHER_A"] or flags["GATHER_B"]):
        return False
    arrays = [p.e_gate, p.e_up, p.e_dg, p.e_du] + ([p.e_act, p.e_aw] if p.e_aw else [])
    return not (any(a % 8 for a in arrays) or n % 4 or p.ldc % 4 or (p.e_ld_grad or p.ldc) % 4)


def _prepare_mma(p, segments, m, n, grouping, num_groups, flags) -> _Launch:
    # 16-byte loads need every line start and every valid extent on an 8-element boundary.
    a_kmajor, b_kmajor = flags["A_KMAJOR"], flags["B_KMAJOR"]
    vec_a = all(_aligned(_addr(s.a) // 2, s.lda, s.k if a_kmajor else m) for s in segments)
    vec_b = all(_aligned(_addr(s.b) // 2, s.ldb, s.b_group_stride, s.k if b_kmajor else n)
                for s in segments)
    cfg = GemmConfig(VEC_A=vec_a, VEC_B=vec_b, **flags)
    tiles_n, tiles_m = cdiv(n, cfg.BN), cdiv(m, cfg.BM)
    if grouping == "m":
        grid = (tiles_n, tiles_m + num_groups, 1)
    elif grouping == "k":
        grid = (tiles_n, tiles_m, num_groups)
    else:
        grid = (tiles_n, tiles_m, 1)
    return _Launch("mma", _module(cfg), "gemm_kernel", grid, cfg.threads, cfg.smem_bytes, bytes(p),
                   GemmParams, m=m, n=n)


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


def example_sm90_configs():
    """Hopper configs the CPU compile test builds: every tile width, operand major, copy path,
    grouping and epilogue the layer uses."""
    out = []
    for bn, stages in ((64, 8), (128, 6), (256, 4)):
        for a_k, b_k, gather_a, gather_b, grouping, epi in (
                (True, True, False, False, 0, 0), (True, False, False, False, 0, 1),
                (False, False, False, False, 0, 2), (False, True, False, False, 0, 0),
                (True, True, True, False, 1, 0), (True, False, True, False, 1, 1),
                (True, False, False, False, 1, 0), (True, False, False, False, 1, 3),
                (False, False, True, False, 2, 0), (False, False, False, True, 2, 0)):
            c_tma = epi == 0 and bn != 128  # both store paths at every grouping
            dyn = grouping != 0  # DYNAMIC_TILES="grouped": the tile feed's ring
            out.append(Sm90Config(BN=bn, STAGES=stages - (c_tma and bn > 64), A_KMAJOR=a_k,
                                  B_KMAJOR=b_k, GATHER_A=gather_a, GATHER_B=gather_b,
                                  GROUPING=grouping, EPILOGUE=epi, C_TMA=c_tma, DYNAMIC=dyn))
            if epi == 3 and bn == 128:  # the staged SwiGLU epilogue
                out.append(Sm90Config.choose(1, bn, 132, 128 if grouping == 1 else 0, False,
                                             A_KMAJOR=a_k, B_KMAJOR=b_k, GROUPING=grouping,
                                             EPILOGUE=epi, E_STAGED=True, DYNAMIC=dyn))
            if bn <= 128:
                for c_tma in {epi == 0, False}:
                    out.append(Sm90Config.choose(
                        1, bn, 132, 128 if grouping == 1 else 0, True, A_KMAJOR=a_k,
                        B_KMAJOR=b_k, GATHER_A=gather_a, GATHER_B=gather_b, GROUPING=grouping,
                        EPILOGUE=epi, C_TMA=c_tma, DYNAMIC=dyn))
    # Split-K pieces (SOL-080's d_act and dgrad at small T); last, so the configs above keep
    # their order for tools/cubin_code_hash.py --first.
    out.append(Sm90Config.choose(1, 1408, 132, 0, False, A_KMAJOR=True, B_KMAJOR=False,
                                 EPILOGUE=1, SPLIT_K=True))
    # The same summed inside a cluster per tile, into the SwiGLU backward and into bf16.
    for epi, n in ((3, 1408), (0, 4096)):
        out.append(Sm90Config.choose(1, n, 132, 0, False, A_KMAJOR=True, B_KMAJOR=False,
                                     EPILOGUE=epi, SPLIT_K=True, SPLIT_CLUSTER=True))
    # The router weight gradient's K-groups and [hi; lo] halves summed inside a cluster.
    out.append(Sm90Config.choose(2, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False,
                                 GROUPING=2, EPILOGUE=1, SPLIT_CLUSTER=True))
    # SOL-080's router weight gradient as the fp32 first rows of grad_[Wg; Wu] (f32_head).
    out.append(Sm90Config.choose(24, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                 ROW_SPLIT=True, SEG_ROWS=True))
    # A dense GEMM with claims (DYNAMIC_TILES="all") and the staged SwiGLU epilogue with them.
    out.append(Sm90Config.choose(64, 4096, 132, 0, False, C_TMA=True, DYNAMIC=True))
    out.append(Sm90Config.choose(64, 1408, 132, 0, False, A_KMAJOR=True, B_KMAJOR=False, EPILOGUE=3,
                                 E_STAGED=True, DYNAMIC=True))
    # Transposed results (gemm(out_transposed)): SOL-080's grad_Wd as (act^T g)^T in 128 x 256
    # tiles, the layer's K-grouped dWd the same way, and a ping-pong one.
    out.append(Sm90Config.choose(11, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                 C_TRANS=True))
    out.append(Sm90Config.choose(11, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                 C_TRANS=True, GROUPING=2, DYNAMIC=True))
    out.append(Sm90Config.choose(11, 4096, 132, 0, True, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                 C_TRANS=True))
    # The row-fastest tile order (A/B: bench/d_act_layouts.py's Wd^T g^T).
    out.append(Sm90Config.choose(11, 8192, 132, 0, False, wide=True, A_KMAJOR=False, B_KMAJOR=True,
                                 C_TMA=True, M_FASTEST=True))
    # fp32 results by TMA stores (F32_TMA): the layer's dx_rest (128 x 256 through the ring), a
    # 128-wide tile staged whole, M-grouped and K-grouped.
    for m_tiles, n, groups, flags in ((64, 4096, 0, dict(A_KMAJOR=True, B_KMAJOR=False)),
                                      (64, 1408, 0, dict(A_KMAJOR=True, B_KMAJOR=False)),
                                      (600, 4096, 128, dict(A_KMAJOR=True, B_KMAJOR=False, GROUPING=1, DYNAMIC=True)),
                                      (11, 4096, 0, dict(A_KMAJOR=False, B_KMAJOR=False, GROUPING=2, DYNAMIC=True))):
        out.append(Sm90Config.choose(m_tiles, n, 132, groups, False, EPILOGUE=1, C_TMA=True, **flags))
    # The layer's bf16 grouped GEMMs as choose() makes them (128 x 256 through the store ring,
    # results held by DEFER_STORE): the routed dgrad and the K-grouped dWg / dWu.
    out.append(Sm90Config.choose(600, 4096, 132, 128, False, A_KMAJOR=True, B_KMAJOR=False, GROUPING=1,
                                 C_TMA=True, DYNAMIC=True))
    out.append(Sm90Config.choose(11, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False, GROUPING=2,
                                 C_TMA=True, DYNAMIC=True))
    # The router weight gradient with both [hi; lo] halves in each CTA (PAIRED_HALVES), the
    # cluster over its token pieces.
    out.append(Sm90Config.choose(1, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False, GROUPING=2,
                                 EPILOGUE=1, SPLIT_CLUSTER=True, PAIR_ROWS=True))
    # SOL-080's K = T weight gradients with a short last k-step (K_TAIL_BOXES): grad_Wd on
    # ping-pong consumers and grad_[Wg; Wu] with its tiles claimed.
    out.append(Sm90Config.choose(32, 1408, 132, 0, True, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                 K_TAIL=True))
    out.append(Sm90Config.choose(22, 4096, 132, 0, False, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                 DYNAMIC=True, K_TAIL=True))
    out = [dataclasses.replace(cfg, BAND_M=band_rows(cfg)) for cfg in out]  # as _prepare_sm90 sets it
    # SOL-080's dgrad in bands of 64 row tiles (sol080.DGRAD_BAND): 128 x 256 and 128 x 128 tiles.
    for m_tiles, n in ((64, 4096), (3, 4096)):
        cfg = Sm90Config.choose(m_tiles, n, 132, 0, False, A_KMAJOR=True, B_KMAJOR=False, C_TMA=True)
        out.append(dataclasses.replace(cfg, BAND_M=band_rows(cfg, 64)))
    return out


settings.watch(__name__)  # (gpu/sol080.py keeps its plans until a setting changes)
