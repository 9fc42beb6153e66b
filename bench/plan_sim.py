"""A model of one SOL-080 call's SMs, to weigh a plan before building it (bench/persistent_plan.md).

Two ways to run a call's tiles on 132 SMs, from tile times measured by `sm_timeline.py --tiles`:
- launches(): today's plan. Each launch is a persistent grid on a stream; it starts when the
  launches it waits for have completed, plus ~1 us behind the launch before it on its own stream (a
  programmatic edge) or ~3.2 us when any of them is on the other stream (the graph's cross-branch
  cost, bench/NOTES.md v0.12 / v0.33). Its CTAs take free SMs in the order launches became ready
  (a CTA holds a whole SM; router blocks share an SM, `per_sm` at a time), each CTA walking its
  static tiles (i, i + grid, ...) or claiming the next one.
- queue(): one persistent kernel, one CTA an SM, taking tiles from one ordered queue. A tile waits
  (its SM idle) until the tiles it depends on are done: rows of d_act before the dgrad's row
  block, columns of d_act before grad_[Wg; Wu]'s rows, the router before anything that reads grl.

Both give the call's span and the SMs' idle time; calibrate with launches() against a traced
call before believing queue(). Tile times come from one traced call: concurrency's effect on them
(L2, clocks) is what it was there. Session 33 (bench/NOTES.md v0.33): today's plan modelled at
804.0 / 226.7 us against 814.2 / 232.6 traced (T = 8192 / 2053); one queue 777.7 at 8192 (d_act's
rows, then the dgrad's, then grad_[Wg; Wu]; the router as SM-efficient as today's 8 blocks an SM)
and 230.2 at 2053: no better there.
Usage (CPU): python bench/plan_sim.py"""
from __future__ import annotations

import argparse
import heapq
from dataclasses import dataclass, field

SMS = 132
PDL_US, CROSS_US = 1.0, 3.2  # launch start after its dependencies (same stream / across streams)


@dataclass
class Launch:
    name: str
    stream: str
    tiles: list            # tile durations (us) in tile order
    grid: int              # CTAs (GEMM) or blocks (router)
    claims: bool = False   # tiles claimed as CTAs go (else static i, i + grid, ...)
    per_sm: int = 1        # blocks an SM holds at once (a GEMM CTA holds it whole)
    after: list = field(default_factory=list)  # launches whose completion it waits for
    extra_us: float = 0.0  # a CTA's time outside its tiles (set-up, last epilogue)


def launches(plan: list, sms: int = SMS):
    """Simulate a plan's launches (in enqueue order, which the plans modelled here also become
    ready in); returns (span, idle SM-us, {name: (first start, completion)})."""
    done, spans, stream_last, streams = {}, {}, {}, {L.name: L.stream for L in plan}
    free = [0.0] * sms  # when each SM's occupants leave
    busy = 0.0
    for L in plan:
        prev = stream_last.get(L.stream)
        deps = list(L.after) + ([prev] if prev else [])
        cross = any(streams[d] != L.stream for d in deps)
        ready = max((done[d] for d in deps), default=0.0) + ((CROSS_US if cross else PDL_US) if deps else 0.0)
        stream_last[L.stream] = L.name
        slots = sorted((max(f, ready), sm) for sm, f in enumerate(free))
        if L.per_sm > 1:  # blocks sharing SMs: the `grid` SMs free first, per_sm blocks on each
            heap = [slot for slot in slots[:L.grid] for _ in range(L.per_sm)]
            heapq.heapify(heap)
            for d in L.tiles:
                t0, sm = heapq.heappop(heap)
                heapq.heappush(heap, (t0 + d, sm))
                busy += d / L.per_sm
            for t1, sm in heap:
                free[sm] = max(free[sm], t1)
            first, last = slots[0][0], max(t for t, _ in heap)
        else:
            ctas = slots[:min(L.grid, len(L.tiles))]
            if L.claims:
                heap = list(ctas)
                heapq.heapify(heap)
                for d in L.tiles:
                    t0, sm = heapq.heappop(heap)
                    heapq.heappush(heap, (t0 + d, sm))
                    busy += d
                ends = [(t + L.extra_us, sm) for t, sm in heap]
            else:
                ends = []
                for c, (t0, sm) in enumerate(ctas):
                    work = sum(L.tiles[c::len(ctas)])
                    busy += work
                    ends.append((t0 + work + L.extra_us, sm))
            for t1, sm in ends:
                free[sm] = t1
            first, last = ctas[0][0], max(t for t, _ in ends)
        done[L.name] = last
        spans[L.name] = (first, last)
    span = max(done.values())
    return span, sms * span - busy, spans


def queue(durations: list, deps: dict, sms: int = SMS):
    """One persistent kernel: tile i takes durations[i] us, in queue order; deps[i] = the tiles that
    must be done before it starts. Each SM takes the next tile when it is free and waits for that
    tile's dependencies. Returns (span, idle SM-us)."""
    free = [(0.0, sm) for sm in range(sms)]
    heapq.heapify(free)
    end = [0.0] * len(durations)
    for i, d in enumerate(durations):
        t0, sm = heapq.heappop(free)
        end[i] = max([t0] + [end[j] for j in deps.get(i, ())]) + d
        heapq.heappush(free, (end[i], sm))
    span = max(end)
    return span, sms * span - sum(durations)


