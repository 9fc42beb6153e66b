// The weighted combine of each token's K expert rows (forward) and the sum of its K dgrad rows
// (backward): each thread owns V consecutive elements of one output row (V = 8, 16-byte
// accesses, when H allows), k ascending, no atomics.
#include "common/types.cuh"

template <int V>
struct __align__(2 * V) Bf16x {  // aligned: V = 8 moves as one 16-byte access, not 8 of 2 bytes
  bf16_t v[V];
};

template <int V>
__device__ __forceinline__ void load_f32(float (&dst)[V], const bf16_t* src) {
  const Bf16x<V> x = *(const Bf16x<V>*)src;
  #pragma unroll
  for (int e = 0; e < V; ++e) dst[e] = bf16_to_f32(x.v[e]);
}

template <int V>
__device__ __forceinline__ void store_bf16(bf16_t* dst, const float (&src)[V]) {
  Bf16x<V> x;
  #pragma unroll
  for (int e = 0; e < V; ++e) x.v[e] = f32_to_bf16(src[e]);
  *(Bf16x<V>*)dst = x;
}

template <int V, bool FORWARD>
__device__ __forceinline__ void combine(const bf16_t* __restrict__ rows_sorted, const int* __restrict__ row_of_slot,
                                        const float* __restrict__ weights, const bf16_t* __restrict__ y_shared,
                                        const float* __restrict__ dx_rest, int T, int H, int K,
                                        bf16_t* __restrict__ out) {
  const i64 chunk = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (chunk >= (i64)T * H / V) return;
  const i64 i = chunk * V;
  const int t = (int)(i / H), h = (int)(i % H);
  float acc[V], x[V];
  #pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  for (int k = 0; k < K; ++k) {
    load_f32<V>(x, rows_sorted + (i64)row_of_slot[(i64)t * K + k] * H + h);
    const float w = FORWARD ? weights[(i64)t * K + k] : 1.f;
    #pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += FORWARD ? w * x[e] : x[e];
  }
  if (FORWARD && y_shared) {
    load_f32<V>(x, y_shared + i);
    #pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += x[e];
  }
  if (!FORWARD) {
    #pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += dx_rest[i + e];
  }
  store_bf16<V>(out + i, acc);
}

// out[t] = bf16(sum_k w[t, k] y_sorted[row(t, k)] + y_shared[t]); launch T * H / (H % 8 ? 1 : 8) threads.
extern "C" __global__ void combine_forward(const bf16_t* __restrict__ y_sorted,
                                           const int* __restrict__ row_of_slot,
                                           const float* __restrict__ weights,
                                           const bf16_t* __restrict__ y_shared, int T, int H, int K,
                                           bf16_t* __restrict__ out) {
  wait_prior_grids();
  TRACE_SCOPE();
  if (H % 8 == 0) combine<8, true>(y_sorted, row_of_slot, weights, y_shared, nullptr, T, H, K, out);
  else combine<1, true>(y_sorted, row_of_slot, weights, y_shared, nullptr, T, H, K, out);
}

// dx[t] = bf16(sum_k dx_sorted[row(t, k)] + dx_rest[t]); same launch shape.
extern "C" __global__ void combine_backward(const bf16_t* __restrict__ dx_sorted,
                                            const int* __restrict__ row_of_slot,
                                            const float* __restrict__ dx_rest, int T, int H, int K,
                                            bf16_t* __restrict__ dx) {
  wait_prior_grids();
  TRACE_SCOPE();
  if (H % 8 == 0) combine<8, false>(dx_sorted, row_of_slot, nullptr, nullptr, dx_rest, T, H, K, dx);
  else combine<1, false>(dx_sorted, row_of_slot, nullptr, nullptr, dx_rest, T, H, K, dx);
}
