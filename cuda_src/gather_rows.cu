// dst[i] = src[index[i] / div]: token rows into the experts' sorted order, so that every grouped
// GEMM reads plain rows by TMA (an in-GEMM gather through cp.async measured 2.5x slower); and
// the same as a scatter from token order (scatter_rows, below).
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

// dst[slot_rows[t * K + k]] = src[t] for every k: token rows into the experts' sorted order as a
// scatter. Each token row is read once (a warp per token) and written K times; the gather above
// reads it K times, at positions far apart in its walk, so from DRAM each time: at T = 8192,
// K = 8, H = 4096 ~576 MB of traffic instead of ~1 GB. Lanes k < K hold the K destinations.
extern "C" __global__ void scatter_rows(const bf16_t* __restrict__ src, const int* __restrict__ slot_rows,
                                        int K, int tokens, int width, bf16_t* __restrict__ dst) {
  wait_prior_grids();
  TRACE_SCOPE();
  const int lane = threadIdx.x % 32;
  const int warps = (int)(gridDim.x * blockDim.x / 32);
  for (int t = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32); t < tokens; t += warps) {
    const i64 from = (i64)t * width;
    const int mine = lane < K ? slot_rows[(i64)t * K + lane] : 0;
    if (width % 8 == 0 && K <= 32) {
      const uint4* s = (const uint4*)(src + from);
      for (int c0 = 0; c0 < width / 8; c0 += 32) {  // warp-uniform trips: every lane shuffles
        const int c = c0 + lane;
        const bool ok = c < width / 8;
        uint4 v;
        if (ok) v = s[c];
        for (int k = 0; k < K; ++k) {
          const i64 to = (i64)__shfl_sync(0xffffffffu, mine, k) * width;
          if (ok) ((uint4*)(dst + to))[c] = v;
        }
      }
    } else {
      for (int c = lane; c < width; c += 32) {
        const bf16_t v = src[from + c];
        for (int k = 0; k < K; ++k) dst[(i64)slot_rows[(i64)t * K + k] * width + c] = v;
      }
    }
  }
}
