// Entry point of every GEMM: one instantiation of the main loop per rendered Cfg.
#include "gemm/mainloop_mma.cuh"

extern "C" __global__ void __launch_bounds__(Cfg::WARPS_M * Cfg::WARPS_N * 32)
gemm_kernel(const __grid_constant__ GemmParams p) {
  wait_prior_grids();
  TRACE_SCOPE();
  extern __shared__ __align__(128) bf16_t smem[];
  if (cancelled(p.cancel)) return;
  gemm::gemm_kernel_body<Cfg>(p, smem);
}
