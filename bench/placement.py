"""Where a persistent GEMM's CTAs sit, and whether it matters which SMs hold tiles that share an
operand (bench/NOTES.md v0.31: static tiles with neighbouring CTAs shuffled lost 8-11% at the
128 x 128 shapes, the L2 seeing 12-14% more requests for the same DRAM bytes).
1. The GPC map: thread-block clusters (every CTA of a cluster sits in one GPC) of 16, 8, 4 and 2
   CTAs, one CTA an SM, their SM ids joined into GPCs; and the SM each blockIdx of a plain
   132-CTA launch lands on (three launches).
2. One GEMM per shape (claims_cost.problems), static, in these orders, interleaved over --rounds, L2
   flushed, median of --reps (us), each bit for bit against the first: the plain order, its
   neighbouring CTAs shuffled, bands of 2, 4 and 8 row tiles (Sm90Config.BAND_M), and claims
   (gemm(dynamic=True)). --hog N:US times each mode again while N SMs stay busy on another stream
   for US us from the launch (CTAs that start late: where claims pay).
(v0.31, H200: blockIdx 8-119 fill GPCs of 16 SMs in turn, so the plain order already gives a GPC
consecutive tiles; a table that ordered CTAs by their SM's GPC timed the same and was dropped.)
Usage (device): PYTHONPATH=. python bench/placement.py [--reps 20] [--rounds 2] [--shapes ...]"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402
from claims_cost import problems  # noqa: E402

PROBE = r"""
extern "C" __global__ void where(unsigned* out) {
  unsigned sm, cid, rank;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    out[3 * blockIdx.x] = sm; out[3 * blockIdx.x + 1] = cid; out[3 * blockIdx.x + 2] = rank;
  }
  const long long t0 = clock64();
  while (clock64() - t0 < 100000) {}  // hold the SM, so that the grid's CTAs are resident together
}
extern "C" __global__ void hog(long long cycles) {  // one CTA an SM (its shared memory), busy a while
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
"""
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute


def gpc_map(cp, sms):
    """(list of GPCs as sorted SM-id lists, [blockIdx -> SM] of three plain launches)."""
    from cupy.cuda import driver

    from cupy_moe import _launch

    mod = cp.RawModule(code=PROBE, options=("-arch=sm_90a",))
    smem = 200 * 1024  # one CTA an SM
    parent = list(range(sms))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def run(grid, cluster):
        out = cp.full(3 * grid, 0xFFFFFFFF, cp.uint32)
        _launch.launch(mod, "where", (grid,), (32,), [_launch.ptr(out)], smem, cluster=cluster)
        cp.cuda.Device().synchronize()
        return out.get().reshape(grid, 3)

    fn = _launch._function(mod, "where", smem)
    driver.funcSetAttribute(fn, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    for cluster in (16, 8, 4, 2, 16, 8, 4, 2):
        grid = sms // cluster * cluster
        try:
            rec = run(grid, cluster)
        except Exception as e:  # (a size the GPU cannot place)
            print(f"cluster {cluster}: {type(e).__name__} {e}")
            continue
        for c in np.unique(rec[:, 1]):
            members = rec[rec[:, 1] == c, 0]
            for s in members[1:]:
                parent[find(int(s))] = find(int(members[0]))
    groups = {}
    for s in range(sms):
        groups.setdefault(find(s), []).append(s)
    plain = [run(sms, 1)[:, 0].tolist() for _ in range(3)]
    return sorted(groups.values()), plain, mod


def main():
    import cupy as cp

    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import device_sms

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shapes", default="wd8192,act8192,wd2053,act2053")
    ap.add_argument("--modes", default="", help="a comma list of the modes to run (default: all)")
    ap.add_argument("--hog", default="", help="N:US also times each mode while N SMs stay busy for "
                    "US us from the GEMM's launch on (a kernel on another stream), its CTAs starting late")
    args = ap.parse_args()
    sms = device_sms()
    gpcs, plain, probe = gpc_map(cp, sms)
    print(f"{len(gpcs)} GPCs, sizes {[len(g) for g in gpcs]}")
    for g in gpcs:
        print("  GPC:", g)
    gpc_of = {s: i for i, g in enumerate(gpcs) for s in g}
    for launch in plain:
        print("blockIdx -> SM:", launch)
        print("blockIdx -> GPC:", [gpc_of[s] for s in launch])
    measure = timer(args.reps)
    hogged = None
    if args.hog:
        from cupy_moe import _launch

        n_hog, us = (float(v) for v in args.hog.split(":"))
        side, ready = cp.cuda.Stream(non_blocking=True), cp.cuda.Event()
        lead_ms = 0.02  # the main stream spins this long after the flush, so the hog's CTAs land first

        def hog(flush):
            flush.fill(1.0)
            ready.record()
            side.wait_event(ready)
            with side:
                _launch.launch(probe, "hog", (int(n_hog),), (32,), [_launch.i64((us / 1e3 + lead_ms) * 2e9 / 1e3)],
                               200 * 1024)

        hog_measure = timer(args.reps, hold_ms=lead_ms)
        hogged = lambda fn: hog_measure(fn, before=hog)
    modes = [("static", {}), ("shuffled", {"STATIC_SHUFFLE": True}), ("band2", {"BAND_M": 2}),
             ("band4", {"BAND_M": 4}), ("band8", {"BAND_M": 8}), ("claims", {"DYNAMIC": True})]
    if args.modes:
        modes = [m for m in modes if m[0] in args.modes.split(",")]
    made = problems(cp, args.shapes.split(","))
    times = {(s, m): [] for s in made for m, _ in modes}
    hog_times = {(s, m): [] for s in made for m, _ in modes}
    for r in range(args.rounds):
        for name, (kw, out) in made.items():
            first = None
            order_ = modes if r % 2 == 0 else modes[::-1]
            for mode, override in order_:
                dynamic = override.get("DYNAMIC", False)
                G.CONFIG_OVERRIDE = {k: v for k, v in override.items() if k != "DYNAMIC"}
                run = lambda: G.gemm(dynamic=dynamic, **kw)
                out.fill(np.nan)
                run()
                bits = out.view(cp.uint16).copy()
                if first is None:
                    first = bits
                elif not bool((bits == first).all()):
                    print(f"{name} {mode}: NOT the bits of {order_[0][0]} (not timed)")
                    times[name, mode].append(float("nan"))
                    continue
                times[name, mode].append(measure(run))
                if hogged:
                    hog_times[name, mode].append(hogged(run))
                out.fill(np.nan)  # (claims' counters left as they must be after every launch)
                run()
                if not bool((out.view(cp.uint16) == first).all()):
                    print(f"{name} {mode}: NOT the bits after the timed launches")
    G.CONFIG_OVERRIDE = {}
    for title, table_ in (("", times), (f" with {args.hog} (N SMs : us) busy from the launch", hog_times)):
        if not all(table_.values()):
            continue
        print(f"{'shape':>10} " + " ".join(f"{m:>10}" for m, _ in modes) + f"   (us, median of rounds' medians){title}")
        for name in made:
            row = [float(np.median(table_[name, m])) for m, _ in modes]
            print(f"{name:>10} " + " ".join(f"{v:10.1f}" for v in row))
            print(f"{'':>10} " + " ".join(f"{100 * (v / row[0] - 1):+9.1f}%" for v in row))


if __name__ == "__main__":
    main()