class Queue:
    """A queue being built: tiles in order, each with the tiles it waits for."""

    def __init__(self):
        self.tiles, self.deps = [], {}

    def add(self, duration: float, need=()) -> int:
        self.deps[len(self.tiles)] = list(need)
        self.tiles.append(duration)
        return len(self.tiles) - 1

    def run(self):
        return queue(self.tiles, self.deps)


def t8192():
    """T = 8192 as session 33's trace saw it (bench/NOTES.md v0.33): each GEMM's SM-us over its
    tiles (a tile's main loop plus its share of the epilogues and gaps: grad_Wd 47.0, d_act 25.8,
    the dgrad 31.8, grad_[Wg; Wu] 83.2 and its 16 router-row tiles twice that); the router's 1024
    blocks 8 to an SM (2145 SM-us on 16 SMs: ~16.8 us a block)."""
    return [Launch("grad_Wd", "main", [47.0] * 352, 118),
            Launch("router", "side", [16.8] * 1024, 16, per_sm=8),
            Launch("d_act", "main", [25.8] * 704, 132),
            Launch("wgu", "side", [166.4] * 16 + [83.2] * 352, 132, claims=True, after=["d_act"]),
            Launch("dgrad", "main", [31.8] * 1024, 132, after=["router"])], 814.2


def t2053():
    """T = 2053 as session 33's trace saw it: SM-us per tile (d_act 27.7, grad_Wd 13.5, the
    dgrad 32.0, grad_[Wg; Wu] 23.3, the router wgrad's cluster CTAs 18.6 each); the router's 257
    blocks in one wave on 38 SMs (~28 us each)."""
    return [Launch("d_act", "main", [27.7] * 187, 94),
            Launch("router", "side", [28.0] * 257, 38, per_sm=8),
            Launch("grad_Wd", "side", [13.5] * 352, 132, claims=False),
            Launch("dgrad", "main", [32.0] * 272, 132, after=["router"]),
            Launch("wgu", "side", [23.3] * 352, 132, claims=True, after=["d_act"]),
            Launch("router_wgrad", "main", [18.6] * 64, 64)], 232.6


def queue_2053(router_factor: float):
    """The same tiles in one queue: the router first, d_act's rows, grad_Wd, the dgrad's rows,
    grad_[Wg; Wu], the router wgrad (its 64 pieces need every router row)."""
    q = Queue()
    router = [q.add(902 * router_factor / 22) for _ in range(22)]  # 96 tokens a tile
    rows = [[q.add(27.7) for _ in range(11)] for _ in range(17)]
    every_row = [i for row in rows for i in row]
    for _ in range(352):
        q.add(13.5)
    for r in range(17):
        for _ in range(16):
            q.add(32.0, rows[r] + router)
    for _ in range(352):
        q.add(23.3, every_row + router)
    for _ in range(64):
        q.add(18.6, router)
    return q.run()


def queue_8192(order: str, router_factor: float):
    """The same tiles in one queue. router_factor: the router's SM-us against today's (its blocks
    share an SM 8 at a time now; a 384-thread CTA holds 12 warps, so at the same latency per token
    it would take ~5x the SM time). order: what follows d_act's rows: "dgrad" (the dgrad's row
    blocks, then grad_[Wg; Wu]), "wgu" (grad_[Wg; Wu] first), or "mixed" (a grad_[Wg; Wu] tile
    after every 3 dgrad tiles)."""
    q = Queue()
    router = [q.add(2145 * router_factor / 86) for _ in range(86)]  # 96 tokens a tile
    for _ in range(352):
        q.add(47.0)
    rows = [[q.add(25.8) for _ in range(11)] for _ in range(64)]
    every_row = [i for row in rows for i in row]
    wgu = [(166.4 if k < 16 else 83.2, every_row + router) for k in range(368)]
    dgrad = [(31.8, rows[r] + router) for r in range(64) for _ in range(16)]
    if order == "dgrad":
        seq = dgrad + wgu
    elif order == "wgu":
        seq = wgu + dgrad
    else:
        seq, w = [], 0
        for i, t in enumerate(dgrad):
            seq.append(t)
            if i % 3 == 2 and w < len(wgu):
                seq.append(wgu[w])
                w += 1
        seq += wgu[w:]
    for d, need in seq:
        q.add(d, need)
    return q.run()


def show_launches(T: int, plan: list, traced: float) -> None:
    span, idle, spans = launches(plan)
    print(f"T = {T}, today's launches: model {span:.1f} us (traced {traced}), idle {idle / SMS:.1f} us of the GPU")
    for name, (a, b) in spans.items():
        print(f"  {name:<12} {a:7.1f} - {b:7.1f}")


def main():
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    show_launches(8192, *t8192())
    for factor in (1.0, 5.0):
        for order in ("dgrad", "wgu", "mixed"):
            span, idle = queue_8192(order, factor)
            print(f"one queue, router x{factor:g}, then {order:<5}: {span:7.1f} us, idle {idle / SMS:5.1f} us of the GPU")
    print()
    show_launches(2053, *t2053())
    for factor in (1.0, 5.0):
        span, idle = queue_2053(factor)
        print(f"one queue, router x{factor:g}: {span:7.1f} us, idle {idle / SMS:5.1f} us of the GPU")


if __name__ == "__main__":
    main()
