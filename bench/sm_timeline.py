"""Where a SOL-080 call leaves SMs idle: every block of every launch, on which SM, from when to when
(cuda_src/common/trace.cuh, compiled in by CUPY_MOE_TRACE=1, which this script sets before
anything is built). One traced call after warm-up (its CUDA graph replayed, as the benchmark's
calls are; L2 flushed first), then per launch its blocks, SMs and span, and for the call: how
many SMs were busy in each time slice, the idle SM time in all, and the stretches with no SM
busy at all.
With --layer, the same for the full layer's backward (moe_backward, eager) at each T, GLM-4.5-Air
unless --model names another MoEConfig (glm45, deepseek_v3).
Usage (device): PYTHONPATH=. python bench/sm_timeline.py [--bin 5] [--layer [--model M]] [--detail] [--tiles]
[--cfg FIELD=N ...] [T ...]   (default 1879 8192)"""
import argparse
import os

os.environ["CUPY_MOE_TRACE"] = "1"  # before cupy_moe builds a kernel

import numpy as np  # noqa: E402

RECORD = np.dtype([("grid", "<u8"), ("block", "<u4"), ("smid", "<u4"), ("start", "<u8"), ("end", "<u8")])


def traced_modules():
    from cupy_moe import _build

    return [(key, mod) for key, mod in _build._modules.items() if key[2].startswith(_build.TRACE_DEFINE)]


def _global(mod, name, dtype, count):
    import cupy as cp

    return cp.ndarray((count,), dtype, memptr=mod.get_global(name))


def reset():
    for _, mod in traced_modules():
        _global(mod, "cupy_moe_trace_count", np.uint32, 1).fill(0)
        _global(mod, "cupy_moe_tile_trace_count", np.uint32, 1).fill(0)


BLOCK_CAPACITY, TILE_CAPACITY = 1 << 18, 1 << 21  # trace.cuh kTraceCapacity, kTileTraceCapacity


def collect_tiles():
    """{grid id: tile records} of the Hopper GEMMs' tiles (trace.cuh TRACE_TILE_END; RECORD's
    layout, "block" holding the tile)."""
    tiles = {}
    for _, mod in traced_modules():
        n = int(_global(mod, "cupy_moe_tile_trace_count", np.uint32, 1).get()[0])
        if n == 0:
            continue
        if n > TILE_CAPACITY:
            print(f"(tile records: {n} written, the first {TILE_CAPACITY} kept: the last tiles are missing)")
            n = TILE_CAPACITY
        recs = _global(mod, "cupy_moe_tile_trace", np.uint8, n * RECORD.itemsize).get().view(RECORD)
        for grid in np.unique(recs["grid"]):
            tiles[int(grid)] = recs[recs["grid"] == grid]
    return tiles


EPILOGUE = 0x80000000  # trace.cuh kTraceEpilogue: a tile's epilogue record
FIRST_WAIT = 0x40000000  # kTraceFirstWait: main loop's start -> its first stage's data
DRAIN = 0x20000000  # kTraceDrain: last MMAs issued -> complete
PRODUCER_FIRST = 0x10000000  # kTraceProducerFirst: the producer's wait for a tile's first slot -> its issue
FLAGS = EPILOGUE | FIRST_WAIT | DRAIN | PRODUCER_FIRST


def _first_load(rec, kind):
    """us from the producer's issue of each tile's first stage to the consumers' having its data
    (the end of their wait0), tile by tile."""
    issue = {int(b) & ~FLAGS: int(e) for b, e in zip(rec["block"][kind == PRODUCER_FIRST],
                                                     rec["end"][kind == PRODUCER_FIRST])}
    got = [(int(e) - issue[int(b) & ~FLAGS]) / 1e3 for b, e in zip(rec["block"][kind == FIRST_WAIT],
                                                                   rec["end"][kind == FIRST_WAIT])
           if int(b) & ~FLAGS in issue]
    return np.array(got)


def _after_epilogues(main, epi):
    """us from each epilogue's end to the next main loop's start on the same SM (what a consumer
    spends between tiles outside both: the next tile's index, its coordinates, zeroing)."""
    gaps = []
    for sm in np.unique(epi["smid"]):
        starts = np.sort(main["start"][main["smid"] == sm].astype(np.int64))
        ends = epi["end"][epi["smid"] == sm].astype(np.int64)
        nxt = np.searchsorted(starts, ends)
        ok = nxt < len(starts)
        gaps.append((starts[nxt[ok]] - ends[ok]) / 1e3)
    return np.concatenate(gaps) if gaps else np.zeros(0)


