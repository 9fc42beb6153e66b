"""SOL-080 backward on the GPU (sol080.md): 5-9 launches over the shared GEMM engine, replayed as
one CUDA graph when a caller repeats a call on the same buffers (gpu/graphs.py).

The SwiGLU backward (steps 3-4) runs in the epilogue of d_act = g Wd, with the contract's rounding
points, writing [d_gate | d_up] rows directly (d_act is never stored); where the Hopper loop does
not apply (odd strides), d_act is stored and an elementwise kernel follows. At small T, where
d_act's few output tiles would leave most SMs idle through a K = H reduction, it runs split-K
into fp32 pieces and the SwiGLU kernel sums them first (gemm.k_splits_for, while its tiles fill at
most a third of the SMs: ACT_SPLIT_THIRD; the dgrad likewise where grad_[Wg; Wu] does not follow
it on the main stream: DGRAD_SPLITS).

The contract's three dgrad products (d_up Wu, d_gate Wg, bf16(grl) Wr) run as one GEMM over the
concatenated reduction, accumulated in fp32 and rounded once (within the pass rule; the contract
rounds each to bf16 first), its tiles walked rows fastest (DGRAD_BAND).

The router weight gradient (step 11, fp32 products: grl = hi + lo, two bf16 halves) and the two
weight gradients that reduce over the same x run as one GEMM: one workspace row per token holds
[hi | d_gate | d_up | lo] (_Acts), and [grad_router; grad_Wg; grad_Wu] = [hi | d_gate | d_up]^T x
+ [lo | 0]^T x, the second reduction only over the router's rows (gemm Segment.m), the router's
rows leaving as fp32 (gemm f32_head). x is read once for all three, and the router's rows, a
memory-bound GEMM of their own (35 us at T = 8192), become 128 more rows of a compute-bound one.
It runs so above router._CLUSTER_SUM_MAX_T tokens, where the router wgrad on its own would sum
its pieces through global memory with a kernel at the call's end (T = 8192: -14..-20 us); below,
its own GEMM sums them in a cluster and measured as fast or faster (T = 1321: 10 us; bench/NOTES.md
v0.10). CUPY_MOE_SOL080_FUSED_WGRAD = auto (that rule) | 1 (always) | 0 (never).

The launches form a small DAG over two streams (fork/join by events, captured as graph branches):
    main: d_act GEMM (+ SwiGLU backward) .. dgrad [d_gate | d_up | bf16(grl)] @ [Wg; Wu; Wr]
    side: router kernel (+ the top-k index check) .. grad_Wd = g^T act .. [grad_router; grad_Wg;
          grad_Wu] (unfused: grad_[Wg; Wu], and the router wgrad at the end of the branch that
          ends first)
in one of three orders (_Plan): as drawn (mid T); grad_Wd first on the main stream, the router
beside it, then d_act (wd_first: T >= 5120, and T = 3072); or at small T grad_[Wg; Wu] after the
dgrad on the main stream (small_t_order).
The router kernel runs the call's index check, whose verdict every later launch reads. It runs
beside d_act where d_act leaves it at least 8 SMs (_Plan.router_beside: d_act on the fewest CTAs
that keep its rounds, or split in fewer pieces); where d_act takes three rounds or more, d_act
takes every SM instead and the router waits beside it for the SMs d_act's last round leaves
(ROUTER_QUEUED: T = 3073 .. 5119 on 132 SMs, with the router wgrad inside grad_[Wg; Wu]). Every
GEMM CTA takes a whole SM's registers, so a router queued beside a d_act of fewer rounds would
wait for it and hold back the dgrad: there (T = 3072), and from T = 5120 (WD_FIRST), grad_Wd
runs first instead, with the router beside it, and d_act after it (the router goes first, alone,
where neither order applies: d_act off the Hopper loop or split over every SM, or one stream).
d_act reads no routing, so it does not wait for the verdict when the router runs beside it or beside
grad_Wd; grad_Wd likewise.
Elsewhere grad_Wd, which needs neither d_act nor the router, takes the SMs d_act's last round
leaves, as grad_[Wg; Wu] beside the dgrad (at small T grad_[Wg; Wu] follows the dgrad on the main
stream instead, the dgrad unsplit and grad_Wd on the SMs it leaves, or on half the SMs where it
leaves fewer than 16: SMALL_T_ORDER, SMALL_T_WD_HALF).
From T = 3584 up to where grad_Wd goes first, d_act runs plain and the SwiGLU backward as its own
kernel on a few SMs beside grad_Wd (SWIGLU_SMS), before the dgrad and grad_[Wg; Wu] read it. Where
the fused d_act would take two rounds of the SMs (or one that leaves the router no room: 1409 ..
1536 tokens on 132 SMs) and a plain 128 x 256 one fits in one round beside the router (up to 2560
tokens), d_act runs so, and the SwiGLU kernel on half the SMs beside grad_Wd (WIDE_MID_T; only
where that kernel's rows apply: I and E multiples of 8), and grad_Wd as (act^T g)^T in 128 x 256
tiles (WD_TRANSPOSED).
The router wgrad ends whichever branch would end first (bench/NOTES.md v0.6). Holding two GEMMs
to disjoint SM budgets, chosen by a tile-time model, measured no better (v0.5).
CUPY_MOE_SOL080_STREAMS=0 keeps everything on one stream (the router kernel first).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import cupy as cp

from .. import _build, _launch, validate
from .._arrays import bfloat16
from .._launch import cdiv, grid_stride_blocks, i32, i64, ptr
from . import graphs, router, settings
from . import gemm as gemm_module
from .gemm import (Segment, Sm90Config, SwigluBackward, _addr, device_sms, even_round_ctas, gemm,
                   k_splits_for, sm90_applies, transposed_applies)
from .streams import Side

CONCURRENT = os.environ.get("CUPY_MOE_SOL080_STREAMS", "1") != "0"
# A/B only: 0 runs d_act as a plain GEMM and the SwiGLU backward as an elementwise kernel, where
# the fused epilogue would run (it costs ~27% over the plain GEMM at large T: bench/NOTES.md v0.6).
FUSED_D_ACT = os.environ.get("CUPY_MOE_SOL080_FUSED_D_ACT", "1") != "0"
# A/B only: the GEMMs (of "wd", "wgu", "dgrad") that take gemm(even_rounds=True), leaving the SMs
# their last round would not fill to the kernels beside them from the start; and where the router
# wgrad goes ("auto": the branch that ends first; "side": after grad_[Wg; Wu]; "side-early":
# after grad_Wd; "early": on the main stream before the dgrad; "main": on the main stream after
# the dgrad, at every T).
EVEN_ROUNDS = frozenset(filter(None, os.environ.get("CUPY_MOE_SOL080_EVEN_ROUNDS", "").split(",")))
WGRAD_AT = os.environ.get("CUPY_MOE_SOL080_WGRAD", "auto")
# The GEMMs (of "wd", "wgu", "dgrad") that claim their tiles as their CTAs go (gemm(dynamic=True))
# instead of taking every gridDim-th tile, so that CTAs which start late take fewer. "auto":
# grad_[Wg; Wu] wherever it runs on the side stream, where its CTAs start as another kernel's
# end one by one (grad_Wd's at mid T, whose CTAs end up to 45 us apart; d_act's ragged last round
# at T = 8192) and its static order left the late ones a full share: 3719 -2.6 / -4.4, 4093
# -3.4 / -3.4, 8192 -7.4, 6144 -1.6, 3089 -1.0 / -1.1 us in two runs, the rest of mid T within
# +-0.8 (bench/NOTES.md v0.28). Not at small T, where it follows the dgrad on the main stream on
# every SM at once (192 / 384 +1.0 / +1.9). Claims keep the bits. A comma list (A/B), or "none".
CLAIMS = os.environ.get("CUPY_MOE_SOL080_CLAIMS", "auto")
# A/B only: where the fused 128-wide d_act leaves the router kernel no room beside it (it then goes
# first: T = 3072, 6144), run d_act as a plain 128 x 256 GEMM (more efficient per FLOP, and its
# even-rounds grid leaves SMs free) with the router beside it, then the elementwise SwiGLU backward.
WIDE_D_ACT = os.environ.get("CUPY_MOE_SOL080_WIDE_D_ACT", "0") != "0"
# Where the fused 128-wide d_act takes two rounds of the SMs (or one with no room for the router:
# WIDE_FULL_ROUND) and a plain 128 x 256 one fits in one round beside the router (T = 1409 .. 2560
# on 132 SMs), d_act runs plain in 128 x 256 tiles and
# the SwiGLU backward as the bulk kernel on half the SMs beside grad_Wd (SWIGLU_SMS' kernel; grad_Wd
# on the other half): one round of wide tiles instead of two of fused narrow ones, and the SwiGLU
# no longer waits for grad_Wd's CTAs to leave SMs (with the elementwise kernel after d_act instead,
# 2053 lost 5 us). T = 1571 / 1879 / 2053: -5.0..-5.6 / -6.6..-6.8 / -2.2..-3.4 us in two A/Bs of
# three T, -4.3 / -4.3 / -0.5 in one of all 16 (mean -0.5), the same bits; 997-1321 and 3089-4093,
# where the rounds do not drop from two to one, lost 2-13 with wide tiles (bench/NOTES.md v0.40).
# "1" / "0" (A/B).
WIDE_MID_T = os.environ.get("CUPY_MOE_SOL080_WIDE_MID_T", "1") != "0"
# The same where the fused d_act takes one round of the SMs but leaves the router no room beside
# it (T = 1409 .. 1536 on 132 SMs: 132 tiles), where grad_Wd went first with the router beside it:
# 1420 / 1480 / 1536 -17.2 / -10.7 / -9.2 us (162.1 / 170.5 / 170.4 against 179.3 / 181.2 / 179.6;
# no workload lies there; bench/NOTES.md v0.44). "1" / "0" (A/B).
WIDE_FULL_ROUND = os.environ.get("CUPY_MOE_SOL080_WIDE_FULL_ROUND", "1") != "0"
# Where the router weight gradient runs as the first rows of the grad_[Wg; Wu] GEMM instead of as
# its own GEMM (router.weight_gradient): "auto" (module doc), "1" everywhere, "0" nowhere.
FUSED_WGRAD = os.environ.get("CUPY_MOE_SOL080_FUSED_WGRAD", "auto")
# A/B only: 1 sums small-T d_act's and the dgrad's split-K pieces in the GEMM, a cluster per tile
# (gemm.SPLIT_CLUSTER), instead of through global memory and the sum kernels: 1.5-5 us slower at
# T <= 384 (bench/NOTES.md v0.9).
SPLIT_CLUSTER = os.environ.get("CUPY_MOE_SOL080_SPLIT_CLUSTER", "0") != "0"
# grad_Wd = g^T act (K = T) on ping-pong consumers, whose tile epilogue hides behind the other
# warpgroup's main loop: "auto" up to _WD_PINGPONG_MAX_T tokens (-1..-6 us at T <= 4093, +10..16
# at 6144 / 8192, where its 128 x 128 tiles' longer reductions lose to the cooperative form; bench/
# NOTES.md v0.11), "1" always, "0" never. The same bits either way.
WD_PINGPONG = os.environ.get("CUPY_MOE_SOL080_WD_PINGPONG", "auto")
_WD_PINGPONG_MAX_T = 4096
# grad_[Wg; Wu] = [d_gate | d_up]^T x (K = T) likewise: "auto" up to _WGU_PINGPONG_MAX_T tokens
# (-1..-2 us at each T <= 512 in two runs; +5..65 us above, where its 128 x 256 cooperative tiles
# win; bench/NOTES.md v0.11), "1" always, "0" never.
WGU_PINGPONG = os.environ.get("CUPY_MOE_SOL080_WGU_PINGPONG", "auto")
_WGU_PINGPONG_MAX_T = 512
# grad_Wd as (act^T g)^T, stored transposed (gemm(out_transposed)): I = 1408 rows in 11 tiles of
# 128, H = 4096 columns in 16 of 256, where grad_Wd itself takes 128 x 128 tiles (n = 1408 is no
# multiple of 256), which cost ~7% more per FLOP with every SM busy (bench/NOTES.md v0.41).
# "auto": where WIDE_MID_T's plan runs, grad_Wd capped to half the SMs beside the SwiGLU kernel
# (1571 / 1879 / 2053: -1.4..-1.5 / -0.9..-2.6 / -0.9..-2.4 us in three A/Bs, v0.41). Elsewhere
# its 176 long tiles round worse in the call: 997 / 1321 +3..+4, 3072 / 4093 / 6144 +10..+14
# (v0.41), 8192 +41..+51 once grad_Wd went first (v0.32; -6 before, v0.11). 3719 gained 8 us in
# two A/Bs (traced: each later launch a few us earlier), not understood well enough for a rule of
# one T. "1" always, "0" never.
WD_TRANSPOSED = os.environ.get("CUPY_MOE_SOL080_WD_TRANSPOSED", "auto")
# Small T (split d_act): the side stream's grad_Wd, ready when the dgrad is, took every SM first
# at T = 384 and held the dgrad back 11 us (bench/NOTES.md v0.11). "wgu-main": grad_[Wg; Wu] on
# the main stream after the dgrad instead of on the side after grad_Wd, and grad_Wd on at most the
# SMs the dgrad leaves (when >= _SMALL_T_MIN_FREE); with DGRAD_SPLITS "auto" the dgrad is then
# not split (at T <= 256 its pieces took 128 SMs and needed a sum kernel). "auto": "wgu-main"
# (T = 192 -3.5 us, 211 -0.9 with the unsplit dgrad; 293 / 384 / 512 -0.8..-3.2; bench/NOTES.md
# v0.12); "cap": only the cap (A/B); "": neither.
SMALL_T_ORDER = os.environ.get("CUPY_MOE_SOL080_SMALL_T_ORDER", "auto")
_SMALL_T_MIN_FREE = 16
# Where the dgrad leaves fewer than that (T = 385 .. 512 on 132 SMs: its 128 CTAs), grad_Wd, ready
# as the router's SMs and then d_act's free, took every SM as they left and held the SwiGLU sum,
# and so the dgrad, back ~9 us (bench/NOTES.md v0.40). Capped to half the SMs, it leaves the sum
# the other half as d_act ends: 400 / 449 / 512 -1.1 / -2.9 / -2.5 us, 600 / 700 unchanged (v0.49;
# 44, 56, 76, 88 and 100 CTAs gained less or lost). "1" / "0" (A/B).
SMALL_T_WD_HALF = os.environ.get("CUPY_MOE_SOL080_SMALL_T_WD_HALF", "1") != "0"
# The dgrad's split-K pieces: "auto" none where grad_[Wg; Wu] follows the dgrad (SMALL_T_ORDER
# "wgu-main"), else gemm.k_splits_for; "k": k_splits_for always; "1": never (A/B).
DGRAD_SPLITS = os.environ.get("CUPY_MOE_SOL080_DGRAD_SPLITS", "auto")
# The unsplit dgrad in 128 x 256 tiles where they fill at least _DGRAD_WIDE_FILL of the SMs but
# not all of them (gemm's choose() takes 256 only where every SM gets a tile): at T = 997, 128 wide
# tiles on 128 SMs in one round instead of 256 narrow ones in two; a 256-wide k-step reads 48 KB
# for 4.2 MFLOP against 32 KB for 2.1. "auto" | "1" | "0" (A/B).
DGRAD_WIDE = os.environ.get("CUPY_MOE_SOL080_DGRAD_WIDE", "auto")
_DGRAD_WIDE_FILL = 0.9
# grad_Wd (which reads neither d_act nor the routing) first on the main stream, on the fewest CTAs
# that keep its rounds, with the router kernel beside it on the SMs that leaves, and d_act after
# it; instead of the router beside d_act (or first, alone, where d_act's rounds fill every SM:
# T = 3072, 6144) and grad_Wd on the side stream. The router wgrad then runs inside grad_[Wg; Wu]
# (FUSED_WGRAD "auto"). "auto": from _WD_FIRST_MIN_T tokens and where the router would go first
# (T = 6144 -32 us, 8192 -14, 3072 -20 with the fused router wgrad; 4093 -1; 997 .. 3089 +7..+30
# alone, 3089 -5 with the fused wgrad, 1321 +16; bench/NOTES.md v0.12); "1": wherever d_act is
# unsplit; "0": never.
WD_FIRST = os.environ.get("CUPY_MOE_SOL080_WD_FIRST", "auto")
_WD_FIRST_MIN_T = 5120
# d_act as a plain GEMM and the SwiGLU backward contract as its own kernel on a few SMs beside
# grad_Wd (capped to the others), instead of in d_act's epilogue, where any epilogue work beside
# wgmma costs d_act ~20% (bench/NOTES.md v0.12). The kernel (sol080_swiglu_backward_bulk) brings
# its rows in by bulk copies and runs the fused epilogue's math: the same bits. It pays where
# d_act's rounds leave grad_Wd to run mostly after it, with time for the SwiGLU beside it (T =
# 4093: -14..-15 us in four runs, 3719: -1..-6 in four; 3089 +13..+16, 2053 +12..+24, 1571 +7,
# 997 +3..+16, where grad_Wd already fills d_act's last round and the SwiGLU lands on the dgrad's
# path; bench/NOTES.md v0.13). "auto": _SWIGLU_BESIDE_SMS SMs from _SWIGLU_BESIDE_MIN_T tokens
# up to where grad_Wd goes first (WD_FIRST); N: N SMs wherever d_act is unsplit and fused
# (grad_Wd then never first); "0": never.
SWIGLU_SMS = os.environ.get("CUPY_MOE_SOL080_SWIGLU_SMS", "auto")
# Where d_act (unsplit, 128-wide tiles, fused or plain) takes three rounds of the SMs or more and
# the router would run beside its even rounds (T = 3073 .. 5119 at H = 4096, I = 1408 on 132 SMs,
# up to where grad_Wd goes first), d_act takes every SM and the router kernel is queued beside it
# on the side stream: it starts on the SMs d_act's last, ragged round leaves (CTAs that end after
# fewer tiles), instead of holding 14-40 SMs from the start, and the router wgrad rides in
# grad_[Wg; Wu] (as T > 3200 has it anyway). 3500 -9.4, 3719 -5.5 / -5.9, 3850 -4.4, 4093 -1.5 /
# -2.3, 4400 -5.4, 4800 -8.9, 5100 -6.5, 3300 -1.4; 3089 ties the router first, alone, which it
# replaces there (v0.44's ROUTER_FIRST); with two rounds the router waits a whole round for SMs
# and holds the dgrad back (2600 +1.5, 2800 +9.6: not taken). bench/NOTES.md v0.47. "auto" | "0"
# (A/B: the router beside d_act's even rounds).
ROUTER_QUEUED = os.environ.get("CUPY_MOE_SOL080_ROUTER_QUEUED", "auto")
_SWIGLU_BESIDE_SMS = 20
_SWIGLU_BESIDE_MIN_T = 3584
# The elementwise kernels' grids (the SwiGLU of d_act's pieces or of stored d_act, the dgrad's
# piece sum) sized by the 8-element chunks their 16-byte paths walk, not by elements: the element
# count launched 8x the blocks with work (1056 against 132 at T = 192), and where the side
# stream's grad_Wd had taken half the SMs first (T = 211) the empty ones' dispatch stretched the
# SwiGLU sum from 3.6 to 6.1 us on the dgrad's path (bench/NOTES.md v0.44). "0": by elements (A/B).
CHUNK_GRIDS = os.environ.get("CUPY_MOE_SOL080_CHUNK_GRIDS", "1") != "0"
# d_act split-K only while its unsplit 128 x 128 tiles fill at most a third of the SMs (<= 44 of
# 132: T <= 512 at I = 1408); gemm.k_splits_for alone splits up to half. With 5-6 row tiles (55-66
# tiles: T = 513 .. 768) the unsplit fused d_act beside the router beat 2 pieces and their sum
# (with the router first, alone, where the pieces filled every SM): 513 -4.4, 576 -4.8, 640 -9.6,
# 641 -10.3, 700 -12.6, 768 -12.5 us; with 4 row tiles the pieces still win (450 +1.7, 512
# +2.5 unsplit), with 3 by far (293 +14, 384 +16; bench/NOTES.md v0.44). "0": k_splits_for's (A/B).
ACT_SPLIT_THIRD = os.environ.get("CUPY_MOE_SOL080_ACT_SPLIT_THIRD", "1") != "0"
# The dgrad's tiles in bands of this many row tiles (gemm(band); each band's columns in turn, its
# rows fastest), instead of gemm.BAND_ROWS (4, 128 x 256 tiles) or none (128 x 128): 64 is every
# row up to T = 8192, so the CTAs running together share a column block of [Wu; Wg; Wr], the
# larger operand up to T = 4096 (24 MB), and sweep the activations' rows. Bands of 8 / 16 / 32 /
# 64 against the library's in four A/Bs: -0.2..-0.8 us on the mean leaving out T = 8192 (+-15 us
# of noise there); steadily 3072 -1.5..-2.3, 1321 -0.6..-1.1, 192 / 211 / 293 / 512 -0.3..-1.9
# (bench/NOTES.md v0.50); the same bits. "0": gemm's (A/B).
DGRAD_BAND = int(os.environ.get("CUPY_MOE_SOL080_DGRAD_BAND", "64"))
_SIDE_EVENTS = ("fork", "d_act_done", "router_done", "join")  # the side stream's (streams.Side)


def _knob(value: str, auto: bool) -> bool:
    """An "auto" | "1" | "0" knob's answer: "auto" takes the plan's rule."""
    return value == "1" or value == "auto" and auto


class _Inputs(NamedTuple):
    """The arrays the math reads (bias and router_logits are not among them)."""

    g: object
    x: object
    wr: object
    scores: object
    idx: object
    tw: object
    mask: object
    wg: object
    wu: object
    wd: object
    gate: object
    up: object
    act: object


@dataclass(frozen=True)
class _Plan:
    """How a call's two long-reduction GEMMs and the router kernel run (a function of shapes,
    alignment and the SM count).
    act_splits / dgrad_splits > 1: split-K into fp32 pieces summed by a small kernel (few output
    tiles at small T, gemm.k_splits_for); act_fused: else the SwiGLU backward in d_act's epilogue.
    router_beside: the router kernel runs beside d_act on SMs d_act leaves free (at least
    _ROUTER_SMS), instead of alone before it: the whole d_act on the fewest CTAs that keep its
    rounds (gemm's even_rounds), a split one in fewer pieces. wgrad_fused: the router weight
    gradient as the first rows of the grad_[Wg; Wu] GEMM (FUSED_WGRAD; else its own GEMM, which
    wgrad_at, wgrad_stacked and wgrad_cluster describe). wd_first: grad_Wd runs first on the
    main stream (even rounds), the router beside it on the side stream, d_act after grad_Wd."""

    act_splits: int
    act_fused: bool
    dgrad_splits: int
    router_beside: bool = False
    even_rounds: frozenset = frozenset()  # EVEN_ROUNDS (A/B)
    claims: frozenset = frozenset()       # the GEMMs that claim their tiles (CLAIMS)
    wgrad_at: str = "auto"                # WGRAD_AT (A/B)
    wgrad_stacked: bool = True            # router.STACKED (A/B)
    split_cluster: bool = False           # gemm.SPLIT_CLUSTER and SPLIT_CLUSTER: split pieces summed in the GEMM
    wgrad_cluster: bool = True            # router.summed_in_the_gemm: its knobs, E and T
    paired_halves: bool = True            # gemm.PAIRED_HALVES (A/B: a graph per setting)
    act_wide: bool = False                # plain 128 x 256 d_act (WIDE_MID_T, WIDE_D_ACT)
    wgrad_fused: bool = True              # the router wgrad in the grad_[Wg; Wu] GEMM (FUSED_WGRAD)
    wd_pingpong: bool = False             # grad_Wd on ping-pong consumers (WD_PINGPONG)
    wgu_pingpong: bool = False            # grad_[Wg; Wu] on ping-pong consumers (WGU_PINGPONG)
    wd_transposed: bool = False           # grad_Wd as (act^T g)^T where that applies (WD_TRANSPOSED)
    small_t_order: str = ""               # SMALL_T_ORDER's answer where d_act is split
    wd_first: bool = False                # grad_Wd first with the router beside it (WD_FIRST)
    swiglu_sms: int = 0                   # SMs of the elementwise SwiGLU beside grad_Wd (SWIGLU_SMS)
    store_ring: int = 0                   # gemm.STORE_RING (A/B: a graph per setting)
    pingpong_ring: int = 0                # gemm.PINGPONG_STORE_RING (A/B: a graph per setting)
    band_rows: tuple = ()                 # gemm.BAND_ROWS, BAND_NARROW_ROWS (A/B: a graph per setting)
    dgrad_wide: bool = False              # the unsplit dgrad in 128 x 256 tiles (DGRAD_WIDE)
    router_min_blocks: int = 6            # ROUTER_MIN_BLOCKS (A/B: a graph per setting; _router_kernel)
    chunk_grids: bool = True              # CHUNK_GRIDS (A/B: a graph per setting)
    tail_boxes: bool = True               # gemm.TAIL_BOXES (A/B: a graph per setting)
    k_tail_boxes: bool = True             # gemm.K_TAIL_BOXES (A/B: a graph per setting)
    router_queued: bool = False           # d_act on every SM, the router queued beside it (ROUTER_QUEUED)
    small_t_wd_half: bool = True          # SMALL_T_WD_HALF (A/B: a graph per setting)
    dgrad_band: int = 0                   # the dgrad's bands of row tiles (DGRAD_BAND; 0: gemm's)

    @classmethod
    def of(cls, g, x, wr, wg, wu, wd, gate):
        """The call's plan: a function of T, H, I, E, the operands' 16-byte alignment, the device
        and the modules' settings, kept per those until a setting changes (settings.epoch; the
        rules below take ~20 us of host time, bench/NOTES.md v0.38)."""
        key = (settings.epoch(), gemm_module.device_traits(), g.shape, gate.shape[1], wr.shape[0],
               tuple(a.data.ptr % 16 for a in (g, x, wr, wg, wu, wd, gate)))
        plan = _plans.get(key)
        if plan is None:
            if len(_plans) >= 64:
                _plans.clear()
            plan = _plans[key] = cls._derive(g, x, wr, wg, wu, wd, gate)
        return plan

    @classmethod
    def _derive(cls, g, x, wr, wg, wu, wd, gate):
        T, H = g.shape
        I, E = gate.shape[1], wr.shape[0]
        d_act_on_sm90 = sm90_applies(T, I, [Segment(g, H, wd, I, k=H)], True, False)
        # The workspace (256-byte aligned) stands in as address 0: byte offsets for addresses.
        act_splits = k_splits_for(T, I, H) if d_act_on_sm90 else 1
        d_act_tiles = cdiv(T, _D_ACT_TILE) * cdiv(I, _D_ACT_TILE)
        sms = device_sms()
        if ACT_SPLIT_THIRD and 3 * d_act_tiles > sms:
            act_splits = 1
        act_fused = d_act_on_sm90 and act_splits == 1 and FUSED_D_ACT
        router_beside = CONCURRENT and d_act_on_sm90 and act_splits == 1 and (
            sms - even_round_ctas(d_act_tiles, sms) >= _ROUTER_SMS)
        wide_tiles = cdiv(T, _D_ACT_TILE) * cdiv(I, 2 * _D_ACT_TILE)
        act_wide = (WIDE_D_ACT and CONCURRENT and d_act_on_sm90 and act_splits == 1 and
                    not router_beside and sms - even_round_ctas(wide_tiles, sms) >= _ROUTER_SMS)
        bulk_swiglu = I % 8 == 0 and E % 8 == 0  # the bulk SwiGLU kernel's rows (_swiglu_bulk)
        # (Without the bulk kernel beside grad_Wd, the wide d_act's elementwise SwiGLU after it
        # lost: 2053 +4..+5 us, bench/NOTES.md v0.40.)
        full_round = WIDE_FULL_ROUND and sms - _ROUTER_SMS < d_act_tiles <= sms
        wide_mid = (WIDE_MID_T and CONCURRENT and act_fused and bulk_swiglu and
                    (cdiv(d_act_tiles, sms) == 2 or full_round) and wide_tiles <= sms - _ROUTER_SMS)
        if act_wide or wide_mid:
            act_wide, act_fused, router_beside = True, False, True
        if CONCURRENT and act_splits > 1:
            # Split d_act fills the SMs in one round: with fewer pieces it leaves the router
            # kernel room beside it (each piece a longer reduction: +20-50% of ~17 us, against
            # the router's ~14 us alone in front).
            fewer = (sms - _ROUTER_SMS) // d_act_tiles
            if fewer >= 2:
                act_splits, router_beside = min(act_splits, fewer), True
        wd_first = CONCURRENT and d_act_on_sm90 and act_splits == 1 and not act_wide and _knob(
            WD_FIRST, T >= _WD_FIRST_MIN_T or not router_beside)
        # (a split d_act's tiles fill at most half the SMs: never three rounds)
        router_queued = (ROUTER_QUEUED != "0" and router_beside and not wd_first and not act_wide
                         and cdiv(d_act_tiles, sms) >= 3)
        swiglu_sms = 0
        if CONCURRENT and (act_fused or act_wide) and bulk_swiglu:
            if SWIGLU_SMS == "auto":
                swiglu_sms = (sms // 2 if wide_mid else _SWIGLU_BESIDE_SMS if act_fused and
                              _SWIGLU_BESIDE_MIN_T <= T < _WD_FIRST_MIN_T and not wd_first else 0)
            else:
                swiglu_sms = int(SWIGLU_SMS)
        if swiglu_sms:
            act_fused, wd_first = False, False
        small_t_order = (("wgu-main" if SMALL_T_ORDER == "auto" else SMALL_T_ORDER)
                         if CONCURRENT and act_splits > 1 else "")
        split_dgrad = DGRAD_SPLITS == "k" or DGRAD_SPLITS == "auto" and small_t_order != "wgu-main"
        if CLAIMS == "auto":
            claims = frozenset({"wgu"} if CONCURRENT and small_t_order != "wgu-main" else ())
        else:
            claims = frozenset(name for name in CLAIMS.split(",") if name not in ("", "none"))
        router_beside = router_beside and not wd_first
        acts = _Acts(I, E)
        # (grad_Wd first pays only with the router wgrad inside grad_[Wg; Wu]: its own GEMM would
        # end the call alone; T = 3072 -20 us with both, +8 with grad_Wd first alone.)
        wanted = _knob(FUSED_WGRAD, not router.summed_in_the_gemm(T, E) or wd_first or router_queued)
        wgrad_fused = wanted and sm90_applies(E + 2 * I, H, acts.wgrad_segments(0, x, H, T), False, False)
        hi_ld = acts.ld if wgrad_fused else 2 * E  # (hi in the workspace rows or router.py's [hi | lo])
        dgrad_on_sm90 = sm90_applies(T, H, acts.dgrad_segments(0, 0, hi_ld, wu, wg, wr, H), True, False)
        dgrad_splits = k_splits_for(T, H, 2 * I + E) if dgrad_on_sm90 and split_dgrad else 1
        wide_tiles = cdiv(T, Sm90Config.BM) * cdiv(H, 256)
        dgrad_wide = dgrad_on_sm90 and dgrad_splits == 1 and _knob(
            DGRAD_WIDE, _DGRAD_WIDE_FILL * sms <= wide_tiles < sms)
        return cls(act_splits=act_splits, act_fused=act_fused, dgrad_splits=dgrad_splits,
                   router_beside=router_beside, even_rounds=EVEN_ROUNDS, claims=claims, wgrad_at=WGRAD_AT,
                   wgrad_stacked=router.STACKED, split_cluster=gemm_module.SPLIT_CLUSTER and SPLIT_CLUSTER,
                   wgrad_cluster=router.summed_in_the_gemm(T, E), paired_halves=gemm_module.PAIRED_HALVES,
                   act_wide=act_wide, wgrad_fused=wgrad_fused,
                   wd_pingpong=_knob(WD_PINGPONG, T <= _WD_PINGPONG_MAX_T),
                   wgu_pingpong=_knob(WGU_PINGPONG, T <= _WGU_PINGPONG_MAX_T),
                   wd_transposed=_knob(WD_TRANSPOSED, wide_mid),
                   small_t_order=small_t_order, wd_first=wd_first, swiglu_sms=swiglu_sms,
                   store_ring=gemm_module.STORE_RING, pingpong_ring=gemm_module.PINGPONG_STORE_RING,
                   band_rows=(gemm_module.BAND_ROWS, gemm_module.BAND_NARROW_ROWS), dgrad_wide=dgrad_wide,
                   router_min_blocks=ROUTER_MIN_BLOCKS, chunk_grids=CHUNK_GRIDS,
                   tail_boxes=gemm_module.TAIL_BOXES, k_tail_boxes=gemm_module.K_TAIL_BOXES,
                   router_queued=router_queued, small_t_wd_half=SMALL_T_WD_HALF,
                   dgrad_band=DGRAD_BAND)


_plans: dict = {}  # _Plan.of's key -> _Plan


@dataclass(frozen=True)
class _Acts:
    """Where a token's bf16 activation gradients sit in the workspace row [hi | d_gate | d_up | lo]
    (element offsets; ld per row): the dgrad reads d_up, d_gate and hi as three K segments, the
    fused weight-gradient GEMM [hi | d_gate | d_up] as its rows and lo as the router's second
    reduction."""

    I: int
    E: int

    @classmethod
    def of(cls, inputs: "_Inputs") -> "_Acts":
        return cls(inputs.gate.shape[1], inputs.wr.shape[0])

    @property
    def ld(self) -> int:
        return 2 * self.E + 2 * self.I

    hi = 0

    @property
    def dg(self) -> int:
        return self.E

    @property
    def du(self) -> int:
        return self.E + self.I

    @property
    def lo(self) -> int:
        return self.E + 2 * self.I

    def at(self, base, offset: int) -> int:
        """Byte address of column `offset` of row 0 (base: an array or an address)."""
        return _addr(base) + 2 * offset

    def dgrad_segments(self, base, hi, hi_ld: int, wu, wg, wr, H) -> list:
        """The dgrad's reduction [d_up | d_gate | hi] @ [Wu; Wg; Wr]: d_up and d_gate from the
        workspace rows at base, hi from hi (rows hi_ld apart: _grl_at)."""
        return [Segment(self.at(base, self.du), self.ld, wu, H, k=self.I),
                Segment(self.at(base, self.dg), self.ld, wg, H, k=self.I),
                Segment(hi, hi_ld, wr, H, k=self.E)]

    def wgrad_segments(self, base, x, H, T) -> list:
        """[hi | d_gate | d_up]^T x over all E + 2I rows, then lo^T x over the first E."""
        return [Segment(self.at(base, self.hi), self.ld, x, H, k=T),
                Segment(self.at(base, self.lo), self.ld, x, H, k=T, m=self.E)]


_D_ACT_TILE = 128  # d_act's tile edge (Sm90Config.choose: 128 x 128 for n = 1408, fused or not)
_ROUTER_SMS = 8    # fewest free SMs the router kernel runs beside d_act on (else it goes first)


@dataclass
class _Workspace:
    """Temporaries of one call (kept with its graph when captured)."""

    d_act: object      # [T, I] bf16 (None when the SwiGLU backward runs in the GEMM's epilogue)
    act_pieces: object    # [splits, T, I] fp32 split-K pieces of d_act, or None
    dgrad_pieces: object  # [splits, T, H] fp32 split-K pieces of grad_hidden_states, or None
    acts: object       # [T, 2E + 2I] bf16, row t = [hi(t) | d_gate(t) | d_up(t) | lo(t)] (_Acts):
    #                    hi = bf16(grl), hi + lo = grl
    grl: object        # unfused: [T, 2E] bf16, row t = [hi(t) | lo(t)] (router.py's form), else None
    partial: object    # fp32 pieces of the router weight gradient (router.py), or None
    check: object = None  # the top-k check's buffers the launches write (IndexCheck.keep)

    @classmethod
    def allocate(cls, T, H, I, E, plan: _Plan, check=None):
        pieces = lambda n, *shape: cp.empty((n,) + shape, cp.float32) if n > 1 else None
        wgrad_pieces = None if plan.wgrad_fused else router.weight_gradient_pieces_shape(T, E, H)
        return cls(d_act=None if plan.act_fused or plan.act_splits > 1 else cp.empty((T, I), bfloat16),
                   act_pieces=None if plan.split_cluster else pieces(plan.act_splits, T, I),
                   dgrad_pieces=None if plan.split_cluster else pieces(plan.dgrad_splits, T, H),
                   acts=cp.empty((T, _Acts(I, E).ld), bfloat16),
                   grl=None if plan.wgrad_fused else cp.empty((T, 2 * E), bfloat16),
                   partial=wgrad_pieces and cp.empty(wgrad_pieces, cp.float32), check=check)


def sol080_backward(g, x, wr, bias, logits, scores, idx, tw, mask, wg, wu, wd, gate, up, act):
    """The arguments' structure is checked (validate.sol080_args); the top-k index values are
    checked here, by the router kernel, the call's first launch. Every later launch reads its
    verdict and does nothing when it is bad; the host waits for the verdict only after all of
    them are enqueued, and raises before any result is returned."""
    T, H = x.shape
    I, E = gate.shape[1], wr.shape[0]
    grad_wgu = cp.empty((2 * I, H), bfloat16)  # [grad_Wg; grad_Wu]: one GEMM, two contiguous halves
    grad_wd = cp.empty((H, I), bfloat16)
    grad_router = cp.empty((E, H), cp.float32)
    grad_h = cp.empty((T, H), bfloat16)
    inputs = _Inputs(g, x, wr, scores, idx, tw, mask, wg, wu, wd, gate, up, act)
    outputs = (grad_h, grad_router, grad_wgu, grad_wd)
    check = validate.topk_check_in_kernel("topk_indices", idx, E)
    plan = _Plan.of(g, x, wr, wg, wu, wd, gate)
    # A graph bakes in the check's scratch and report addresses; its workspace keeps their
    # buffers alive (check.keep), so no later check gets those addresses while it can replay.
    key = ("sol080", T, H, I, E, idx.shape[1], check.cancel, check.report, plan) + tuple(
        a.data.ptr for a in inputs + outputs)
    try:
        graphs.run(key, lambda: _Workspace.allocate(T, H, I, E, plan, check.keep),
                   lambda ws: _enqueue(inputs, outputs, ws, plan, check))
    except BaseException:
        check.settle()
        raise
    check.finish()
    return grad_h, grad_router, grad_wgu[:I], grad_wgu[I:], grad_wd


def _enqueue(inputs: _Inputs, outputs, ws: _Workspace, plan: _Plan, check) -> None:
    grad_h, grad_router, grad_wgu, grad_wd = outputs
    cancel = check.cancel
    d_act, wd_grad = _d_act_gemm(inputs, ws, plan), _grad_wd_gemm(inputs, grad_wd, plan)
    dgrad = _dgrad_gemm(inputs, grad_h, ws, plan)
    wgu_grad = _grad_wgu_gemm(inputs, grad_wgu, grad_router, ws, plan)
    for kwargs in (wd_grad, dgrad, wgu_grad):
        kwargs["cancel"] = cancel
    if plan.wd_pingpong and not wd_grad.get("out_transposed"):  # (the transposed form is for 256-wide tiles)
        wd_grad["pingpong"] = True
    if plan.wgu_pingpong:
        wgu_grad["pingpong"] = True
    # d_act and grad_Wd read no routing: beside the router kernel (which runs the check) they
    # cannot wait for the verdict, and do not need to; after it, they read it like the rest.
    router_early = plan.router_beside or plan.wd_first  # beside d_act or grad_Wd, not first
    d_act["cancel"] = None if router_early else cancel
    d_act["even_rounds"] = plan.router_beside and not plan.router_queued
    if plan.wd_first:
        wd_grad.update(cancel=None, even_rounds=True)
    for name, kwargs in (("wd", wd_grad), ("wgu", wgu_grad), ("dgrad", dgrad)):
        if name in plan.even_rounds and kwargs.get("k_splits", 1) == 1:
            kwargs["even_rounds"] = True
        if name in plan.claims:
            kwargs["dynamic"] = True
    main = cp.cuda.get_current_stream()
    side = Side.of(main, _SIDE_EVENTS) if CONCURRENT else None
    wgu_on_main = side is not None and plan.small_t_order == "wgu-main"
    if side is not None and plan.small_t_order:
        wd_grad["max_ctas"] = _small_t_wd_ctas(inputs, plan)
    if plan.swiglu_sms:
        wd_grad["max_ctas"] = device_sms() - plan.swiglu_sms
    router_kernel = lambda: _router_kernel(inputs, *_grl_at(inputs, ws, plan), check.kernel_args,
                                           plan.router_min_blocks)
    if not router_early:
        router_kernel()  # first: the index check every launch reads
    if side is not None:
        side.fork.record(main)
        side.stream.wait_event(side.fork)

    def router_wgrad():  # its own GEMM (unfused), placed by plan.wgrad_at
        if not plan.wgrad_fused:
            router.weight_gradient(ws.grl, inputs.x, grad_router, ws.partial, cancel)

    if plan.wd_first:  # (a plan with a side stream) the router beside grad_Wd, d_act after it
        gemm(**wd_grad)
        with side.stream:
            router_kernel()
            side.router_done.record()
    gemm(**d_act)
    _finish_d_act(inputs, ws, plan, d_act["cancel"])
    with side.stream if side else main:
        if plan.router_beside:
            router_kernel()
            side.router_done.record()
        if not plan.wd_first:
            gemm(**wd_grad)
        if side and plan.wgrad_at == "side-early":
            router_wgrad()
    if side:
        side.d_act_done.record(main)
    if router_early:
        main.wait_event(side.router_done)
    if plan.wgrad_at == "early":
        router_wgrad()
    gemm(**dgrad)
    _finish_dgrad(grad_h, ws, plan, cancel)
    if wgu_on_main:
        gemm(**wgu_grad)
    # The router wgrad goes on the branch that ends first: the side one at small T, where the
    # main branch carries the dgrad and grad_[Wg; Wu] (or, in the old order, split-K pieces and
    # their sums), the main one otherwise.
    wgrad_on_side = side is not None and (plan.wgrad_at == "side" or
                                          plan.wgrad_at == "auto" and plan.act_splits > 1)
    wgrad_done = plan.wgrad_at == "early" or side is not None and plan.wgrad_at == "side-early"
    if not wgrad_on_side and not wgrad_done:
        router_wgrad()
    with side.stream if side else main:
        if not wgu_on_main:
            if side:
                side.stream.wait_event(side.d_act_done)
            gemm(**wgu_grad)
        if wgrad_on_side:
            router_wgrad()
        if side:
            side.join.record()
    if side:
        main.wait_event(side.join)


def _small_t_wd_ctas(inputs: _Inputs, plan: _Plan) -> int:
    """grad_Wd's CTAs beside the small-T dgrad (SMALL_T_ORDER; 0: one per SM): the SMs the dgrad
    leaves, or half the SMs where it leaves fewer than _SMALL_T_MIN_FREE (SMALL_T_WD_HALF)."""
    free = device_sms() - _dgrad_ctas(inputs, plan)
    if free >= _SMALL_T_MIN_FREE:
        return free
    return device_sms() // 2 if plan.small_t_wd_half else 0


def _dgrad_ctas(inputs: _Inputs, plan: _Plan) -> int:
    """The dgrad's persistent grid as gemm() will size it (its tile width from the config gemm()
    chooses: 128 at small T, where fewer than the SMs' worth of 256-wide tiles exist), for the
    SMs it leaves."""
    T, H = inputs.g.shape
    m_tiles, sms = cdiv(T, Sm90Config.BM) * plan.dgrad_splits, device_sms()
    bn = Sm90Config.choose(m_tiles, H, sms, wide=plan.dgrad_wide, SPLIT_K=plan.dgrad_splits > 1).BN
    return min(m_tiles * cdiv(H, bn), sms)


def _d_act_gemm(inputs: _Inputs, ws: _Workspace, plan: _Plan) -> dict:
    """d_act = g Wd (step 1): split-K pieces, or with the SwiGLU backward (steps 3, 4) fused, or
    stored for _finish_d_act."""
    T, H = inputs.g.shape
    I = inputs.gate.shape[1]
    common = dict(m=T, n=I, segments=[Segment(inputs.g, H, inputs.wd, I, k=H)], a_kmajor=True,
                  b_kmajor=False, ldc=I)
    acts = _Acts.of(inputs)
    swiglu = dict(out=None, epilogue="swiglu_backward", engine="sm90",
                  swiglu=SwigluBackward(gate=inputs.gate, up=inputs.up, dg=acts.at(ws.acts, acts.dg),
                                        du=acts.at(ws.acts, acts.du), ld_grad=acts.ld,
                                        contract_rounding=True))
    if plan.act_splits > 1 and plan.split_cluster:  # the pieces summed in the GEMM, then SwiGLU
        return dict(common, k_splits=plan.act_splits, **swiglu)
    if plan.act_splits > 1:
        return dict(common, out=ws.act_pieces, epilogue="f32", k_splits=plan.act_splits,
                    c_group_stride=T * I)
    if plan.act_fused:
        return dict(common, **swiglu)
    return dict(common, out=ws.d_act, wide=plan.act_wide)


def _finish_d_act(inputs: _Inputs, ws: _Workspace, plan: _Plan, cancel) -> None:
    """[d_gate | d_up] from d_act's pieces or stored d_act (steps 3, 4), unless fused."""
    gate, up = inputs.gate, inputs.up
    T, I = gate.shape
    n = T * I
    acts = _Acts.of(inputs)
    d_gate_up = [ptr(acts.at(ws.acts, acts.dg)), i32(I), i64(n), i64(acts.ld), ptr(cancel)]
    mod = _build.load_module("sol080.cu")
    if plan.act_splits > 1 and plan.split_cluster:
        return  # summed and turned into [d_gate | d_up] by the GEMM

    def blocks(d_act):  # (the kernels' 16-byte paths, as they test for them: 8 elements a thread)
        chunks = I % 8 == 0 and acts.ld % 8 == 0 and all(
            _addr(a) % 16 == 0 for a in (d_act, gate, up, acts.at(ws.acts, acts.dg)))
        return (_elementwise_blocks(n, plan, chunks),)

    if plan.act_splits > 1:
        _launch.launch(mod, "sol080_swiglu_backward_pieces", blocks(ws.act_pieces), (256,),
                       [ptr(ws.act_pieces), i32(plan.act_splits), ptr(gate), ptr(up)] + d_gate_up)
    elif plan.act_fused or plan.swiglu_sms and _swiglu_bulk(inputs, ws, plan.swiglu_sms, cancel):
        return  # fused, or beside grad_Wd (one block on each of its SMs)
    else:  # (also where gate / up are views the bulk copies cannot take)
        _launch.launch(mod, "sol080_swiglu_backward", blocks(ws.d_act), (256,),
                       [ptr(ws.d_act), ptr(gate), ptr(up)] + d_gate_up)


