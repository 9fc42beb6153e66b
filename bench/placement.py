"""Where a persistent GEMM's CTAs sit, and whether it matters which SMs hold tiles that share an
operand (bench/NOTES.md v0.31: static tiles with neighbouring CTAs shuffled lost 8-16% at the
128 x 128 shapes, the L2 seeing 12-14% more requests for the same DRAM bytes).
1. The GPC map: thread-block clusters (every CTA of a cluster sits in one GPC) of 16, 8, 4 and 2
   CTAs, one CTA an SM, their SM ids joined into GPCs; and the SM each blockIdx of a plain
   132-CTA launch lands on (three launches).
2. One GEMM per shape (problems()), static, in these orders, interleaved over --rounds, L2
   flushed, median of --reps (us), each bit for bit against the first: the plain order, its
   neighbouring CTAs shuffled, bands of 2, 4 and 8 row tiles (Sm90Config.BAND_M), and claims
   (gemm(dynamic=True)). --hog N:US times each mode again while N SMs stay busy on another stream
   for US us from the launch (CTAs that start late: where claims pay).
(v0.31, H200: blockIdx 8-119 fill GPCs of 16 SMs in turn, so the plain order already gives a GPC
consecutive tiles; a table that ordered CTAs by their SM's GPC timed the same and was dropped.)
What claims cost one GEMM: `--modes static,shuffled,claims` (v0.31's claims_cost.py, folded in here).
Usage (device): PYTHONPATH=. python bench/placement.py [--reps 20] [--rounds 2] [--shapes ...]
[--modes static,claims,...] [--hog N:US]"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402

H, I, E = 4096, 1408, 128


def problems(cp, names):
    """name -> (gemm() keywords, output array): grad_Wd = g^T act (wdT), d_act with the fused SwiGLU
    contract (actT), the dgrad-like dense product (dgT: [T, 2I + E] x [2I + E, H]), grad_[Wg; Wu]
    (wguT: [T, 2I]^T x [T, H]) and the layer's M-grouped routed dgrad (mgrouped: 128 experts,
    65536 balanced rows, N = 4096, K = 2816)."""
    from cupy_moe import bfloat16
    from cupy_moe.gpu.gemm import Segment, SwigluBackward

    rng = cp.random.default_rng(31)
    bf = lambda *s: (rng.standard_normal(s, dtype=cp.float32) * 0.5).astype(bfloat16)
    made = {}
    for name in names:
        kind, T = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):] or 0)
        if kind in ("wd", "wdpp"):  # (wdpp: on ping-pong consumers, as SOL-080 runs it up to T = 4096)
            g, act, out = bf(T, H), bf(T, I), cp.empty((H, I), bfloat16)
            kw = dict(m=H, n=I, segments=[Segment(g, H, act, I, k=T)], a_kmajor=False, b_kmajor=False,
                      out=out, ldc=I, pingpong=kind == "wdpp")
        elif kind == "act":
            g, wd, gate, up = bf(T, H), bf(H, I), bf(T, I), bf(T, I)
            out = cp.empty((T, 2 * I), bfloat16)
            kw = dict(m=T, n=I, segments=[Segment(g, H, wd, I, k=H)], a_kmajor=True, b_kmajor=False,
                      out=None, ldc=I, epilogue="swiglu_backward", engine="sm90",
                      swiglu=SwigluBackward(gate=gate, up=up, dg=out, du=out.data.ptr + 2 * I,
                                            ld_grad=2 * I, contract_rounding=True))
        elif kind == "dg":
            K = 2 * I + E
            a, w, out = bf(T, K), bf(K, H), cp.empty((T, H), bfloat16)
            kw = dict(m=T, n=H, segments=[Segment(a, K, w, H, k=K)], a_kmajor=True, b_kmajor=False,
                      out=out, ldc=H)
        elif kind == "wgu":
            a, x, out = bf(T, 2 * I), bf(T, H), cp.empty((2 * I, H), bfloat16)
            kw = dict(m=2 * I, n=H, segments=[Segment(a, 2 * I, x, H, k=T)], a_kmajor=False,
                      b_kmajor=False, out=out, ldc=H)
        elif kind == "mgrouped":
            G, rows, K, N = 128, 65536, 2 * I, H
            offs = cp.asarray(np.arange(G + 1, dtype=np.int32) * (rows // G))
            a, w, out = bf(rows, K), bf(G, K, N), cp.empty((rows, N), bfloat16)
            kw = dict(m=rows, n=N, segments=[Segment(a, K, w, N, k=K, b_group_stride=K * N)],
                      a_kmajor=True, b_kmajor=False, out=out, ldc=N, grouping="m", group_offsets=offs,
                      num_groups=G)
        else:
            raise SystemExit(f"unknown shape {name}")
        made[name] = (kw, out)
    return made


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
