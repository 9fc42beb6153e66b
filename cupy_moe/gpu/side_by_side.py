"""Two independent GEMMs at once, each persistent grid on its own share of the SMs.

A GEMM with fewer tiles than a few rounds of the SMs wastes its last round: the shared expert's
weight gradients at T = 8192 are 352 tiles ([dWsg; dWsu], 2.67 rounds of 132) and 176 (dWsd,
1.33), 3 + 2 rounds one after the other. Side by side on 88 + 44 SMs they take 4 rounds
together. The second GEMM runs on a side stream of the caller's, forked from it before and
joined into it after (events), so work on the caller's stream after side_by_side() waits for
both, as it would for two launches in a row.
"""
from __future__ import annotations

import cupy as cp

from .._launch import cdiv
from .gemm import device_sms, gemm, launch_tiles
from .streams import Side

# The least gain, in k-steps of 64 of a tile, worth a fork and a join (~4 us each way; a 128 x 256
# k-step takes ~0.6 us): tests set 0 to take the side-by-side path at small sizes.
MIN_GAIN_STEPS = 16


def split_sms(tiles: tuple, steps: tuple, sms: int) -> int:
    """The SMs of the first of two GEMMs side by side (the second takes the rest), such that the
    longer of the two takes the least time (rounds of tiles times the reduction steps of a tile),
    or 0 when that gains less than MIN_GAIN_STEPS over one after the other on every SM."""
    (ta, tb), (ka, kb) = tiles, steps
    if ta == 0 or tb == 0 or sms < 2:
        return 0
    apart = cdiv(ta, sms) * ka + cdiv(tb, sms) * kb
    best, split = min((max(cdiv(ta, c) * ka, cdiv(tb, sms - c) * kb), c) for c in range(1, sms))
    return split if apart - best >= max(1, MIN_GAIN_STEPS) else 0


def _steps(call: dict) -> int:
    return sum(cdiv(s.k, 64) for s in call["segments"])


def side_by_side(first: dict, second: dict) -> None:
    """gemm(**first) and gemm(**second), which must not read what the other writes, at once where
    that takes fewer rounds of tiles (split_sms), else one after the other. Either way the current
    stream's later work runs after both. Bits equal to the two calls in a row (a tile's
    reduction does not depend on the grid)."""
    sms = device_sms()
    split = split_sms((launch_tiles(**first), launch_tiles(**second)),
                      (_steps(first), _steps(second)), sms)
    if not split:
        gemm(**first)
        gemm(**second)
        return
    _forked(lambda: gemm(**first, max_ctas=split), lambda: gemm(**second, max_ctas=sms - split),
            ("fork", "join"))


# A memory-bound kernel beside a GEMM (beside()): what one SM moves and computes there at the
# layer's sizes under the power cap (bench/overlap_probe.py, traced layer calls; NOTES v0.23,
# v0.29): ~56 GB/s an SM for the row scatter on 41 SMs and the combine on 9; ~3.9 TFLOP/s an SM
# for the shared d_act (its SwiGLU epilogue) on 91, ~4.4 for a routed K-grouped weight gradient
# on 123 (K_GROUPED_FLOP_PER_SM_US: 756 GFLOP in 1400 us).
BYTES_PER_SM_US = 56e3
FLOP_PER_SM_US = 4e6
K_GROUPED_FLOP_PER_SM_US = 4.4e6
# The shortest kernel (us on all the SMs) worth a fork and a join (~4 us each way).
MIN_BESIDE_US = 20.0


def gemm_rate(call: dict) -> float:
    """FLOP an SM computes per us for a gemm() call's GEMM beside such a kernel (the rates above):
    a K-grouped weight gradient's, else the fused shared d_act's."""
    return K_GROUPED_FLOP_PER_SM_US if call.get("grouping") == "k" else FLOP_PER_SM_US


def free_sms(kernel_bytes: float, gemm_flop: float, sms: int, flop_per_sm_us: float = FLOP_PER_SM_US) -> int:
    """SMs to leave a memory-bound kernel of kernel_bytes beside a GEMM of gemm_flop (at
    flop_per_sm_us an SM), at most half of them: the count whose longer side ends first (the
    kernel's blocks also take the GEMM's SMs once it ends, but the GEMM's persistent CTAs cannot
    take the kernel's, so the nearer-equal split by rounding can leave the kernel a tail alone:
    the combine's 29 us at T = 8192 on 9 SMs, where 10 end with the GEMM); 0 when the kernel is
    too short to be worth it."""
    kernel, work = kernel_bytes / BYTES_PER_SM_US, gemm_flop / flop_per_sm_us  # SM-us each
    if kernel / sms < MIN_BESIDE_US or work <= 0:
        return 0
    return min(range(1, sms // 2 + 1), key=lambda free: (max(kernel / free, work / (sms - free)), free))


def beside(gemm_work, kernel, free: int) -> None:
    """gemm_work(sms), GEMM launches confined to `sms` SMs (0: all), on the current stream and
    kernel() on a side stream at once, `free` SMs left to the kernel (0: one after the other);
    they must not read what the other writes. The current stream's later work runs after both,
    and the bits are those of one after the other."""
    if free <= 0:
        gemm_work(0)
        kernel()
        return
    _forked(lambda: gemm_work(device_sms() - free), kernel, ("beside_fork", "beside_join"))


def _forked(on_main, on_side, names: tuple) -> None:
    """on_main() on the current stream, then on_side() on its side stream (names: the fork and
    join events), forked from it before and joined into it after. on_main's launches go first,
    so a persistent grid takes its SMs before the side's blocks do."""
    main = cp.cuda.get_current_stream()
    side = Side.of(main, names)
    fork, join = (getattr(side, n) for n in names)
    fork.record(main)
    side.stream.wait_event(fork)
    on_main()
    with side.stream:
        on_side()
        join.record()
    main.wait_event(join)
