// The SOL-080 contract's own elementwise and router stages (sol080.md steps 3-4 and 7-10).
#include "common/types.cuh"

// t = bf16(d_act * up); d_up = bf16(d_act * bf16(silu(gate))); d_gate = bf16(t * sig * (1 + gate (1 - sig))).
// Inputs are [T, I]; row t of the output is [d_gate(t) | d_up(t)] ([T, 2I]), so that one GEMM
// gives both weight gradients and the dgrad reads both halves as two K segments.
__device__ __forceinline__ void contract_swiglu_backward(float da, i64 i, const bf16_t* __restrict__ gate,
                                                         const bf16_t* __restrict__ up,
                                                         bf16_t* __restrict__ d_gate_up, int I) {
  const float gv = bf16_to_f32(gate[i]), uv = bf16_to_f32(up[i]);
  const float t = round_bf16(da * uv);
  const float sig = sigmoid_f32(gv);
  const i64 row = i / I, out = row * 2 * I + (i - row * I);
  d_gate_up[out + I] = f32_to_bf16(da * round_bf16(gv * sig));
  d_gate_up[out] = f32_to_bf16(t * sig * (1.f + gv * (1.f - sig)));
}

extern "C" __global__ void sol080_swiglu_backward(const bf16_t* __restrict__ d_act,
                                                  const bf16_t* __restrict__ gate,
                                                  const bf16_t* __restrict__ up,
                                                  bf16_t* __restrict__ d_gate_up, int I, i64 n,
                                                  const int* cancel) {
  if (cancelled(cancel)) return;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    contract_swiglu_backward(bf16_to_f32(d_act[i]), i, gate, up, d_gate_up, I);
}

// The same from d_act's split-K pieces (fp32 [pieces][n]): d_act = bf16(their sum, in order).
extern "C" __global__ void sol080_swiglu_backward_pieces(const float* __restrict__ d_act_pieces,
                                                         int pieces, const bf16_t* __restrict__ gate,
                                                         const bf16_t* __restrict__ up,
                                                         bf16_t* __restrict__ d_gate_up, int I, i64 n,
                                                         const int* cancel) {
  if (cancelled(cancel)) return;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    float da = 0.f;
    for (int s = 0; s < pieces; ++s) da += d_act_pieces[s * n + i];
    contract_swiglu_backward(round_bf16(da), i, gate, up, d_gate_up, I);
  }
}

// bf16(sum of split-K pieces, in order): fp32 [pieces][n] -> bf16 [n].
extern "C" __global__ void sum_pieces_bf16(const float* __restrict__ pieces_, int pieces, i64 n,
                                           bf16_t* __restrict__ out, const int* cancel) {
  if (cancelled(cancel)) return;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < pieces; ++s) v += pieces_[s * n + i];
    out[i] = f32_to_bf16(v);
  }
}

// One block per token: q = sum_h g^2 / K (per-thread sums, then a fixed-order tree), c = (q - sum_k q w_k / S) / S with
// S = sum_k w_k + 1e-20; grl[t, e] = (sum over k with idx == e of c) * mask * s (1 - s), written
// as bf16 hi (= the contract's bf16(grl)) and lo = bf16(grl - hi).
constexpr int kTokThreads = 256;

extern "C" __global__ void __launch_bounds__(kTokThreads)
sol080_router(const bf16_t* __restrict__ grad_out, const float* __restrict__ topk_w,
              const i64* __restrict__ topk_idx, const float* __restrict__ mask,
              const float* __restrict__ scores, int T, int H, int E, int K,
              bf16_t* __restrict__ hi, bf16_t* __restrict__ lo, const int* cancel) {
  if (cancelled(cancel)) return;  // also keeps a bad index from reaching the scatter below
  __shared__ float partial[kTokThreads];
  __shared__ float c_shared;
  const int t = blockIdx.x;
  float sq = 0.f;
  const bf16_t* row = grad_out + (i64)t * H;
  if (H % 8 == 0 && ((unsigned long long)grad_out & 15) == 0) {  // 16-byte loads: 8 values each
    for (int c = threadIdx.x; c < H / 8; c += kTokThreads) {
      const uint4 v = *(const uint4*)(row + 8 * c);
      const u32 w[4] = {v.x, v.y, v.z, v.w};
      #pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float a = bf16_to_f32((bf16_t)(w[q] & 0xffff)), b = bf16_to_f32((bf16_t)(w[q] >> 16));
        sq += a * a + b * b;
      }
    }
  } else {
    for (int h = threadIdx.x; h < H; h += kTokThreads) {
      const float v = bf16_to_f32(row[h]);
      sq += v * v;
    }
  }
  partial[threadIdx.x] = sq;
  __syncthreads();
  for (int s = kTokThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float q = partial[0] / (float)K;
    float S = 0.f;
    for (int k = 0; k < K; ++k) S += topk_w[(i64)t * K + k];
    S += 1e-20f;
    float sum = 0.f;
    for (int k = 0; k < K; ++k) sum += q * topk_w[(i64)t * K + k] / S;
    c_shared = (q - sum) / S;
  }
  __syncthreads();
  const float c = c_shared;
  for (int e = threadIdx.x; e < E; e += kTokThreads) {
    float G = 0.f;
    for (int k = 0; k < K; ++k) if (topk_idx[(i64)t * K + k] == e) G += c;
    const i64 at = (i64)t * E + e;
    const float s = scores[at];
    const float grl = G * mask[at] * s * (1.f - s);
    const bf16_t h = f32_to_bf16(grl);
    hi[at] = h;
    lo[at] = f32_to_bf16(grl - bf16_to_f32(h));
  }
}
