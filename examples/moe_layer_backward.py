"""The main job: one GLM-4.5-Air MoE layer, forward then backward, on the GPU.

Without a usable GPU (no CuPy, no device, or not sm_90) it runs the same functions on NumPy arrays
at a small config instead, through the NumPy reference. Prints what it did.
Usage: python examples/moe_layer_backward.py [--tokens T] [--model glm45_air|glm45|deepseek_v3]
(--model on the GPU only: DeepSeek-V3's expert weights are 22.5 GB)
"""
import argparse
import time

import numpy as np

import cupy_moe
from cupy_moe.testing import make_grad_output, make_moe_inputs


def gpu_available():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0 and int(cupy.cuda.Device(0).compute_capability) >= 80
    except Exception:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--model", default="glm45_air", choices=["glm45_air", "glm45", "deepseek_v3"])
    args = ap.parse_args()
    if gpu_available():
        import cupy as xp
        cfg, T, where = getattr(cupy_moe.MoEConfig, args.model)(), args.tokens or 4096, "GPU (CuPy kernels)"
    else:
        xp = np
        cfg = cupy_moe.MoEConfig(hidden_size=256, n_routed_experts=16, num_experts_per_tok=4,
                                 moe_intermediate_size=96, n_group=4, topk_group=2)
        T, where = args.tokens or 64, "CPU (NumPy reference; no sm_90 GPU found)"
        if args.model != "glm45_air":
            where += f"; --model {args.model} applies on the GPU only"
    print(f"cupy_moe {cupy_moe.__version__} on {where}")
    print(f"config: {cfg}")
    inputs = make_moe_inputs(cfg, T, seed=0, xp=xp)
    dy = make_grad_output(cfg, T, seed=1, xp=xp)

    t0 = time.perf_counter()
    out, ctx = cupy_moe.moe_forward(**inputs, config=cfg)
    grads = cupy_moe.moe_backward(dy, ctx)
    if xp is not np:
        xp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    counts = ctx.tokens_per_expert if xp is np else ctx.tokens_per_expert.get()
    print(f"forward + backward of T={T} tokens: {dt * 1e3:.1f} ms (first call includes compilation)")
    print(f"out {out.shape} {out.dtype}; tokens per expert: min {counts.min()}, max {counts.max()}, "
          f"empty experts {(counts == 0).sum()}")
    for name in grads._fields:
        g = getattr(grads, name)
        if g is not None:
            norm = float(xp.linalg.norm(g.astype(xp.float32)))
            print(f"  d{name:<27} {str(g.shape):<18} {str(g.dtype):<9} |grad| = {norm:.4g}")


if __name__ == "__main__":
    main()