def _elementwise_blocks(n: int, plan: _Plan, chunks: bool) -> int:
    """Blocks for an elementwise kernel over n elements whose threads take 8-element chunks where
    `chunks` (its 16-byte path: sol080.cu FOR_EACH_CHUNK8), else single elements (CHUNK_GRIDS)."""
    return grid_stride_blocks(cdiv(n, 8) if chunks and plan.chunk_grids else n)


# The bulk SwiGLU kernel's shared stages (2 .. kSwigluMaxStages in sol080.cu; A/B through
# CUPY_MOE_SOL080_SWIGLU_STAGES), which share _SWIGLU_SMEM bytes: (stages - 1) stages of loads in
# flight an SM.
_SWIGLU_STAGES = min(8, max(2, int(os.environ.get("CUPY_MOE_SOL080_SWIGLU_STAGES", "3"))))
_SWIGLU_SMEM = 198 * 1024


def _swiglu_rows(I: int, stages: int) -> int:
    """Rows of a bulk SwiGLU stage: its three bf16 inputs of I columns each."""
    return _SWIGLU_SMEM // stages // (3 * 2 * I)


def _swiglu_bulk(inputs: _Inputs, ws: _Workspace, blocks: int, cancel) -> bool:
    """The SwiGLU backward contract of stored d_act by the bulk-copy kernel on `blocks` blocks
    (one an SM: its stages take most of the shared memory), where the rows allow bulk copies
    (else False: nothing launched)."""
    gate, up = inputs.gate, inputs.up
    T, I = gate.shape
    acts = _Acts.of(inputs)
    rows = _swiglu_rows(I, _SWIGLU_STAGES)
    dg = acts.at(ws.acts, acts.dg)
    if not (I % 8 == 0 and acts.ld % 8 == 0 and rows >= 1 and all(
            _addr(a) % 16 == 0 for a in (ws.d_act, gate, up, dg))):
        return False
    _launch.launch(_build.load_module("sol080.cu"), "sol080_swiglu_backward_bulk", (min(blocks, T),), (512,),
                   [ptr(ws.d_act), ptr(gate), ptr(up), ptr(dg), i32(I), i32(T), i64(acts.ld), i32(rows),
                    i32(_SWIGLU_STAGES), ptr(cancel)],
                   shared_mem=_SWIGLU_STAGES * 3 * 2 * I * rows)
    return True


