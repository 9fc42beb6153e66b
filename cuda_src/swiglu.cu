// SwiGLU forward and backward, elementwise or one row per block (row reductions stay in a fixed
// order, so results are bitwise reproducible).
#include "common/types.cuh"

// a = bf16(silu(g) * u), silu(g) = g * sigmoid(g), in fp32 from the stored bf16 g and u.
__device__ __forceinline__ bf16_t swiglu_value(bf16_t g, bf16_t u) {
  const float gv = bf16_to_f32(g);
  return f32_to_bf16(gv * sigmoid_f32(gv) * bf16_to_f32(u));
}

// Eight elements a thread at a time through 16-byte loads and stores where all three arrays are
// 16-byte aligned (element by element, 2-byte accesses, it moved GLM-4.5-Air's 554 MB at T = 8192
// at ~1.5 TB/s: 368 us, bench/NOTES.md v0.57); the last n % 8 elements, or all of them where an
// array is not aligned, one at a time. Each element's arithmetic is the same either way.
extern "C" __global__ void swiglu_forward(const bf16_t* __restrict__ g, const bf16_t* __restrict__ u,
                                          bf16_t* __restrict__ a, i64 n) {
  wait_prior_grids();
  TRACE_SCOPE();
  const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, stride = (i64)gridDim.x * blockDim.x;
  const bool vec = (((unsigned long long)g | (unsigned long long)u | (unsigned long long)a) & 15) == 0;
  const i64 chunks = vec ? n / 8 : 0;
  for (i64 c = first; c < chunks; c += stride) {
    uint4 gv = ((const uint4*)g)[c], uv = ((const uint4*)u)[c], av;
    const bf16_t* g8 = (const bf16_t*)&gv;
    const bf16_t* u8 = (const bf16_t*)&uv;
    bf16_t* a8 = (bf16_t*)&av;
    #pragma unroll
    for (int e = 0; e < 8; ++e) a8[e] = swiglu_value(g8[e], u8[e]);
    ((uint4*)a)[c] = av;
  }
  for (i64 i = 8 * chunks + first; i < n; i += stride) a[i] = swiglu_value(g[i], u[i]);
}

// One block per row r of width I: da = w * da_unweighted (w = weights[row_index[r]]); dg = bf16(da u silu'(g)),
// du = bf16(da silu(g)). Routed experts also get dw[r] = <da_unweighted, a> and aw = bf16(w a)
// (the down projection's weight-gradient operand); the shared expert passes null for those and
// for the weights (w = 1).
constexpr int kRowThreads = 256;

extern "C" __global__ void __launch_bounds__(kRowThreads)
swiglu_backward(const float* __restrict__ da_unweighted, const bf16_t* __restrict__ g,
                const bf16_t* __restrict__ u, const bf16_t* __restrict__ a,
                const float* __restrict__ weights, const int* __restrict__ row_index, int rows, int I, bf16_t* __restrict__ dg, bf16_t* __restrict__ du,
                float* __restrict__ dw, bf16_t* __restrict__ aw) {
  wait_prior_grids();
  TRACE_SCOPE();
  __shared__ float partial[kRowThreads];
  const int r = blockIdx.x;
  const float w = weights ? weights[row_index ? row_index[r] : r] : 1.f;
  const i64 base = (i64)r * I;
  float dot = 0.f;
  for (int i = threadIdx.x; i < I; i += kRowThreads) {
    const float dap = da_unweighted[base + i];
    const float gv = bf16_to_f32(g[base + i]), uv = bf16_to_f32(u[base + i]);
    const float s = sigmoid_f32(gv);
    const float silu = gv * s, dsilu = s * (1.f + gv * (1.f - s));
    const float da = w * dap;
    dg[base + i] = f32_to_bf16(da * uv * dsilu);
    du[base + i] = f32_to_bf16(da * silu);
    if (dw) {
      const float av = bf16_to_f32(a[base + i]);
      dot += dap * av;
      aw[base + i] = f32_to_bf16(w * av);
    }
  }
  if (!dw) return;
  partial[threadIdx.x] = dot;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) dw[r] = partial[0];
}

// out[r] = sum over j = 0 .. cols - 1 of partial[r * cols + j], in that order (deterministic): a
// row's <da', a> from the fused SwiGLU epilogue's one partial per output tile. A launch of ours
// (programmatic, like the GEMMs around it), not a library reduction, which would cut the
// programmatic chain between the fused GEMM and the dgrad after it (a ~12 us idle GPU at the
// layer's T = 8192, bench/NOTES.md v0.29).
extern "C" __global__ void row_partial_sums(const float* __restrict__ partial, int rows, int cols,
                                            float* __restrict__ out) {
  wait_prior_grids();
  TRACE_SCOPE();
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    const float* p = partial + (i64)r * cols;
    float s = 0.f;
    for (int j = 0; j < cols; ++j) s += p[j];
    out[r] = s;
  }
}
