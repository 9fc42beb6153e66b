"""The benchmark: SOL-080 workloads and the full layer's backward and forward, next to peers in the same run.

Method (../shared/perf/anchors.md): CUDA events around the public call as a user makes it, L2
flushed (a 256 MiB write) before each timed call, median of --reps (>= 20), warm-up first.
Peers: a cuBLAS-composed CuPy version of the same math (cupy.matmul for every GEMM, a loop over
experts for the routed part) and, where PyTorch imports, the same with torch.
The GEMM table times the engine itself (cupy_moe.gpu.gemm) at the layer's shapes against
cupy.matmul (cuBLAS) and torch._grouped_mm, and the portable main loop for reference.
Usage: PYTHONPATH=. python bench/benchmark.py [--gemm] [--sol080] [--layer] [--forward] [--reps 20]
       [--T 4096,8192] [--model glm45_air|glm45|deepseek_v3]   (the layer tables' MoEConfig; GLM-4.5-Air
       by default; --forward: moe_forward against the same forward in PyTorch, routing included)
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

PEAK_FLOPS = 989e12        # datasheet bf16 dense
PEAK_BYTES = 4.8e12        # datasheet HBM3e
MEAS_FLOPS = 789e12        # measured cuBLAS ceiling (anchors.md)
MEAS_BYTES = 4.22e12


def timer(reps, hold_ms=0.0):
    """measure(fn): the median of reps CUDA-event times of fn, each after an L2 flush (or after
    before(flush), where given). hold_ms > 0: each call queues up behind a spin kernel of that
    length, so the events time the GPU alone, not the host's launches (bench/spin.py)."""
    import cupy as cp

    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    if hold_ms:
        from spin import hold_gpu

    def measure(fn, warmup=3, before=None):
        for _ in range(warmup):
            fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            if before is None:
                flush.fill(1.0)
            else:
                before(flush)
            if hold_ms:
                hold_gpu(hold_ms)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
        return statistics.median(times)

    return measure


def machine_ceilings(reps):
    """This machine's two measured ceilings, as anchors.md measured them (an 8192^3 bf16 product
    through cupy.matmul on random data, a 2 GiB device-to-device copy counting bytes read and
    written), timed like the rest: H200s differ by ~3% (bench/NOTES.md v0.38), most under the
    power cap, so a table's absolute times come with the machine's own rates. Their 2.8 GiB of
    operands go back to the device before the tables run."""
    import cupy as cp

    measure = timer(reps)
    flops, bytes_per_s = _matmul_rate(measure, 8192), _copy_rate(measure, 2 ** 31)
    cp.get_default_memory_pool().free_all_blocks()
    print(f"\nThis machine: cuBLAS bf16 8192^3 {flops / 1e12:.0f} TFLOP/s (anchors.md: 789), device "
          f"copy {bytes_per_s / 1e12:.2f} TB/s (4.22)")
    return flops, bytes_per_s


def _matmul_rate(measure, n):
    import cupy as cp

    from cupy_moe import bfloat16

    a = cp.random.standard_normal((n, n), cp.float32).astype(bfloat16)
    b = cp.random.standard_normal((n, n), cp.float32).astype(bfloat16)
    return 2 * n ** 3 / measure(lambda: cp.matmul(a, b)) * 1e6


def _copy_rate(measure, nbytes):
    import cupy as cp

    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    return 2 * nbytes / measure(lambda: dst.__setitem__(Ellipsis, src)) * 1e6


# ---------------------------------------------------------------- GEMM engine
def _grouped_mm():
    try:
        import torch
        return torch, torch._grouped_mm
    except Exception:
        return None


