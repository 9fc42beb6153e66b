"""SOL-080's small-T GEMMs alone, ours against cuBLAS (cupy.matmul) in one process, L2 flushed:
the dgrad [T, 2I + E] @ [2I + E, H], the same as its transpose (H rows, T columns: the weights as
the MN-major A operand, the T rows as B, one tile row of T columns), split-K forms of both, and
d_act [T, H] @ [H, I] plain, split-K as SOL-080 runs it, and transposed in one 256-wide tile of T
columns, split 11-12 ways (unsummed pieces: the GEMM's time alone). Prints cuBLAS's kernel names
(through torch's profiler) where torch is there.
The question: does a better tile shape exist for T <= 512, where the dgrad's 128 x 128 tiles run
at ~55% of the tensor cores' rate (bench/NOTES.md v0.13)?
--scan: the dgrad's shape at M x N (K = 2I + E), L2 flushed, as us per 128 x 128 x 64 k-step of a
CTA (one tile each where tiles <= SMs): does a k-step's time depend on how many CTAs run (a shared
limit), on how many read each A line (N / 128 readers), or on neither (each SM's own rate)?
(Session 25: 0.41-0.47 us from 8 to 64 CTAs and 8 to 32 readers, 0.62 at 128 CTAs.)
Usage (device): PYTHONPATH=. python bench/small_m_gemm.py [--T 192,384,512] [--reps 20] [--scan]"""
import argparse
import os
import sys

import cupy as cp

sys.path.insert(0, os.path.dirname(__file__))
from benchmark import timer  # noqa: E402
from cupy_moe import bfloat16  # noqa: E402
from cupy_moe.gpu.gemm import Segment, gemm  # noqa: E402

H, I, E = 4096, 1408, 128


def rand(*shape):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(bfloat16)


def rel(out, ref):
    out, ref = out.astype(cp.float32), ref.astype(cp.float32)
    return float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref))


def cublas_kernels(fn):
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return "-"
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return ", ".join(sorted({e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"}))


def split_k(m, n, segments, a_kmajor, b_kmajor, splits, **kw):
    """(launch, its fp32 pieces [splits, m, n]) of an unsummed split-K gemm()."""
    pieces = cp.empty((splits, m, n), cp.float32)
    return (lambda: gemm(m=m, n=n, segments=segments, a_kmajor=a_kmajor, b_kmajor=b_kmajor, out=pieces, ldc=n,
                         epilogue="f32", k_splits=splits, c_group_stride=m * n, **kw)), pieces


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="192,384,512")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--scan", action="store_true")
    args = ap.parse_args()
    measure = timer(args.reps)
    K = 2 * I + E
    if args.scan:
        return scan(measure, K)
    print(f"{'GEMM':<34} {'T':>5} {'ours us':>8} {'cuBLAS us':>9} {'ours TF/s':>9} {'x cuBLAS':>8} rel.err")
    for T in map(int, args.T.split(",")):
        a, w = rand(T, K), rand(K, H)  # the dgrad's [d_gate | d_up | grl] rows and [Wg; Wu; Wr]
        x, wd = rand(T, H), rand(H, I)
        ref = a @ w
        ref_act = x @ wd
        forms = {}  # name: (launch, result, reference, how the result reads: plain / pieces / pieces^T)
        out = cp.empty((T, H), bfloat16)
        forms["dgrad 128-row tiles"] = (lambda: gemm(m=T, n=H, segments=[Segment(a, K, w, H, k=K)], a_kmajor=True,
                                                     b_kmajor=False, out=out, ldc=H), out, ref, "plain")
        out_t = cp.empty((H, T), bfloat16)
        forms["dgrad^T (W as A, T columns)"] = (lambda: gemm(m=H, n=T, segments=[Segment(w, H, a, K, k=K)],
                                                             a_kmajor=False, b_kmajor=True, out=out_t, ldc=T),
                                                out_t, ref.T, "plain")
        for s in (2, 4):
            forms[f"dgrad^T split-K {s} (fp32 pieces)"] = split_k(H, T, [Segment(w, H, a, K, k=K)], False, True, s) + (
                ref, "pieces^T")
        d_act = cp.empty((T, I), bfloat16)
        forms["d_act 128-row tiles"] = (lambda: gemm(m=T, n=I, segments=[Segment(x, H, wd, I, k=H)], a_kmajor=True,
                                                     b_kmajor=False, out=d_act, ldc=I), d_act, ref_act, "plain")
        # SOL-080's small-T d_act: split-K pieces (5 at T = 192 beside the router), against the
        # transpose in one 256-wide column tile of T (11 row tiles of I, so up to 12 pieces).
        for s in (5, 6):
            forms[f"d_act split-K {s} (fp32 pieces)"] = split_k(T, I, [Segment(x, H, wd, I, k=H)], True, False, s) + (
                ref_act, "pieces")
        for s in (11, 12):
            forms[f"d_act^T wide split-K {s}"] = split_k(I, T, [Segment(wd, I, x, H, k=H)], False, True, s,
                                                        wide=True) + (ref_act, "pieces^T")
        peers = {"dgrad": lambda: a @ w, "d_act": lambda: x @ wd}
        t_peer = {name: measure(fn) for name, fn in peers.items()}
        for name, (fn, got, want, reads) in forms.items():
            got.fill(float("nan"))
            fn()
            result = {"plain": got, "pieces": got.sum(axis=0), "pieces^T": got.sum(axis=0).T}[reads]
            err = f"{rel(result, want):.1e}"
            t = measure(fn)
            peer = t_peer["d_act" if name.startswith("d_act") else "dgrad"]
            flops = 2 * T * (I * H if name.startswith("d_act") else K * H)
            print(f"{name:<34} {T:>5} {t:8.1f} {peer:9.1f} {flops / t / 1e6:9.1f} {peer / t:8.2f} {err}")
        try:
            import torch
            ta, tw = torch.from_dlpack(a), torch.from_dlpack(w)
            print(f"  cuBLAS dgrad kernel: {cublas_kernels(lambda: ta @ tw)}")
            print(f"  cuBLAS dgrad^T kernel: {cublas_kernels(lambda: tw.t() @ ta.t())}")
        except ImportError:
            pass


def scan(measure, K):
    steps = -(-K // 64)
    print(f"{'M':>5} {'N':>5} {'CTAs':>5} {'readers/A line':>14} {'us':>7} {'us/k-step':>9}")
    for M, N in ((128, 4096), (256, 4096), (128, 2048), (256, 2048), (512, 2048), (128, 1024), (512, 1024),
                 (1024, 1024), (256, 8192)):
        a, w = rand(M, K), rand(K, N)
        out = cp.empty((M, N), bfloat16)
        fn = lambda: gemm(m=M, n=N, segments=[Segment(a, K, w, N, k=K)], a_kmajor=True, b_kmajor=False,
                          out=out, ldc=N)
        ctas = (M // 128) * (N // 128)
        t = measure(fn)
        print(f"{M:>5} {N:>5} {min(ctas, 132):>5} {N // 128:>14} {t:7.1f} {t / steps / -(-ctas // 132):9.3f}")


if __name__ == "__main__":
    main()
