"""GPU tests of cupy_moe/_build.py's debugging aids (the CPU side is tests/test_build.py)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A kernel that waits on a barrier nobody arrives on, and a watcher thread that prints the stuck
# waits the watchdog records, then ends the process (the only way out of a hung kernel).
_HANG = textwrap.dedent(r'''
    import os, sys, threading, time
    os.environ["CUPY_MOE_WATCHDOG"] = "1"
    import cupy as cp
    from cupy_moe import _build, _nvrtc

    code = _build.WATCHDOG_DEFINE + """
    #include "common/hopper.cuh"
    extern "C" __global__ void hang() {
      __shared__ u64 bar;
      if (threadIdx.x == 0) { mbar_init(&bar, 1); fence_barrier_init(); }
      __syncthreads();
      mbar_wait(&bar, 0);  // phase 0 never completes
    }
    """
    arch = _build.target_arch(cp.cuda.Device().compute_capability)
    cubin, _ = _nvrtc.compile_to_cubin(code, "hang.cu", _build.compile_options(arch))
    path = os.path.join(sys.argv[1], "hang.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    mod = cp.RawModule(path=path)
    _build._point_watchdog(mod)
    recs = _build.watchdog_records()

    def watch():
        deadline = time.time() + 30
        while time.time() < deadline and recs["written"].sum() < 2 * 64:
            time.sleep(0.1)
        got = recs[recs["written"] != 0]
        print("RECORDS", len(got), sorted({(int(r["block"]), int(r["thread"])) for r in got}) == [
            (b, t) for b in range(2) for t in range(64)], sorted({int(r["parity"]) for r in got}),
            len({int(r["bar"]) for r in got}), flush=True)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    mod.get_function("hang")((2,), (64,), ())
    cp.cuda.Device().synchronize()
    print("FINISHED", flush=True)  # (never: the kernel cannot end)
''')


def test_mbarrier_watchdog_reports_a_hung_wait(tmp_path):
    """CUPY_MOE_WATCHDOG=1: a wait that cannot complete is reported into host-mapped memory while
    the kernel still hangs, once per waiting thread (2 blocks x 64 threads), with its parity."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _HANG, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120)
    line = next((l for l in run.stdout.splitlines() if l.startswith("RECORDS")), run.stdout + run.stderr)
    assert line == "RECORDS 128 True [0] 1", line  # (each block's barrier at the same shared address)