_ROUTER_WARPS = 8  # kRouterWarps in sol080.cu: tokens per block
# sol080_router_lanes' shapes: a routing slot a lane, 4 experts a lane (else sol080_router).
_ROUTER_LANES_MAX_K, _ROUTER_LANES_MAX_E = 32, 128
_ROUTER_MIN_BLOCKS = 6  # sol080.cu's own ROUTER_MIN_BLOCKS: its default module, no prelude
# A/B only: the router kernel's __launch_bounds__ blocks an SM (0: no minimum; _Plan.router_min_blocks).
ROUTER_MIN_BLOCKS = int(os.environ.get("CUPY_MOE_SOL080_ROUTER_MIN_BLOCKS", str(_ROUTER_MIN_BLOCKS)))


def _grl_at(inputs: _Inputs, ws: _Workspace, plan: _Plan):
    """Where the router kernel writes hi and lo: (row 0's hi, elements per row, lo's offset)."""
    if plan.wgrad_fused:
        acts = _Acts.of(inputs)
        return ws.acts, acts.ld, acts.lo  # hi at column 0
    E = inputs.wr.shape[0]
    return ws.grl, 2 * E, E


def _router_kernel(inputs: _Inputs, hi, ld: int, lo_offset: int, check_args,
                   min_blocks: int = _ROUTER_MIN_BLOCKS) -> None:
    """bf16(grl) and its remainder (steps 7-10): hi(t) at hi + t * ld, lo(t) lo_offset past it;
    and the top-k index check (check_args: its scratch and report,
    validate.topk_check_in_kernel; None when there are no rows). min_blocks: its launch bounds'
    blocks an SM (the plan's, so a graph keyed by the plan replays the kernel it names)."""
    a = inputs
    T, H = a.g.shape
    E, K = a.wr.shape[0], a.idx.shape[1]
    prelude = "" if min_blocks == _ROUTER_MIN_BLOCKS else f"#define ROUTER_MIN_BLOCKS {min_blocks}\n"
    lanes = K <= _ROUTER_LANES_MAX_K and E <= _ROUTER_LANES_MAX_E
    kernel = "sol080_router_lanes" if lanes else "sol080_router"
    _launch.launch(_build.load_module("sol080.cu", prelude), kernel, (cdiv(T, _ROUTER_WARPS),),
                   (32 * _ROUTER_WARPS,),
                   [ptr(a.g), ptr(a.tw), ptr(a.idx), ptr(a.mask), ptr(a.scores), i32(T), i32(H),
                    i32(E), i32(K), ptr(hi), i32(ld), i32(lo_offset)] + (check_args or [ptr(None), ptr(None)]))


