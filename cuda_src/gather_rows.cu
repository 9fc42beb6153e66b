// dst[i] = src[index[i] / div]: token rows into the experts' sorted order, so that every grouped
// GEMM reads plain rows by TMA (an in-GEMM gather through cp.async measured 2.5x slower).
// One warp per destination row; 16-byte vectors when the row width allows, else elements.
#include "common/types.cuh"

extern "C" __global__ void gather_rows(const bf16_t* __restrict__ src, const int* __restrict__ index,
                                       int div, int rows, int width, bf16_t* __restrict__ dst) {
  wait_prior_grids();
  TRACE_SCOPE();
  const int lane = threadIdx.x % 32;
  const int warps = (int)(gridDim.x * blockDim.x / 32);
  for (int r = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32); r < rows; r += warps) {
    const i64 from = (i64)(index[r] / div) * width, to = (i64)r * width;
    if (width % 8 == 0) {
      const uint4* s = (const uint4*)(src + from);
      uint4* d = (uint4*)(dst + to);
      for (int c = lane; c < width / 8; c += 32) d[c] = s[c];
    } else {
      for (int c = lane; c < width; c += 32) dst[to + c] = src[from + c];
    }
  }
}
