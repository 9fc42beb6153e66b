"""A spin kernel that holds the GPU while a call queues up behind it, so events around the call
time the GPU alone, not the host's launch gaps (profile_kernels.py, call_gap.py)."""
_SPIN = r"""extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}"""


def hold_gpu(ms=20.0):
    """One thread spinning ~ms (at up to 2 GHz) on the current stream."""
    import cupy as cp

    cp.RawKernel(_SPIN, "spin")((1,), (1,), (cp.int64(int(ms * 2e6)),))
