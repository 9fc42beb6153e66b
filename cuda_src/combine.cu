// The weighted combine of each token's K expert rows (forward) and the sum of its K dgrad rows
// (backward): one thread per output element, k ascending, no atomics.
#include "common/types.cuh"

extern "C" __global__ void combine_forward(const bf16_t* __restrict__ y_sorted,
                                           const int* __restrict__ row_of_slot,
                                           const float* __restrict__ weights,
                                           const bf16_t* __restrict__ y_shared, int T, int H, int K,
                                           bf16_t* __restrict__ out) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (i64)T * H) return;
  const int t = (int)(i / H), h = (int)(i % H);
  float acc = 0.f;
  for (int k = 0; k < K; ++k)
    acc += weights[(i64)t * K + k] * bf16_to_f32(y_sorted[(i64)row_of_slot[(i64)t * K + k] * H + h]);
  if (y_shared) acc += bf16_to_f32(y_shared[i]);
  out[i] = f32_to_bf16(acc);
}

extern "C" __global__ void combine_backward(const bf16_t* __restrict__ dx_sorted,
                                            const int* __restrict__ row_of_slot,
                                            const float* __restrict__ dx_rest, int T, int H, int K,
                                            bf16_t* __restrict__ dx) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (i64)T * H) return;
  const int t = (int)(i / H), h = (int)(i % H);
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += bf16_to_f32(dx_sorted[(i64)row_of_slot[(i64)t * K + k] * H + h]);
  dx[i] = f32_to_bf16(acc + dx_rest[i]);
}
