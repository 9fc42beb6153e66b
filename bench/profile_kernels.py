"""Where a public call's GPU time goes, kernel by kernel: every launch through cupy_moe._launch is
bracketed by CUDA events and labelled with the line of cupy_moe that made it; a spin kernel holds
the GPU while the call is queued, so the events time the GPU alone (start: from the call's start).
With CUPY_MOE_PROFILE_WARM=S the call first repeats for S seconds, as a benchmark loop does (one
traced layer backward read ~10% below the benchmark's median in session 4; sustained clocks are
the suspect, not yet measured).
Usage: PYTHONPATH=. python bench/profile_kernels.py layer [T [glm45_air|glm45|deepseek_v3]] | sol080 [T]"""
import os
import sys
import time
import traceback

# Events cannot be recorded inside a stream capture: SOL-080 runs eagerly here (its graph replay
# would otherwise start on the traced call, the second with the same buffers).
os.environ.setdefault("CUPY_MOE_GRAPHS", "0")

import cupy as cp

import cupy_moe
from cupy_moe import _launch

sys.path.insert(0, os.path.dirname(__file__))
from spin import hold_gpu  # noqa: E402


def traced(calls):
    original = _launch.launch

    def launch(module, name, grid, block, args, shared_mem=0, **kw):
        where = next((f"{f.filename.split('cupy_moe/')[-1]}:{f.lineno}"
                      for f in reversed(traceback.extract_stack()[:-1])
                      if "cupy_moe/" in f.filename and "_launch.py" not in f.filename
                      and "gemm.py" not in f.filename), "?")
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        original(module, name, grid, block, args, shared_mem, **kw)
        end.record()
        calls.append((where, name, grid, start, end))

    return launch


WARM_SECONDS = float(os.environ.get("CUPY_MOE_PROFILE_WARM", "0"))


def profile(fn, label):
    fn()  # compile and warm up outside the trace
    until = time.perf_counter() + WARM_SECONDS
    while time.perf_counter() < until:
        fn()
        cp.cuda.get_current_stream().synchronize()
    calls = []
    _launch.launch, original = traced(calls), _launch.launch
    start, end = cp.cuda.Event(), cp.cuda.Event()
    try:
        hold_gpu()
        start.record()
        fn()
        end.record()
        end.synchronize()
    finally:
        _launch.launch = original
    total = cp.cuda.get_elapsed_time(start, end) * 1e3
    print(f"{label}: {total:9.1f} us whole call (with tracing), {len(calls)} launches")
    listed = 0.0
    print(f"  {'start':>9}  {'us':>9}")
    for where, name, grid, s, e in calls:
        t = cp.cuda.get_elapsed_time(s, e) * 1e3
        listed += t
        at = cp.cuda.get_elapsed_time(start, s) * 1e3
        print(f"  {at:9.1f}  {t:9.1f} us  {name:<24} grid {str(grid):<16} {where}")
    print(f"  {listed:9.1f} us  in listed kernels (kernels on two streams overlap); the rest is "
          f"CuPy's own kernels and gaps")


def main(argv):
    what = argv[0] if argv else "layer"
    T = int(argv[1]) if len(argv) > 1 else 8192
    if what == "layer":
        from cupy_moe.testing import make_moe_inputs, make_grad_output

        cfg = getattr(cupy_moe.MoEConfig, argv[2] if len(argv) > 2 else "glm45_air")()
        a = make_moe_inputs(cfg, T, seed=0, xp=cp)
        dy = make_grad_output(cfg, T, seed=1, xp=cp)
        out, ctx = cupy_moe.moe_forward(**a, config=cfg)
        profile(lambda: cupy_moe.moe_forward(**a, config=cfg), f"moe_forward T={T}")
        profile(lambda: cupy_moe.moe_backward(dy, ctx), f"moe_backward T={T}")
    else:
        from cupy_moe.testing import make_sol080_inputs

        from cupy_moe.gpu import sol080

        a = make_sol080_inputs(T, seed=T, xp=cp)
        # Past the argument checks: their one host sync would drain the queue the trace holds.
        profile(lambda: sol080.sol080_backward(*a.values()), f"sol080_backward T={T} (unchecked)")


if __name__ == "__main__":
    main(sys.argv[1:])
