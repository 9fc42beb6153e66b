// Router kernels: sigmoid + bias-corrected group-limited top-k forward, and the routing-weight
// gradient back to the logits. fp32 throughout.
#include "common/types.cuh"

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// (value desc, index asc): does candidate (v, i) beat (bv, bi)?
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  #pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (beats(ov, oi, v, i)) { v = ov; i = oi; }
  }
}

// One warp per token. Dynamic shared memory: per warp E + n_group floats (keys, group scores).
// key = sigmoid(logit) + bias, NaN -> -inf, experts of dropped groups -> -inf; then K rounds of
// warp argmax over the not-yet-picked experts (ties: lower index), as the NumPy reference's
// stable argsort does.
extern "C" __global__ void router_topk(const float* __restrict__ logits, const float* __restrict__ bias,
                                       int T, int E, int K, int n_group, int topk_group, int norm,
                                       float scale, float* __restrict__ scores, i64* __restrict__ topk_idx,
                                       float* __restrict__ topk_w) {
  wait_prior_grids();
  TRACE_SCOPE();
  extern __shared__ float smem_keys[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * warps + warp;
  if (t >= T) return;
  float* key = smem_keys + warp * (E + n_group);
  for (int e = lane; e < E; e += 32) {
    const float s = sigmoid_f32(logits[(i64)t * E + e]);
    scores[(i64)t * E + e] = s;
    const float c = s + bias[e];
    key[e] = c != c ? neg_inf() : c;
  }
  __syncwarp();
  if (n_group > 1) {
    const int per = E / n_group;
    // Each lane scores its groups (sum of the two largest keys), then lane 0 keeps the best
    // topk_group groups (ties: lower group index) and broadcasts them as a bit mask.
    float* gscore = key + E;
    for (int g = lane; g < n_group; g += 32) {
      float m1 = neg_inf(), m2 = neg_inf();
      for (int j = 0; j < per; ++j) {
        const float v = key[g * per + j];
        if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) { m2 = v; }
      }
      gscore[g] = m1 + m2;
    }
    __syncwarp();
    unsigned long long kept = 0ull;  // n_group <= 64 (checked on the host)
    if (lane == 0) {
      for (int r = 0; r < topk_group; ++r) {
        int bi = -1; float bv = 0.f;
        for (int g = 0; g < n_group; ++g) {
          if (kept >> g & 1ull) continue;
          if (bi < 0 || beats(gscore[g], g, bv, bi)) { bv = gscore[g]; bi = g; }
        }
        kept |= 1ull << bi;
      }
    }
    kept = __shfl_sync(0xffffffffu, kept, 0);
    for (int e = lane; e < E; e += 32)
      if (!(kept >> (e / per) & 1ull)) key[e] = neg_inf();
    __syncwarp();
  }
  float wsum = 0.f, wk = 0.f;
  int mine = -1;  // lane k keeps the k-th pick
  for (int k = 0; k < K; ++k) {
    float bv = neg_inf(); int bi = 0x7fffffff;
    bool any = false;
    for (int e = lane; e < E; e += 32) {
      const float v = key[e];
      if (v != v) continue;  // already picked
      if (!any || beats(v, e, bv, bi)) { bv = v; bi = e; any = true; }
    }
    warp_argmax(bv, bi);
    __syncwarp();  // every lane's reads of key[] precede the write below (shuffles do not order memory)
    if (lane == 0) key[bi] = __int_as_float(0xffc00000);  // NaN: never beats anything again
    __syncwarp();
    const float s = scores[(i64)t * E + bi];
    wsum += s;
    if (lane == k) { mine = bi; wk = s; }
  }
  if (lane < K) {
    float w = wk;
    if (norm) w = w / (wsum + 1e-20f);
    topk_idx[(i64)t * K + lane] = mine;
    topk_w[(i64)t * K + lane] = w * scale;
  }
}

// dL/dlogits [T, E] from the routing-weight gradient dw (found per slot through row_of_slot in
// the expert-sorted dw array), written as a bf16 pair hi + lo = fp32 value (to 2^-17): the router
// GEMMs then run on the bf16 tensor cores with fp32-level accuracy. One warp per token (K <= 32,
// router_topk's limit too): lane k holds slot k; the token's two sums over its slots run in slot
// order on every lane, then each lane writes experts lane, lane + 32, ... (zero where no slot
// picked them). hi and lo lie side by side in hi_lo ([T, 2E], row t = [hi(t) | lo(t)]), the layout
// router.py reads.
extern "C" __global__ void router_backward(const float* __restrict__ dw_sorted,
                                           const int* __restrict__ row_of_slot,
                                           const float* __restrict__ scores, const i64* __restrict__ topk_idx,
                                           const float* __restrict__ topk_w, int T, int E, int K,
                                           int norm, float scale, bf16_t* __restrict__ hi_lo) {
  wait_prior_grids();
  TRACE_SCOPE();
  const int lane = threadIdx.x % 32;
  const int t = (int)(((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  if (t >= T) return;  // (the same for the whole warp)
  int ek = -1;
  float dwk = 0.f, wk = 0.f, sk = 0.f;
  if (lane < K) {
    ek = (int)topk_idx[(i64)t * K + lane];
    dwk = dw_sorted[row_of_slot[(i64)t * K + lane]];
    wk = topk_w[(i64)t * K + lane];
    sk = scores[(i64)t * E + ek];
  }
  float dl = 0.f;  // slot k's dL/dlogit, on lane k
  if (norm) {
    float denom = 0.f, dot = 0.f;
    for (int k = 0; k < K; ++k) {
      denom += __shfl_sync(0xffffffffu, sk, k);
      dot += __shfl_sync(0xffffffffu, dwk, k) * __shfl_sync(0xffffffffu, wk, k);
    }
    denom += 1e-20f;
    dl = (scale / denom) * (dwk - dot / scale);
  } else {
    dl = scale * dwk;
  }
  dl = dl * sk * (1.f - sk);
  bf16_t* row = hi_lo + (i64)t * 2 * E;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const unsigned here = __ballot_sync(0xffffffffu, lane < K && ek >= e0 && ek < e0 + 32);
    float dlogit = 0.f;
    for (unsigned m = here; m; m &= m - 1) {  // the slots that picked an expert of this chunk
      const int k = __ffs(m) - 1;
      const int e = __shfl_sync(0xffffffffu, ek, k);
      const float v = __shfl_sync(0xffffffffu, dl, k);
      if (e == e0 + lane) dlogit = v;
    }
    if (e0 + lane < E) {
      const bf16_t h = f32_to_bf16(dlogit);
      row[e0 + lane] = h;
      row[E + e0 + lane] = f32_to_bf16(dlogit - bf16_to_f32(h));
    }
  }
}

// out[i] = sum of partial[s * n + i] over s = 0 .. splits - 1, in that order (deterministic): the
// split-K router weight gradient's pieces.
extern "C" __global__ void sum_splits(const float* __restrict__ partial, int splits, long long n,
                                      float* __restrict__ out, const int* cancel) {
  wait_prior_grids();
  TRACE_SCOPE();
  if (cancelled(cancel)) return;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = sum_of_pieces(partial, splits, n, i);
}