def tile_detail(launches, tiles, t0):
    """Per GEMM launch: its tiles' main-loop times (quantiles, us), tiles per SM, and when each SM
    finished its last tile: whether a ragged end comes from uneven tile counts or uneven tiles.
    Then, per tile (medians, us; cooperative consumers: warpgroup 0's): the wait for the first
    stage's data and the last MMAs' drain (both inside the main loop's time), the epilogue and
    the time from it to the next tile's main loop; the producer's wait for a free slot for the
    tile's first stage ('slot') and the time from that stage's issue to the consumers' having it
    ('load')."""
    print(f"{'launch':<28}{'tiles':>6}{'tile us min/med/max':>22}{'per SM':>10}{'last end min/med/max':>24}"
          f"{'wait0':>7}{'drain':>7}{'epi':>7}{'after':>7}{'slot':>7}{'load':>7}")
    for name, r in sorted(launches, key=lambda l: int(l[1]["start"].min())):
        rec = tiles.get(int(r["grid"][0]))
        if rec is None:
            continue
        kind = rec["block"] & FLAGS
        tr, epi = rec[kind == 0], rec[kind == EPILOGUE]
        span = lambda v: (v["end"].astype(np.int64) - v["start"].astype(np.int64)) / 1e3
        wait0, drain = span(rec[kind == FIRST_WAIT]), span(rec[kind == DRAIN])
        slot, load = span(rec[kind == PRODUCER_FIRST]), _first_load(rec, kind)
        d = (tr["end"].astype(np.int64) - tr["start"].astype(np.int64)) / 1e3
        sms, count = np.unique(tr["smid"], return_counts=True)
        last = np.array([(tr["end"][tr["smid"] == sm].astype(np.int64).max() - t0) / 1e3 for sm in sms])
        q = lambda v, f: " ".join(format(x, f) for x in (v.min(), np.median(v), v.max()))
        e = (epi["end"].astype(np.int64) - epi["start"].astype(np.int64)) / 1e3
        after = _after_epilogues(tr, epi)
        med = lambda v: format(np.median(v), "7.2f") if len(v) else f"{'-':>7}"
        print(f"{name:<28}{len(tr):>6}{q(d, '6.1f'):>22}{q(count, '2.0f'):>10}{q(last, '7.1f'):>24}"
              f"{med(wait0)}{med(drain)}{med(e)}{med(after)}{med(slot)}{med(load)}")


def collect():
    """[(label, records)] per launch, labelled by entry file, tile width (GEMMs) and grid id."""
    import cupy as cp

    cp.cuda.Device().synchronize()
    launches = []
    for (_, entry, prelude), mod in traced_modules():
        n = min(int(_global(mod, "cupy_moe_trace_count", np.uint32, 1).get()[0]), BLOCK_CAPACITY)
        if n == 0:
            continue
        raw = _global(mod, "cupy_moe_trace", np.uint8, n * RECORD.itemsize).get()
        recs = raw.view(RECORD)
        name = entry.replace(".cu", "")
        if "BN = " in prelude:
            name += " BN=" + prelude.split("BN = ")[1].split(";")[0]
        for grid in np.unique(recs["grid"]):
            launches.append((name, recs[recs["grid"] == grid]))
    return launches


def block_detail(launches, t0):
    """Per launch, its blocks' start, end and duration quantiles (min / median / max, us): whether
    a launch is long because every block is, or because a few start late or run long."""
    print(f"{'launch':<28}{'start min/med/max':>22}{'end min/med/max':>22}{'dur med/max':>16}")
    for name, r in sorted(launches, key=lambda l: int(l[1]["start"].min())):
        s, e = (r["start"].astype(np.int64) - t0) / 1e3, (r["end"].astype(np.int64) - t0) / 1e3
        d = e - s
        q = lambda v: f"{v.min():6.1f}{np.median(v):7.1f}{v.max():7.1f}"
        print(f"{name:<28}{q(s):>22}{q(e):>22}{np.median(d):8.1f}{d.max():8.1f}")


