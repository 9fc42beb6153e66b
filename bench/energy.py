"""Work per joule under sustained load: each case runs back to back for --seconds (after as long
again to reach the power cap), timed by CUDA events, its energy read from NVML's counter (ctypes,
no extra package), the SM clock sampled while it runs. Under the power cap a call's time is its
energy over the cap's watts, so TFLOP per joule is the number a kernel change has to raise there;
cuBLAS at the same shape is the dense GEMMs' peer, the anchor's autograd peer the layer's (where
PyTorch is installed). Cases rotate between --rounds.
Usage (device): PYTHONPATH=. python bench/energy.py [--seconds 2] [--rounds 2] [--T 8192] [name part ...]"""
import argparse
import ctypes
import os
import statistics
import sys

import numpy as np


class Nvml:
    """The three NVML reads this needs, for the current CuPy device (matched by PCI bus id)."""

    def __init__(self):
        import cupy as cp

        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        self.handle = ctypes.c_void_p()
        bus = cp.cuda.Device().pci_bus_id.encode()
        self._ok(self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.handle)))

    @staticmethod
    def _ok(rc):
        if rc != 0:
            raise RuntimeError(f"NVML call failed with status {rc}")

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        self._ok(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(v)))
        return v.value

    def power_w(self) -> float:
        v = ctypes.c_uint()
        self._ok(self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(v)))  # mW
        return v.value / 1e3

    def sm_mhz(self) -> int:
        v = ctypes.c_uint()
        self._ok(self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(v)))  # NVML_CLOCK_SM
        return v.value

    def power_limit_w(self) -> float:
        v = ctypes.c_uint()
        self._ok(self.lib.nvmlDeviceGetEnforcedPowerLimit(self.handle, ctypes.byref(v)))
        return v.value / 1e3


def sustained(nvml, fn, seconds):
    """(us a call, J a call, mean W, median SM MHz, source) over ~seconds of back-to-back calls.
    The energy is the counter's difference; where the counter does not move (seen on the lent
    H200's VM: 0 mJ over seconds of load), the mean of the power readings taken while it ran times
    the time (source says which)."""
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    n = max(5, int(seconds / (cp.cuda.get_elapsed_time(start, end) / 1e3)))
    for _ in range(n):  # reach the cap
        fn()
    cp.cuda.Device().synchronize()
    mhz, watts = [], []
    e0 = nvml.energy_mj()
    start.record()
    for i in range(n):
        fn()
        if i % max(1, n // 20) == 0:
            mhz.append(nvml.sm_mhz())
            watts.append(nvml.power_w())
    end.record()
    end.synchronize()
    secs = cp.cuda.get_elapsed_time(start, end) / 1e3
    joules, source = (nvml.energy_mj() - e0) / 1e3, "counter"
    if joules <= 0:
        joules, source = statistics.mean(watts) * secs, "power"
    return secs / n * 1e6, joules / n, joules / secs, statistics.median(mhz), source


def cases(T):
    import cupy as cp

    import cupy_moe
    from cupy_moe import bfloat16
    from cupy_moe.gpu.gemm import Segment, gemm
    from cupy_moe.testing import make_moe_inputs, make_grad_output

    def rand(*shape):
        return cp.random.standard_normal(shape, dtype=cp.float32).astype(bfloat16)

    out = {}
    # The routed dgrad's shape as one dense GEMM, and a square-ish one: ours and cuBLAS.
    for M, N, K in ((65536, 4096, 2816), (16384, 4096, 4096)):
        A, B, C = rand(M, K), rand(K, N), cp.empty((M, N), bfloat16)
        seg = [Segment(A, K, B, N, k=K)]
        flop = 2 * M * N * K
        out[f"dense {M}x{N}x{K} ours"] = (flop, lambda seg=seg, C=C, M=M, N=N: gemm(
            m=M, n=N, segments=seg, a_kmajor=True, b_kmajor=False, out=C, ldc=N))
        out[f"dense {M}x{N}x{K} cuBLAS"] = (flop, lambda A=A, B=B: cp.matmul(A, B))
    # The layer's grouped GEMMs alone at balanced routing (T * 8 rows over 128 experts): the routed
    # dgrad's shape (M-grouped) and a weight gradient's (K-grouped, [1408 x 4096] an expert).
    rows, E_, H_, I_ = T * 8, 128, 4096, 1408
    offs = cp.asarray(np.linspace(0, rows, E_ + 1).astype(np.int32))
    grouped = dict(group_offsets=offs, num_groups=E_)
    A, W, C = rand(rows, 2 * I_), rand(E_, 2 * I_, H_), cp.empty((rows, H_), bfloat16)
    seg = [Segment(A, 2 * I_, W, H_, k=2 * I_, b_group_stride=2 * I_ * H_)]
    out[f"M-grouped {rows}x{H_}x{2 * I_} ours"] = (2 * rows * H_ * 2 * I_, lambda: gemm(
        m=rows, n=H_, segments=seg, a_kmajor=True, b_kmajor=False, out=C, ldc=H_, grouping="m", **grouped))
    D, X, G = rand(rows, I_), rand(rows, H_), cp.empty((E_, I_, H_), bfloat16)
    kseg = [Segment(D, I_, X, H_, k=rows)]
    out[f"K-grouped {I_}x{H_} per expert ours"] = (2 * rows * H_ * I_, lambda: gemm(
        m=I_, n=H_, segments=kseg, a_kmajor=False, b_kmajor=False, out=G, ldc=H_, c_group_stride=I_ * H_,
        grouping="k", **grouped))
    cfg = cupy_moe.MoEConfig.glm45_air()
    a = make_moe_inputs(cfg, T, seed=0, xp=cp)
    dy = make_grad_output(cfg, T, seed=1, xp=cp)
    _, ctx = cupy_moe.moe_forward(**a, config=cfg)
    H, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    flop = T * (108 * H * I + 4 * H * E)
    out[f"layer backward T={T}"] = (flop, lambda: cupy_moe.moe_backward(dy, ctx))
    sys.path.insert(0, os.path.dirname(__file__))
    from benchmark import layer_torch_autograd_peer

    peer = layer_torch_autograd_peer(dy, ctx)  # None without PyTorch
    if peer is not None:
        out[f"layer backward T={T} torch ag"] = (flop, peer)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("only", nargs="*", help="run the cases whose name holds one of these")
    args = ap.parse_args()
    nvml = Nvml()
    work = {k: v for k, v in cases(args.T).items() if not args.only or any(o in k for o in args.only)}
    print(f"enforced power limit {nvml.power_limit_w():.0f} W; {args.seconds:g} s of back-to-back calls a case")
    print(f"{'case':<34}{'round':>6}{'us/call':>10}{'TFLOP/s':>9}{'J/call':>9}{'W':>6}{'MHz':>6}{'TFLOP/J':>9}"
          "  energy from")
    names = list(work)
    for r in range(args.rounds):
        for name in np.roll(names, -r):
            flop, fn = work[name]
            us, j, w, mhz, source = sustained(nvml, fn, args.seconds)
            print(f"{name:<34}{r:>6}{us:10.1f}{flop / us / 1e6:9.1f}{j:9.3f}{w:6.0f}{mhz:6.0f}"
                  f"{flop / j / 1e12:9.3f}  {source}")


if __name__ == "__main__":
    main()