def gemm_table(reps):
    import cupy as cp

    from cupy_moe import bfloat16
    from cupy_moe.gpu.gemm import Segment, gemm

    measure = timer(reps)
    rng = np.random.default_rng(0)
    tg = _grouped_mm()

    def rand(*shape):
        return cp.random.standard_normal(shape, dtype=cp.float32).astype(bfloat16)

    print(f"\nGEMM engine; TFLOP/s (median of {reps}, L2 flushed); peers in the same run")
    print(f"{'case':<44} {'ours':>7} {'mma.sync':>8} {'cuBLAS':>7} {'torch':>7} {'x peer':>7}")

    def row(name, flops, ours, mma, peer, torch_t=float("nan")):
        t_o, t_m, t_p = measure(ours), measure(mma), measure(peer) if peer else float("nan")
        peers = [t for t in (t_p, torch_t) if not np.isnan(t)]
        best = min(peers) if peers else float("nan")
        tf = lambda t: flops / t / 1e6
        print(f"{name:<44} {tf(t_o):7.1f} {tf(t_m):8.1f} {tf(t_p):7.1f} {tf(torch_t):7.1f} "
              f"{best / t_o:7.2f}")

    # Dense, the layer's shapes: (M, N, K, A K-major?, B K-major?)
    for M, N, K, ak, bk in ((8192, 4096, 2944, True, False), (8192, 1408, 4096, True, False),
                            (8192, 2816, 4096, True, True), (4096, 1408, 8192, False, False),
                            (2048, 4096, 4096, True, True)):
        A = rand(M, K) if ak else rand(K, M)
        B = rand(N, K) if bk else rand(K, N)
        C = cp.empty((M, N), bfloat16)
        Av = A if ak else A.T
        Bv = B.T if bk else B
        seg = [Segment(A, A.shape[1], B, B.shape[1], k=K)]
        run = lambda e: (lambda: gemm(m=M, n=N, segments=seg, a_kmajor=ak, b_kmajor=bk, out=C,
                                      ldc=N, engine=e))
        row(f"dense {M}x{N}x{K} A{'K' if ak else 'M'} B{'K' if bk else 'N'}", 2 * M * N * K,
            run("sm90"), run("mma"), lambda: cp.matmul(Av, Bv))

    # Grouped, T = 8192, K = 8: 65536 routed rows over 128 experts.
    E, rows, Hd, Nd = 128, 65536, 4096, 2816
    for skew in ("balanced", "zipf"):
        p = np.ones(E) if skew == "balanced" else 1.0 / np.arange(1, E + 1)
        sizes = rng.multinomial(rows, p / p.sum())
        offs = cp.asarray(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
        X, W = rand(rows, Hd), rand(E, Nd, Hd)
        C = cp.empty((rows, Nd), bfloat16)
        seg = [Segment(X, Hd, W, Hd, k=Hd, b_group_stride=Nd * Hd)]
        run = lambda e: (lambda: gemm(m=rows, n=Nd, segments=seg, a_kmajor=True, b_kmajor=True,
                                      out=C, ldc=Nd, grouping="m", group_offsets=offs,
                                      num_groups=E, engine=e))
        t_torch = float("nan")
        if tg:
            torch, gmm = tg
            tX, tW = torch.from_dlpack(X), torch.from_dlpack(W).transpose(1, 2)
            tof = torch.from_dlpack(offs[1:])
            try:
                t_torch = measure(lambda: gmm(tX, tW, offs=tof))
            except Exception as exc:  # pragma: no cover - depends on the torch build
                print(f"  torch._grouped_mm unavailable: {exc}")
        row(f"M-grouped {rows}x{Nd}x{Hd} E={E} {skew}", 2 * rows * Nd * Hd, run("sm90"),
            run("mma"), None, t_torch)
        # K-grouped weight gradients at the same routing: [2816 x 4096] and [4096 x 1408] per expert.
        for m_, n_ in ((Nd, Hd), (Hd, Nd // 2)):
            A, B = rand(rows, m_), rand(rows, n_)
            C = cp.empty((E, m_, n_), bfloat16)
            seg = [Segment(A, m_, B, n_, k=rows)]
            run = lambda e: (lambda: gemm(m=m_, n=n_, segments=seg, a_kmajor=False, b_kmajor=False,
                                          out=C, ldc=n_, c_group_stride=m_ * n_, grouping="k",
                                          group_offsets=offs, num_groups=E, engine=e))
            t_torch = float("nan")
            if tg:
                torch, gmm = tg
                tA, tB = torch.from_dlpack(A).t(), torch.from_dlpack(B)
                tof = torch.from_dlpack(offs[1:])
                try:
                    t_torch = measure(lambda: gmm(tA, tB, offs=tof))
                except Exception as exc:  # pragma: no cover
                    print(f"  torch._grouped_mm (K-grouped) unavailable: {exc}")
            row(f"K-grouped {m_}x{n_} per expert, {skew}", 2 * rows * m_ * n_, run("sm90"),
                run("mma"), None, t_torch)
            if n_ % 256:  # the layer's dWd: C^T = B^T A per expert in 128 x 256 tiles, stored
                # transposed (gemm(out_transposed)), so no column tile is half empty
                seg_t = [Segment(B, n_, A, m_, k=rows)]
                run_t = lambda: gemm(m=n_, n=m_, segments=seg_t, a_kmajor=False, b_kmajor=False,
                                     out=C, ldc=n_, c_group_stride=m_ * n_, grouping="k",
                                     group_offsets=offs, num_groups=E, out_transposed=True)
                row(f"K-grouped {m_}x{n_} per expert, {skew}, as C^T", 2 * rows * m_ * n_, run_t,
                    run("mma"), None, t_torch)
        if skew == "balanced":  # the layer's gathered forms: token rows read through sorted slots
            T = rows // 8
            slots = cp.asarray(rng.permutation(rows).astype(np.int32))
            Xt = rand(T, Hd)
            C = cp.empty((rows, Nd), bfloat16)
            seg = [Segment(Xt, Hd, W, Hd, k=Hd, b_group_stride=Nd * Hd)]
            run = lambda e: (lambda: gemm(m=rows, n=Nd, segments=seg, a_kmajor=True, b_kmajor=True,
                                          out=C, ldc=Nd, grouping="m", group_offsets=offs,
                                          num_groups=E, gather_a=slots, gather_div=8, engine=e))
            row(f"M-grouped {rows}x{Nd}x{Hd} gathered A", 2 * rows * Nd * Hd, run("sm90"),
                run("mma"), None)
            B = rand(rows, Nd // 2)
            C = cp.empty((E, Hd, Nd // 2), bfloat16)
            seg = [Segment(Xt, Hd, B, Nd // 2, k=rows)]
            run = lambda e: (lambda: gemm(m=Hd, n=Nd // 2, segments=seg, a_kmajor=False,
                                          b_kmajor=False, out=C, ldc=Nd // 2,
                                          c_group_stride=Hd * Nd // 2, grouping="k",
                                          group_offsets=offs, num_groups=E, gather_a=slots,
                                          gather_div=8, engine=e))
            row(f"K-grouped {Hd}x{Nd // 2} per expert, gathered A", 2 * rows * Hd * Nd // 2,
                run("sm90"), run("mma"), None)
        del X, W, A, B, C


# ---------------------------------------------------------------- SOL-080
def sol080_cupy_peer(g, x, wr, bias, logits, scores, idx, tw, mask, wg, wu, wd, gate, up, act):
    import cupy as cp
    from cupy_moe import bfloat16

    f32 = cp.float32
    K = idx.shape[1]
    d_act = g @ wd
    grad_wd = g.T @ act
    gf, uf, daf = gate.astype(f32), up.astype(f32), d_act.astype(f32)
    t = (daf * uf).astype(bfloat16).astype(f32)
    sig = 1 / (1 + cp.exp(-gf))
    d_up = (daf * (gf * sig).astype(bfloat16).astype(f32)).astype(bfloat16)
    d_gate = (t * sig * (1 + gf * (1 - sig))).astype(bfloat16)
    grad_wg = d_gate.T @ x
    grad_wu = d_up.T @ x
    h = ((d_up @ wu).astype(f32) + (d_gate @ wg).astype(f32)).astype(bfloat16)
    g32 = g.astype(f32)
    q = (g32 * g32).sum(1) / K
    S = tw.sum(1) + f32(1e-20)
    c = (q - (q[:, None] * tw / S[:, None]).sum(1)) / S
    G = cp.zeros(scores.shape, f32)
    cp.add.at(G, (cp.repeat(cp.arange(idx.shape[0]), K), idx.ravel()), cp.repeat(c, K))
    grl = G * mask * scores * (1 - scores)
    grad_router = grl.T @ x.astype(f32)
    grad_h = (h.astype(f32) + (grl.astype(bfloat16) @ wr).astype(f32)).astype(bfloat16)
    return grad_h, grad_router, grad_wg, grad_wu, grad_wd


def sol080_torch_peer():
    try:
        import torch
    except Exception:
        return None

    def run(g, x, wr, bias, logits, scores, idx, tw, mask, wg, wu, wd, gate, up, act):
        K = idx.shape[1]
        d_act = g @ wd
        grad_wd = g.t() @ act
        gf, uf, daf = gate.float(), up.float(), d_act.float()
        t = (daf * uf).bfloat16().float()
        sig = torch.sigmoid(gf)
        d_up = (daf * (gf * sig).bfloat16().float()).bfloat16()
        d_gate = (t * sig * (1 + gf * (1 - sig))).bfloat16()
        grad_wg, grad_wu = d_gate.t() @ x, d_up.t() @ x
        h = ((d_up @ wu).float() + (d_gate @ wg).float()).bfloat16()
        g32 = g.float()
        q = (g32 * g32).sum(1) / K
        S = tw.sum(1) + 1e-20
        c = (q - (q[:, None] * tw / S[:, None]).sum(1)) / S
        G = torch.zeros_like(scores).scatter_add_(1, idx, c[:, None].expand(-1, K).contiguous())
        grl = G * mask * scores * (1 - scores)
        grad_router = grl.t() @ x.float()
        grad_h = (h.float() + (grl.bfloat16() @ wr).float()).bfloat16()
        return grad_h, grad_router, grad_wg, grad_wu, grad_wd

    return torch, run


def sol080_table(reps, ceilings=None):
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import SOL080_WORKLOADS, make_sol080_inputs, sol080_pass_rule

    measure = timer(reps)
    H, I, E, K = 4096, 1408, 128, 8
    torch_peer = sol080_torch_peer()
    rows = []
    print(f"\nSOL-080 (H={H}, I={I}, E={E}, K={K}); us, median of {reps}, L2 flushed; pass: the benchmark's "
          "rule against the NumPy reference and the cupy peer")
    print(f"{'T':>6} {'ours':>8} {'cupy':>8} {'torch':>8} {'SOL':>7} {'x cupy':>7} {'x torch':>7} "
          f"{'%SOL':>6} {'TFLOP/s':>8} pass")
    for T, atol in SOL080_WORKLOADS:
        a = make_sol080_inputs(T, H, I, E, K, seed=T, xp=cp)
        args = list(a.values())
        ours = cupy_moe.sol080_backward(*args)
        # The rule against the NumPy reference (the bar's) and against the cuBLAS-composed peer
        ref_np = cupy_moe.sol080_backward(*[cp.asnumpy(v) for v in args])
        ref = sol080_cupy_peer(*args)
        ok = all(sol080_pass_rule(o, r, atol) for o, r in zip(ours, ref_np))
        ok = ok and all(sol080_pass_rule(o, r, atol) for o, r in zip(ours, ref))
        t_ours = measure(lambda: cupy_moe.sol080_backward(*args))
        t_cupy = measure(lambda: sol080_cupy_peer(*args))
        t_torch = float("nan")
        if torch_peer:
            torch, run = torch_peer
            targs = [torch.from_dlpack(v) for v in args]
            t_torch = measure(lambda: run(*targs))
        flops = 2 * T * H * (6 * I + 2 * E)
        nbytes = (2 * T * H * 2 + T * E * 4 * 3 + T * K * 12 + 3 * I * H * 2 + 3 * T * I * 2  # inputs
                  + T * H * 2 + E * H * 4 + 3 * I * H * 2)                                  # outputs
        sol = max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e6
        machine_sol = max(flops / ceilings[0], nbytes / ceilings[1]) * 1e6 if ceilings else float("nan")
        rows.append((T, t_ours, t_cupy, t_torch, sol, machine_sol))
        print(f"{T:>6} {t_ours:8.1f} {t_cupy:8.1f} {t_torch:8.1f} {sol:7.1f} {t_cupy / t_ours:7.2f} "
              f"{t_torch / t_ours:7.2f} {100 * sol / t_ours:5.1f}% {flops / t_ours / 1e6:8.1f} "
              f"{'ok' if ok else 'FAIL'}")
    m = np.mean(np.array([r[1:] for r in rows]), axis=0)
    print(f"{'mean':>6} {m[0]:8.1f} {m[1]:8.1f} {m[2]:8.1f} {m[3]:7.1f} {m[1] / m[0]:7.2f} "
          f"{m[2] / m[0]:7.2f} {100 * m[3] / m[0]:5.1f}%")
    if ceilings:
        # Our mean moves with the machine's sustained rates (cuBLAS 787-804 TFLOP/s across the
        # H200s seen) while this fraction holds (84.1-84.9% over nine machines, bench/NOTES.md
        # v0.42): the same fraction of anchors.md's ceilings is the machine-free comparison.
        print(f"speed of light at this machine's measured ceilings: {m[4]:.1f} us on the mean "
              f"(anchors.md's machine: 213.0); ours at {100 * m[4] / m[0]:.1f}% of it, "
              f"{213.0 * m[0] / m[4]:.1f} us at that fraction of anchors.md's")
    return rows


# ---------------------------------------------------------------- full layer backward
def layer_cupy_peer(dy, ctx):
    """The same backward composed of cupy.matmul calls, a loop over experts (sorted layout)."""
    import cupy as cp
    from cupy_moe import bfloat16

    cfg = ctx.config
    f32 = cp.float32
    x = ctx.hidden_states
    T, H = x.shape
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    offs = ctx.expert_offsets.get()
    tok = ctx.sorted_slots // K
    w_rows = ctx.topk_weights.reshape(-1)[ctx.sorted_slots][:, None]
    dys, xs = dy[tok], x[tok]
    dx_sorted = cp.empty((T * K, H), bfloat16)
    dw_sorted = cp.empty(T * K, f32)
    dWg, dWu, dWd = (cp.zeros_like(ctx.expert_gate_weight), cp.zeros_like(ctx.expert_up_weight),
                     cp.zeros_like(ctx.expert_down_weight))
    for e in range(E):
        lo, hi = int(offs[e]), int(offs[e + 1])
        if lo == hi:
            continue
        r = slice(lo, hi)
        g, u, a = ctx.gate[r].astype(f32), ctx.up[r].astype(f32), ctx.act[r].astype(f32)
        dap = cp.matmul(dys[r], ctx.expert_down_weight[e]).astype(f32)
        dw_sorted[r] = (dap * a).sum(1)
        da = w_rows[r] * dap
        s = 1 / (1 + cp.exp(-g))
        dg = (da * u * s * (1 + g * (1 - s))).astype(bfloat16)
        du = (da * g * s).astype(bfloat16)
        dWd[e] = dys[r].T @ (w_rows[r] * a).astype(bfloat16)
        dWg[e] = dg.T @ xs[r]
        dWu[e] = du.T @ xs[r]
        dx_sorted[r] = dg @ ctx.expert_gate_weight[e] + du @ ctx.expert_up_weight[e]
    dw = dw_sorted[ctx.slot_rows].reshape(T, K)
    s_sel = cp.take_along_axis(ctx.scores, ctx.topk_indices, 1)
    D = s_sel.sum(1, keepdims=True) + f32(1e-20)
    r_ = f32(cfg.routed_scaling_factor)
    ds = (r_ / D) * (dw - (dw * ctx.topk_weights).sum(1, keepdims=True) / r_)
    dS = cp.zeros_like(ctx.scores)
    cp.put_along_axis(dS, ctx.topk_indices, ds, 1)
    dl = dS * ctx.scores * (1 - ctx.scores)
    xf = x.astype(f32)
    dWr = dl.T @ xf
    dx = dx_sorted[ctx.slot_rows].astype(f32).reshape(T, K, H).sum(1) + dl @ ctx.router_weight.astype(f32)
    das = (dy @ ctx.shared_expert_down_weight).astype(f32)
    gs, us = ctx.shared_gate.astype(f32), ctx.shared_up.astype(f32)
    s = 1 / (1 + cp.exp(-gs))
    dgs = (das * us * s * (1 + gs * (1 - s))).astype(bfloat16)
    dus = (das * gs * s).astype(bfloat16)
    dWsd = dy.T @ ctx.shared_act
    dWsg, dWsu = dgs.T @ x, dus.T @ x
    dx += (dgs @ ctx.shared_expert_gate_weight + dus @ ctx.shared_expert_up_weight).astype(f32)
    return dx.astype(bfloat16), dWr, dWg, dWu, dWd, dWsg, dWsu, dWsd


def _torch_routing(ctx):
    """torch, torch._grouped_mm, a zero-copy view maker, and ctx's routing as torch views (the
    sorted rows' slots as int64, their tokens, the groups' ends), or None without PyTorch."""
    try:
        import torch
        gmm = torch._grouped_mm
    except Exception:
        return None
    t = lambda a: torch.from_dlpack(a)
    slots = t(ctx.sorted_slots).long()
    return torch, gmm, t, slots, slots // ctx.config.num_experts_per_tok, t(ctx.expert_offsets[1:])


def layer_torch_peer(dy, ctx):
    """The same backward with torch._grouped_mm for the routed experts, hand-written (fp32 SwiGLU
    math), built on zero-copy views of our arrays; returns a no-argument callable, or None without
    PyTorch. (The anchor's peer is autograd's: layer_torch_autograd_peer.)"""
    peer = _torch_routing(ctx)
    if peer is None:
        return None
    torch, gmm, t, slots, tok, offs = peer
    K, r_ = ctx.config.num_experts_per_tok, ctx.config.routed_scaling_factor
    x, dyt = t(ctx.hidden_states), t(dy)
    T, H = x.shape
    slot_rows = t(ctx.slot_rows).long()
    tw, scores, idx = t(ctx.topk_weights), t(ctx.scores), t(ctx.topk_indices)
    Wd, Wg, Wu, Wr = (t(a) for a in (ctx.expert_down_weight, ctx.expert_gate_weight,
                                     ctx.expert_up_weight, ctx.router_weight))
    Wsg, Wsu, Wsd = (t(a) for a in (ctx.shared_expert_gate_weight, ctx.shared_expert_up_weight,
                                    ctx.shared_expert_down_weight))
    gate, up, act = t(ctx.gate).float(), t(ctx.up).float(), t(ctx.act).float()
    sg, su, sa = t(ctx.shared_gate).float(), t(ctx.shared_up).float(), t(ctx.shared_act)

    def run():
        w_rows = tw.reshape(-1)[slots][:, None]
        dys, xs = dyt[tok], x[tok]
        dap = gmm(dys, Wd, offs=offs).float()
        dw_sorted = (dap * act).sum(1)
        da = w_rows * dap
        s = torch.sigmoid(gate)
        dg = (da * up * s * (1 + gate * (1 - s))).bfloat16()
        du = (da * gate * s).bfloat16()
        aw = (w_rows * act).bfloat16()
        dWd = gmm(dys.t(), aw, offs=offs)
        dWg, dWu = gmm(dg.t(), xs, offs=offs), gmm(du.t(), xs, offs=offs)
        dx_sorted = gmm(dg, Wg, offs=offs).float() + gmm(du, Wu, offs=offs).float()
        dw = dw_sorted[slot_rows].reshape(T, K)
        s_sel = torch.gather(scores, 1, idx)
        D = s_sel.sum(1, keepdim=True) + 1e-20
        ds = (r_ / D) * (dw - (dw * tw).sum(1, keepdim=True) / r_)
        dS = torch.zeros_like(scores).scatter_(1, idx, ds)
        dl = dS * scores * (1 - scores)
        dWr = dl.t() @ x.float()
        dx = dx_sorted[slot_rows].reshape(T, K, H).sum(1) + dl @ Wr.float()
        das = (dyt @ Wsd).float()
        s = torch.sigmoid(sg)
        dgs = (das * su * s * (1 + sg * (1 - s))).bfloat16()
        dus = (das * sg * s).bfloat16()
        dWsd, dWsg, dWsu = dyt.t() @ sa, dgs.t() @ x, dus.t() @ x
        dx += (dgs @ Wsg + dus @ Wsu).float()
        return dx.bfloat16(), dWr, dWg, dWu, dWd, dWsg, dWsu, dWsd

    return run


def _torch_layer_out(torch, gmm, x, w_rows, tok, offs, weights):
    """The layer's output after routing, as a PyTorch user writes it (torch._grouped_mm experts,
    bf16 throughout): the sorted rows' tokens tok, their routing weights w_rows, the groups' ends
    offs; weights: (Wg, Wu, Wd, Wsg, Wsu, Wsd), the shared three None without a shared expert."""
    import torch.nn.functional as F

    Wg, Wu, Wd, Wsg, Wsu, Wsd = weights
    xs = x[tok]
    g = gmm(xs, Wg.transpose(1, 2), offs=offs)
    u = gmm(xs, Wu.transpose(1, 2), offs=offs)
    y = gmm(F.silu(g) * u, Wd.transpose(1, 2), offs=offs) * w_rows[:, None].to(x.dtype)
    out = torch.zeros_like(x).index_add(0, tok, y)
    if Wsg is not None:
        out = out + (F.silu(x @ Wsg.t()) * (x @ Wsu.t())) @ Wsd.t()
    return out


def torch_route(torch, x, Wr, bias, cfg):
    """The router and the routing sort in PyTorch: sigmoid scores (fp32), the group-limited top-k
    of the biased scores, the routing weights, and the stable sort of the T K slots by expert:
    (routing weights of the sorted rows, their tokens, the groups' ends as int32)."""
    T, E, K = x.shape[0], cfg.n_routed_experts, cfg.num_experts_per_tok
    scores = torch.sigmoid(x.float() @ Wr.float().t())
    key = scores + bias
    if cfg.n_group > 1:
        per = E // cfg.n_group
        group = key.view(T, cfg.n_group, per).topk(2, dim=-1).values.sum(-1)
        kept = torch.zeros_like(group, dtype=torch.bool).scatter_(1, group.topk(cfg.topk_group, dim=-1).indices, True)
        key = key.masked_fill(~kept.repeat_interleave(per, dim=1), float("-inf"))
    idx = key.topk(K, dim=-1).indices
    w = scores.gather(1, idx)
    if cfg.norm_topk_prob:
        w = w / (w.sum(1, keepdim=True) + 1e-20)
    w = w * cfg.routed_scaling_factor
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    return w.reshape(-1)[order], order // K, offs


def layer_torch_forward_peer(args, cfg, to_torch=None):
    """The layer's forward in PyTorch, routing included (torch_route, then _torch_layer_out), on
    zero-copy views of moe_forward's arguments (args: make_moe_inputs' dict); returns a
    no-argument callable giving out, or None without PyTorch. Ties in the top-k may pick other
    experts than ours: a timing peer, compared by its output's relative error."""
    try:
        import torch
        gmm = torch._grouped_mm
    except Exception:
        return None
    t = to_torch or torch.from_dlpack
    x, Wr, bias = t(args["hidden_states"]), t(args["router_weight"]), t(args["e_score_correction_bias"])
    weights = tuple(None if args[k] is None else t(args[k]) for k in (
        "expert_gate_weight", "expert_up_weight", "expert_down_weight",
        "shared_expert_gate_weight", "shared_expert_up_weight", "shared_expert_down_weight"))

    def run():
        with torch.no_grad():
            return _torch_layer_out(torch, gmm, x, *torch_route(torch, x, Wr, bias, cfg), weights)

    return run


def layer_torch_autograd_peer(dy, ctx):
    """The anchor's peer as anchors.md describes it: the layer's forward written in PyTorch
    (_torch_layer_out: torch._grouped_mm experts, bf16 throughout, the router in fp32) and its
    backward by autograd, what a PyTorch user gets without hand-written gradients. The forward
    graph is built once; the returned callable runs torch.autograd.grad on it (retain_graph), so
    only the backward is timed. Selection (topk_indices) is taken from ctx: it has no gradient.
    None without PyTorch."""
    peer = _torch_routing(ctx)
    if peer is None:
        return None
    torch, gmm, t, slots, tok, offs = peer
    cfg = ctx.config
    leaf = lambda a: None if a is None else t(a).detach().clone().requires_grad_()
    x = leaf(ctx.hidden_states)
    Wr, Wg, Wu, Wd, Wsg, Wsu, Wsd = (leaf(a) for a in (
        ctx.router_weight, ctx.expert_gate_weight, ctx.expert_up_weight, ctx.expert_down_weight,
        ctx.shared_expert_gate_weight, ctx.shared_expert_up_weight, ctx.shared_expert_down_weight))
    idx = t(ctx.topk_indices).long()
    scores = torch.sigmoid(x.float() @ Wr.float().t())
    w = torch.gather(scores, 1, idx)
    if cfg.norm_topk_prob:
        w = w / (w.sum(1, keepdim=True) + 1e-20)
    w = w * cfg.routed_scaling_factor
    out = _torch_layer_out(torch, gmm, x, w.reshape(-1)[slots], tok, offs, (Wg, Wu, Wd, Wsg, Wsu, Wsd))
    dyt = t(dy)
    inputs = [a for a in (x, Wr, Wg, Wu, Wd, Wsg, Wsu, Wsd) if a is not None]

    def run():
        return torch.autograd.grad(out, inputs, dyt, retain_graph=True)

    return run


MODELS = {"glm45_air": "GLM-4.5-Air", "glm45": "GLM-4.5", "deepseek_v3": "DeepSeek-V3"}


def layer_flops(cfg, T):
    """The layer backward's FLOPs: 12 H I per token and expert it runs through (dgrad and wgrad of
    gate, up and down), routed and shared alike, plus the router's 4 H E."""
    H, I = cfg.hidden_size, cfg.moe_intermediate_size
    return T * (12 * H * I * (cfg.num_experts_per_tok + cfg.n_shared_experts) + 4 * H * cfg.n_routed_experts)


def _free_pools():
    """Hand cached device memory back between peers: at DeepSeek-V3 sizes each set of weight
    gradients is 22.5 GB, and CuPy's and PyTorch's pools would otherwise each keep their own."""
    import cupy as cp

    cp.get_default_memory_pool().free_all_blocks()
    try:
        import torch
        torch.cuda.empty_cache()
    except Exception:  # pragma: no cover - without PyTorch there is nothing to free
        pass


def _inputs_per_T(cfg, Ts):
    """(T, moe_forward's arguments at T tokens) for each T: one draw at the largest T (seed 0),
    its first T tokens taken for each, so every T shares the same weights."""
    import cupy as cp

    from cupy_moe.testing import make_moe_inputs

    args = make_moe_inputs(cfg, max(Ts), seed=0, xp=cp)
    for T in Ts:
        yield T, dict(args, hidden_states=args["hidden_states"][:T].copy())


def _time_peer(measure, make, name, check, missing):
    """(ms, check(its first result)) of the peer that make() returns (a no-argument callable, or
    None without PyTorch); (NaN, missing) where it is absent or fails. Its memory is handed back
    after, whichever way it ends."""
    run = None
    try:
        run = make()
        if run is not None:
            checked = check(run())
            return measure(run, warmup=1) / 1e3, checked
    except Exception as exc:  # pragma: no cover - depends on the torch build
        print(f"  {name} unavailable: {type(exc).__name__}: {exc}")
    finally:
        run = None
        _free_pools()
    return float("nan"), missing


def layer_table(reps, Ts, model="glm45_air"):
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import make_grad_output, relative_error

    measure = timer(reps)
    cfg = getattr(cupy_moe.MoEConfig, model)()
    print(f"\nFull {MODELS[model]} layer backward; ms, median of {reps}, L2 flushed")
    print("torch: torch._grouped_mm with a hand-written backward (fp32 SwiGLU math); torch ag: the\n"
          "layer's forward in torch._grouped_mm and its backward by autograd (anchors.md's peer)")
    print(f"{'T':>6} {'ours':>8} {'cupy':>8} {'torch':>8} {'torch ag':>8} {'x cupy':>7} {'x torch':>7} "
          f"{'x ag':>7} {'TFLOP/s':>8} {'%789':>6} relerr(dx, dWg) vs cupy / torch / torch ag; worst of 8 vs cupy")
    dy_all = make_grad_output(cfg, max(Ts), seed=1, xp=cp)
    for T, a in _inputs_per_T(cfg, Ts):
        dy = dy_all[:T].copy()
        out, ctx = cupy_moe.moe_forward(**a, config=cfg)
        g = cupy_moe.moe_backward(dy, ctx)
        p = layer_cupy_peer(dy, ctx)
        err = (relative_error(g.hidden_states, p[0]), relative_error(g.expert_gate_weight, p[2]))
        worst = max(relative_error(a, b) for a, b in zip(g, p))  # all eight, the router's too
        del p
        _free_pools()
        t_ours = measure(lambda: cupy_moe.moe_backward(dy, ctx), warmup=2) / 1e3
        t_cupy = measure(lambda: layer_cupy_peer(dy, ctx), warmup=1) / 1e3
        def torch_peer(make, name):  # (ms, relative errors of dx and dWg), NaN without it
            return _time_peer(measure, lambda: make(dy, ctx), name,
                              lambda q: (relative_error(g.hidden_states, cp.from_dlpack(q[0])),
                                         relative_error(g.expert_gate_weight, cp.from_dlpack(q[2]))),
                              (float("nan"),) * 2)

        t_torch, terr = torch_peer(layer_torch_peer, "torch peer")
        t_ag, agerr = torch_peer(layer_torch_autograd_peer, "torch autograd peer")
        flops = layer_flops(cfg, T)
        print(f"{T:>6} {t_ours:8.2f} {t_cupy:8.2f} {t_torch:8.2f} {t_ag:8.2f} {t_cupy / t_ours:7.2f} "
              f"{t_torch / t_ours:7.2f} {t_ag / t_ours:7.2f} {flops / t_ours / 1e9:8.1f} "
              f"{100 * flops / t_ours / 1e9 / 789:5.1f}% {err[0]:.1e}, {err[1]:.1e} / "
              f"{terr[0]:.1e}, {terr[1]:.1e} / {agerr[0]:.1e}, {agerr[1]:.1e}; {worst:.1e}")
        del out, ctx, g
        _free_pools()


def layer_forward_table(reps, Ts, model="glm45_air"):
    """moe_forward, routing included, against the same forward in PyTorch (layer_torch_forward_peer)."""
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import relative_error

    measure = timer(reps)
    cfg = getattr(cupy_moe.MoEConfig, model)()
    print(f"\nFull {MODELS[model]} layer forward (routing included); ms, median of {reps}, L2 flushed")
    print("torch: the same forward in PyTorch (sigmoid router, group-limited top-k, a stable sort,\n"
          "torch._grouped_mm experts, bf16 throughout): the autograd peer's forward with its own routing")
    print(f"{'T':>6} {'ours':>8} {'torch':>8} {'x torch':>7} {'TFLOP/s':>8} {'%789':>6} relerr(out) vs torch")
    for T, a in _inputs_per_T(cfg, Ts):
        out, _ = cupy_moe.moe_forward(**a, config=cfg)
        t_ours = measure(lambda: cupy_moe.moe_forward(**a, config=cfg), warmup=2) / 1e3
        t_torch, err = _time_peer(measure, lambda: layer_torch_forward_peer(a, cfg), "torch forward peer",
                                  lambda q: relative_error(out, cp.from_dlpack(q)), float("nan"))
        flops = layer_flops(cfg, T) / 2  # one product a weight where the backward has two
        print(f"{T:>6} {t_ours:8.2f} {t_torch:8.2f} {t_torch / t_ours:7.2f} {flops / t_ours / 1e9:8.1f} "
              f"{100 * flops / t_ours / 1e9 / 789:5.1f}% {err:.1e}")
        del out
        _free_pools()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--sol080", action="store_true")
    ap.add_argument("--layer", action="store_true")
    ap.add_argument("--forward", action="store_true", help="the layer's forward against PyTorch's")
    ap.add_argument("--T", default="4096,8192,16384")
    ap.add_argument("--model", default="glm45_air", choices=sorted(MODELS))
    args = ap.parse_args(argv)
    both = not (args.gemm or args.sol080 or args.layer or args.forward)
    ceilings = machine_ceilings(args.reps)
    if args.gemm or both:
        gemm_table(args.reps)
    if args.sol080 or both:
        sol080_table(args.reps, ceilings)
    if args.layer or both:
        layer_table(args.reps, [int(t) for t in args.T.split(",")], args.model)
    if args.forward or both:
        layer_forward_table(args.reps, [int(t) for t in args.T.split(",")], args.model)


if __name__ == "__main__":
    sys.exit(main())