def _grad_wd_gemm(inputs: _Inputs, grad_wd, plan: _Plan) -> dict:
    """grad_Wd = g^T act (step 2), or with plan.wd_transposed (act^T g)^T where the Hopper loop
    takes it (16-byte aligned rows)."""
    g, act = inputs.g, inputs.act
    T, H = g.shape
    I = act.shape[1]
    transposed = [Segment(act, I, g, H, k=T)]
    if plan.wd_transposed and transposed_applies(I, H, transposed, False, False, grad_wd, I):
        return dict(m=I, n=H, segments=transposed, a_kmajor=False, b_kmajor=False, out=grad_wd, ldc=I,
                    out_transposed=True)
    return dict(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False,
                out=grad_wd, ldc=I)


def _grad_wgu_gemm(inputs: _Inputs, grad_wgu, grad_router, ws: _Workspace, plan: _Plan) -> dict:
    """[grad_Wg; grad_Wu] = [d_gate | d_up]^T x (step 5) as one GEMM; with plan.wgrad_fused the
    router weight gradient (step 11) as its first E rows, in fp32: [hi | d_gate | d_up]^T x over
    all rows plus lo^T x over the router's (module doc)."""
    x = inputs.x
    T, H = x.shape
    acts = _Acts.of(inputs)
    common = dict(n=H, a_kmajor=False, b_kmajor=False, out=grad_wgu, ldc=H)
    if plan.wgrad_fused:
        return dict(common, m=acts.E + grad_wgu.shape[0], segments=acts.wgrad_segments(ws.acts, x, H, T),
                    f32_head=(grad_router, H, acts.E))
    return dict(common, m=grad_wgu.shape[0], segments=[Segment(acts.at(ws.acts, acts.dg), acts.ld, x, H, k=T)])