def report(launches, sms, bin_us, detail=False, tiles=None):
    t0 = min(int(r["start"].min()) for _, r in launches)
    t1 = max(int(r["end"].max()) for _, r in launches)
    span = (t1 - t0) / 1e3
    print(f"call span {span:.1f} us over {sms} SMs; launches in start order:")
    print(f"{'launch':<28}{'blocks':>7}{'SMs':>5}{'start':>9}{'end':>9}{'SM-us':>9}")
    busy = [[] for _ in range(sms)]  # per SM: (start, end) of every block, us from t0
    for name, r in sorted(launches, key=lambda l: int(l[1]["start"].min())):
        s, e = (r["start"].astype(np.int64) - t0) / 1e3, (r["end"].astype(np.int64) - t0) / 1e3
        for sm, a, b in zip(r["smid"], s, e):
            busy[int(sm)].append((a, b))
        used = {int(x) for x in r["smid"]}
        own = sum(_union([(a, b) for sm, a, b in zip(r["smid"], s, e) if int(sm) == u]) for u in used)
        print(f"{name:<28}{len(r):>7}{len(used):>5}{s.min():>9.1f}{e.max():>9.1f}{own:>9.0f}")
    if detail:
        block_detail(launches, t0)
    if tiles:
        tile_detail(launches, tiles, t0)
    total = sum(_union(iv) for iv in busy)
    print(f"busy {total:.0f} of {sms * span:.0f} SM-us: {100 * (1 - total / (sms * span)):.1f}% idle "
          f"({sms * span - total:.0f} SM-us = {(sms * span - total) / sms:.1f} us of the whole GPU)")
    gaps = _idle_gaps(busy)
    print("no SM busy (>= 1 us): " + (", ".join(f"{a:.1f}-{b:.1f} ({b - a:.1f} us)" for a, b in gaps) or "never")
          + "  (a launch that is not programmatic, e.g. a library kernel, leaves such a gap: NOTES v0.29)")
    edges = np.arange(0.0, span + bin_us, bin_us)
    print(f"SMs busy per {bin_us:g} us slice (mean over the slice):")
    row = []
    for a in edges[:-1]:
        b = a + bin_us
        on = sum(_union([(max(x, a), min(y, b)) for x, y in iv if y > a and x < b]) for iv in busy)
        row.append(f"{a:6.0f}:{on / bin_us:5.0f}")
    for i in range(0, len(row), 8):
        print("  " + " ".join(row[i:i + 8]))


def _idle_gaps(busy, least=1.0):
    """The stretches of at least `least` us in which no SM runs a block (busy: per SM, its blocks'
    (start, end) in us)."""
    gaps, end = [], 0.0
    for a, b in sorted(x for sm in busy for x in sm):
        if a - end >= least:
            gaps.append((end, a))
        end = max(end, b)
    return gaps


def _union(intervals) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, -np.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.gpu.gemm import device_sms
    from cupy_moe.testing import make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=float, default=5.0)
    ap.add_argument("--layer", action="store_true")
    ap.add_argument("--model", default="glm45_air", help="with --layer: glm45_air, glm45 or deepseek_v3")
    ap.add_argument("--detail", action="store_true", help="per launch, its blocks' quantiles")
    ap.add_argument("--tiles", action="store_true", help="per GEMM, its tiles' times and counts")
    ap.add_argument("--cfg", action="append", default=[], metavar="FIELD=N",
                    help="an Sm90Config field forced on every Hopper GEMM (gemm.CONFIG_OVERRIDE; A/B of a scratch knob)")
    ap.add_argument("T", nargs="*", type=int, default=[1879, 8192])
    args = ap.parse_args()
    if args.cfg:
        from cupy_moe.gpu import gemm

        gemm.CONFIG_OVERRIDE = {k: int(v) for k, v in (kv.split("=") for kv in args.cfg)}
    flush = cp.empty(256 << 20, cp.uint8)
    if args.layer:
        from cupy_moe.testing import make_moe_inputs, make_grad_output

        cfg = getattr(cupy_moe.MoEConfig, args.model)()
        for T in args.T:
            _, ctx = cupy_moe.moe_forward(**make_moe_inputs(cfg, T, seed=0, xp=cp), config=cfg)
            dy = make_grad_output(cfg, T, seed=1, xp=cp)
            for _ in range(2):
                cupy_moe.moe_backward(dy, ctx)
            cp.cuda.Device().synchronize()
            flush.fill(1)
            reset()
            cupy_moe.moe_backward(dy, ctx)
            print(f"\n== layer backward T = {T}")
            report(collect(), device_sms(), args.bin, args.detail, args.tiles and collect_tiles())
        return
    for T in args.T:
        a = list(make_sol080_inputs(T, seed=T, xp=cp).values())
        for _ in range(3):  # eager, captured, replayed: the traced call is a replay
            cupy_moe.sol080_backward(*a)
        cp.cuda.Device().synchronize()
        flush.fill(1)
        reset()
        cupy_moe.sol080_backward(*a)
        print(f"\n== SOL-080 T = {T}")
        report(collect(), device_sms(), args.bin, args.detail, args.tiles and collect_tiles())


if __name__ == "__main__":
    main()
