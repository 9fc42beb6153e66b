// Entry point of the Hopper GEMM: one instantiation of the wgmma main loop per rendered Cfg.
#include "gemm/mainloop_wgmma.cuh"

extern "C" __global__ void __launch_bounds__(gemm::sm90::Plan<Cfg>::THREADS, 1)
gemm_sm90_kernel(const __grid_constant__ GemmSm90Params p) {
  extern __shared__ __align__(1024) u8 smem[];
  if constexpr (Cfg::EARLY_SETUP) gemm::sm90::set_up<Cfg>(p, smem);  // (before the wait: see set_up)
  wait_prior_grids();
  TRACE_SCOPE();
  if (cancelled(p.base.cancel)) return;  // the same word for every thread: the whole CTA leaves
  gemm::sm90::kernel_body<Cfg>(p, smem);
}