def _dgrad_gemm(inputs: _Inputs, grad_h, ws: _Workspace, plan: _Plan) -> dict:
    """grad_hidden_states (steps 6, 12) as one GEMM over the concatenated reduction [d_up |
    d_gate | bf16(grl)], or its split-K pieces for _finish_dgrad."""
    T, H = grad_h.shape
    hi, hi_ld, _ = _grl_at(inputs, ws, plan)
    segments = _Acts.of(inputs).dgrad_segments(ws.acts, hi, hi_ld, inputs.wu, inputs.wg, inputs.wr, H)
    common = dict(m=T, n=H, segments=segments, a_kmajor=True, b_kmajor=False, ldc=H, wide=plan.dgrad_wide,
                  band=plan.dgrad_band)
    if plan.dgrad_splits == 1 or plan.split_cluster:  # split: the pieces summed in the GEMM
        return dict(common, out=grad_h, k_splits=plan.dgrad_splits)
    return dict(common, out=ws.dgrad_pieces, epilogue="f32", k_splits=plan.dgrad_splits,
                c_group_stride=T * H)


def _finish_dgrad(grad_h, ws: _Workspace, plan: _Plan, cancel) -> None:
    if plan.dgrad_splits > 1 and not plan.split_cluster:
        n = grad_h.size
        chunks = n % 8 == 0 and _addr(ws.dgrad_pieces) % 16 == 0 and _addr(grad_h) % 16 == 0
        _launch.launch(_build.load_module("sol080.cu"), "sum_pieces_bf16",
                       (_elementwise_blocks(n, plan, chunks),), (256,),
                       [ptr(ws.dgrad_pieces), i32(plan.dgrad_splits), i64(n), ptr(grad_h), ptr(cancel)])


settings.watch(__name__)  # (_Plan.of keeps its plans until a setting changes)
