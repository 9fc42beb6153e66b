// The SOL-080 contract's own elementwise and router stages (sol080.md steps 3-4 and 7-10).
#include "common/hopper.cuh"
#include "common/swiglu_contract.cuh"
#include "common/topk_check.cuh"

// t = bf16(d_act * up); d_up = bf16(d_act * bf16(silu(gate))); d_gate = bf16(t * sig * (1 + gate (1 - sig))).
// Inputs are [T, I]; row t of the output holds d_gate(t) | d_up(t) side by side, rows ld apart
// (the workspace row [hi | d_gate | d_up | lo], cupy_moe/gpu/sol080.py _Acts), so that one GEMM
// gives both weight gradients and the dgrad reads both halves as two K segments.
__device__ __forceinline__ void contract_swiglu_grad(float da, float gv, float uv, float& dg, float& du) {
  const float t = round_bf16(da * uv);
  const float sig = sigmoid_f32(gv);
  du = da * round_bf16(gv * sig);
  dg = t * sig * (1.f + gv * (1.f - sig));
}

__device__ __forceinline__ i64 d_gate_at(i64 i, int I, i64 ld) {  // element i of [T, I] -> its d_gate
  const i64 row = i / I;
  return row * ld + (i - row * I);
}

__device__ __forceinline__ void contract_swiglu_backward(float da, i64 i, const bf16_t* __restrict__ gate,
                                                         const bf16_t* __restrict__ up,
                                                         bf16_t* __restrict__ d_gate_up, int I, i64 ld) {
  float dg, du;
  contract_swiglu_grad(da, bf16_to_f32(gate[i]), bf16_to_f32(up[i]), dg, du);
  const i64 out = d_gate_at(i, I, ld);
  d_gate_up[out + I] = f32_to_bf16(du);
  d_gate_up[out] = f32_to_bf16(dg);
}

// Eight elements i .. i + 7 of one row (I % 8 == 0, every array 16-byte aligned): one 16-byte
// load of gate and of up, one 16-byte store of d_gate and of d_up.
__device__ __forceinline__ void contract_swiglu_backward_x8(const float (&da)[8], i64 i,
                                                            const bf16_t* __restrict__ gate,
                                                            const bf16_t* __restrict__ up,
                                                            bf16_t* __restrict__ d_gate_up, int I, i64 ld) {
  const uint4 g4 = *(const uint4*)(gate + i), u4 = *(const uint4*)(up + i);
  const u32 gw[4] = {g4.x, g4.y, g4.z, g4.w}, uw[4] = {u4.x, u4.y, u4.z, u4.w};
  u32 dgw[4], duw[4];
  #pragma unroll
  for (int q = 0; q < 4; ++q) {
    float dg[2], du[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h)
      contract_swiglu_grad(da[2 * q + h], bf16_to_f32((bf16_t)(gw[q] >> (16 * h))),
                           bf16_to_f32((bf16_t)(uw[q] >> (16 * h))), dg[h], du[h]);
    dgw[q] = pack_bf16x2(dg[0], dg[1]);
    duw[q] = pack_bf16x2(du[0], du[1]);
  }
  const i64 out = d_gate_at(i, I, ld);
  *(uint4*)(d_gate_up + out) = make_uint4(dgw[0], dgw[1], dgw[2], dgw[3]);
  *(uint4*)(d_gate_up + out + I) = make_uint4(duw[0], duw[1], duw[2], duw[3]);
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((unsigned long long)p & 15) == 0; }

// Grid-stride loops over 8-element chunks when the rows allow 16-byte accesses, else elements.
#define FOR_EACH_CHUNK8(v, n) \
  for (i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x; v < (n) / 8; v += (i64)gridDim.x * blockDim.x)
#define FOR_EACH_ELEMENT(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

extern "C" __global__ void sol080_swiglu_backward(const bf16_t* __restrict__ d_act,
                                                  const bf16_t* __restrict__ gate,
                                                  const bf16_t* __restrict__ up,
                                                  bf16_t* __restrict__ d_gate_up, int I, i64 n, i64 ld,
                                                  const int* cancel) {
  wait_prior_grids();
  TRACE_SCOPE();
  if (cancelled(cancel)) return;
  if (I % 8 == 0 && ld % 8 == 0 && aligned16(d_act) && aligned16(gate) && aligned16(up) && aligned16(d_gate_up)) {
    FOR_EACH_CHUNK8(v, n) {
      const uint4 a4 = ((const uint4*)d_act)[v];
      const u32 aw[4] = {a4.x, a4.y, a4.z, a4.w};
      float da[8];
      #pragma unroll
      for (int e = 0; e < 8; ++e) da[e] = bf16_to_f32((bf16_t)(aw[e / 2] >> (16 * (e % 2))));
      contract_swiglu_backward_x8(da, 8 * v, gate, up, d_gate_up, I, ld);
    }
    return;
  }
  FOR_EACH_ELEMENT(i, n) contract_swiglu_backward(bf16_to_f32(d_act[i]), i, gate, up, d_gate_up, I, ld);
}

// The same on a few SMs beside a GEMM (SOL-080's SWIGLU_SMS), where one SM must draw several
// times its share of the bandwidth. Each block walks its own contiguous rows in chunks of `rows`
// rows; the bulk-copy engine brings a chunk's d_act, gate and up rows (contiguous [T, I] arrays)
// into one of `stages` (<= kSwigluMaxStages) shared stages, so stages - 1 chunks of loads are in
// flight while the threads turn one into [d_gate | d_up] rows (16-byte stores). The math is the
// fused d_act epilogue's (contract_swiglu_pair: approximate sigmoid, packed products), so the
// same bits as the shipped fused path. Alone on 14 SMs it moves ~63 GB/s an SM with 3 stages of
// ~66 KB (bench/swiglu_bulk.py; 6 stages of half the size: ~46); sol080_swiglu_backward's exact
// sigmoid, one chunk in flight a thread, is issue-bound at ~33. Needs sm_90 (the host launches it
// only there), I % 8 == 0 and 16-byte aligned arrays.
constexpr int kSwigluMaxStages = 8;

extern "C" __global__ void sol080_swiglu_backward_bulk(const bf16_t* __restrict__ d_act,
                                                       const bf16_t* __restrict__ gate,
                                                       const bf16_t* __restrict__ up,
                                                       bf16_t* __restrict__ d_gate_up, int I, int T, i64 ld,
                                                       int rows, int stages, const int* cancel) {
  wait_prior_grids();
  TRACE_SCOPE();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ u64 full[kSwigluMaxStages];
  if (cancelled(cancel)) return;
  const int r0 = (int)((i64)T * blockIdx.x / gridDim.x), r1 = (int)((i64)T * (blockIdx.x + 1) / gridDim.x);
  const int chunks = (r1 - r0 + rows - 1) / rows;
  const i64 stage_elems = (i64)rows * I;  // one input's rows in a stage
  bf16_t* stage0 = (bf16_t*)smem;
  auto issue = [&](int c) {  // thread 0: chunk c's three inputs into stage c % stages
    const int s = c % stages, first = r0 + c * rows, n = min(rows, r1 - first);
    const u32 bytes = (u32)n * I * 2;
    bf16_t* dst = stage0 + (i64)s * 3 * stage_elems;
    mbar_arrive_expect_tx(&full[s], 3 * bytes);
    bulk_load(dst, d_act + (i64)first * I, bytes, &full[s]);
    bulk_load(dst + stage_elems, gate + (i64)first * I, bytes, &full[s]);
    bulk_load(dst + 2 * stage_elems, up + (i64)first * I, bytes, &full[s]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);
    fence_barrier_init();
    for (int c = 0; c < min(chunks, stages); ++c) issue(c);
  }
  __syncthreads();
  const int vecs_per_row = I / 8;
  for (int c = 0; c < chunks; ++c) {
    const int s = c % stages, first = r0 + c * rows, n = min(rows, r1 - first);
    mbar_wait(&full[s], (c / stages) & 1);
    const bf16_t* da_s = stage0 + (i64)s * 3 * stage_elems;
    for (int v = threadIdx.x; v < n * vecs_per_row; v += blockDim.x) {
      const int r = v / vecs_per_row, col = 8 * (v - r * vecs_per_row);
      const i64 at = (i64)r * I + col;
      const uint4 a4 = *(const uint4*)(da_s + at), g4 = *(const uint4*)(da_s + stage_elems + at),
                  u4 = *(const uint4*)(da_s + 2 * stage_elems + at);
      uint4 dg4, du4;
      contract_swiglu_pair(a4.x, g4.x, u4.x, dg4.x, du4.x);
      contract_swiglu_pair(a4.y, g4.y, u4.y, dg4.y, du4.y);
      contract_swiglu_pair(a4.z, g4.z, u4.z, dg4.z, du4.z);
      contract_swiglu_pair(a4.w, g4.w, u4.w, dg4.w, du4.w);
      bf16_t* out = d_gate_up + (i64)(first + r) * ld + col;
      *(uint4*)out = dg4;
      *(uint4*)(out + I) = du4;
    }
    __syncthreads();  // every thread is done with stage s before it is refilled
    if (threadIdx.x == 0 && c + stages < chunks) {
      fence_proxy_async();  // (the generic reads above before the bulk copy's writes)
      issue(c + stages);
    }
  }
#else
  __trap();  // no bulk copies before sm_90
#endif
}

// The same from d_act's split-K pieces (fp32 [pieces][n]): d_act = bf16(their sum, in order).
extern "C" __global__ void sol080_swiglu_backward_pieces(const float* __restrict__ d_act_pieces,
                                                         int pieces, const bf16_t* __restrict__ gate,
                                                         const bf16_t* __restrict__ up,
                                                         bf16_t* __restrict__ d_gate_up, int I, i64 n, i64 ld,
                                                         const int* cancel) {
  wait_prior_grids();
  TRACE_SCOPE();
  if (cancelled(cancel)) return;
  if (I % 8 == 0 && ld % 8 == 0 && aligned16(d_act_pieces) && aligned16(gate) && aligned16(up) &&
      aligned16(d_gate_up)) {
    FOR_EACH_CHUNK8(v, n) {
      float da[8];
      sum_of_pieces_x8(d_act_pieces, pieces, n, 8 * v, da);
      #pragma unroll
      for (int e = 0; e < 8; ++e) da[e] = round_bf16(da[e]);
      contract_swiglu_backward_x8(da, 8 * v, gate, up, d_gate_up, I, ld);
    }
    return;
  }
  FOR_EACH_ELEMENT(i, n)
    contract_swiglu_backward(round_bf16(sum_of_pieces(d_act_pieces, pieces, n, i)), i, gate, up,
                             d_gate_up, I, ld);
}

// bf16(sum of split-K pieces, in order): fp32 [pieces][n] -> bf16 [n].
extern "C" __global__ void sum_pieces_bf16(const float* __restrict__ pieces_, int pieces, i64 n,
                                           bf16_t* __restrict__ out, const int* cancel) {
  wait_prior_grids();
  TRACE_SCOPE();
  if (cancelled(cancel)) return;
  if (n % 8 == 0 && aligned16(pieces_) && aligned16(out)) {
    FOR_EACH_CHUNK8(v, n) {
      float s[8];
      sum_of_pieces_x8(pieces_, pieces, n, 8 * v, s);
      ((uint4*)out)[v] = make_uint4(pack_bf16x2(s[0], s[1]), pack_bf16x2(s[2], s[3]),
                                    pack_bf16x2(s[4], s[5]), pack_bf16x2(s[6], s[7]));
    }
    return;
  }
  FOR_EACH_ELEMENT(i, n) out[i] = f32_to_bf16(sum_of_pieces(pieces_, pieces, n, i));
}

// One warp per token, kRouterWarps tokens per block. The kernel also runs the call's top-k index
// check (common/topk_check.cuh) on the rows it reads, so that check costs no launch of its own;
// it is the call's first kernel, so every later launch can read its verdict. It indexes memory by
// an expert index only after checking it against [0, E), so a bad row cannot send it out of bounds.
// q = sum_h g^2 / K (per-lane sums, then a fixed butterfly); c = (q - sum_k q w_k / S) / S with
// S = sum_k w_k + 1e-20, summed in k order as the contract writes it; grl[t, e] = (sum over k
// with idx == e of c) * mask * s (1 - s), written as bf16 hi (= the contract's bf16(grl)) at
// hi + t ld and lo = bf16(grl - hi) lo_offset elements past it (the workspace row [hi | d_gate |
// d_up | lo], or [hi | lo]).
// It sits alone on the call's critical path, so it is written for latency: every load that does
// not depend on q (the routing row, the first 128 experts' scores and mask) is issued with the
// grad_output row's, and with K <= 32 the routing row stays in the lanes' registers (shuffles,
// no reloads). With K <= 32 and E <= 128 (sol080_router_lanes) the scores and mask go to shared
// memory by cp.async instead of registers, which leaves room for 8 row loads in flight, and the
// index check and the scatter of c run once per routing slot (a match and a shared-memory
// store), not once per slot per expert (bench/NOTES.md v0.37: the kernel 12-16% faster on
// 11-14 SMs).
constexpr int kRouterWarps = 8;
constexpr int kRouterPrefetch = 4;  // experts per lane whose scores and mask load up front (E <= 128)
constexpr int kRouterLaneExperts = 32 * kRouterPrefetch;

// A bf16 value and its square are exact in fp32, so fma(a, a, s) rounds once, as s + a * a does:
// one convert and one FMA an element (the pairwise form took an FMUL, an FFMA and an FADD a pair).
// q's summation order is free (the contract fixes only the formula); two accumulators halve
// the dependent chain a lane runs per token.
__device__ __forceinline__ void add_squares_bf16x8(uint4 v, float& s) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  #pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float a = __uint_as_float(w[q] << 16), b = __uint_as_float(w[q] & 0xffff0000u);
    s = fmaf(a, a, s);
    s = fmaf(b, b, s);
  }
}

constexpr int kRowLoads = 8;  // 16-byte loads of the row in flight per lane (4: the same speed)

__device__ __forceinline__ float row_sum_squares(const bf16_t* __restrict__ row, int H, bool vector16,
                                                 int lane) {
  float sq = 0.f;
  if (vector16) {
    const uint4* row16 = (const uint4*)row;
    const int n16 = H / 8;
    float s[2] = {0.f, 0.f};
    int c = lane;
    for (; c + 32 * (kRowLoads - 1) < n16; c += 32 * kRowLoads) {  // kRowLoads loads in flight per lane
      uint4 v[kRowLoads];
      #pragma unroll
      for (int u = 0; u < kRowLoads; ++u) v[u] = row16[c + 32 * u];
      #pragma unroll
      for (int u = 0; u < kRowLoads; ++u) add_squares_bf16x8(v[u], s[u & 1]);
    }
    for (; c < n16; c += 32) add_squares_bf16x8(row16[c], s[0]);
    sq = s[0] + s[1];
  } else {
    for (int h = lane; h < H; h += 32) {
      const float v = bf16_to_f32(row[h]);
      sq = fmaf(v, v, sq);
    }
  }
  #pragma unroll
  for (int m = 16; m > 0; m /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, m);  // every lane: the sum
  return sq;
}

// The k-th routing slot's expert and weight: from the lanes' registers when K <= 32. An index
// outside [0, E) reads as -1, which matches no expert (the check rejects the call anyway): 32-bit
// experts, one shuffle each.
__device__ __forceinline__ int expert_or_none(i64 e, int E) { return e >= 0 && e < E ? (int)e : -1; }

template <bool kLanes>  // K <= 32 known at compile time (sol080_router_lanes)
struct RoutingRow {
  const i64* idx;
  const float* w;
  int K, E;
  int lane_e;
  float lane_w;
  // Slot k's expert and weight sit in lane k.
  __device__ __forceinline__ bool in_lanes() const { return kLanes || K <= 32; }
  __device__ __forceinline__ int expert(int k) const {
    return in_lanes() ? __shfl_sync(0xffffffffu, lane_e, k) : expert_or_none(idx[k], E);
  }
  __device__ __forceinline__ float weight(int k) const {
    return in_lanes() ? __shfl_sync(0xffffffffu, lane_w, k) : w[k];
  }
};

__device__ __forceinline__ void write_grl(float grl, i64 at, bf16_t* __restrict__ hi, bf16_t* __restrict__ lo) {
  const bf16_t h = f32_to_bf16(grl);
  hi[at] = h;
  lo[at] = f32_to_bf16(grl - bf16_to_f32(h));
}

// Blocks an SM holds at once (sol080_router_lanes): 6 keeps it within 40 registers (no spills),
// where without a minimum it took 48 and an SM held 5. The kernel is latency-bound, so more
// tokens in flight an SM pay where its grid outnumbers its SMs many times over (beside grad_Wd
// on ~14 SMs): SOL-080 3072 / 6144 / 4093 -3..-4 us, 1321 +1.4..+2.6, the mean -0.4..-1.3 in
// three A/Bs (bench/NOTES.md v0.35; after v0.37's rewrite 5, 7 and 8 blocks measured the same).
// ROUTER_MIN_BLOCKS 0: no minimum (the A/B path, sol080.ROUTER_MIN_BLOCKS).
#ifndef ROUTER_MIN_BLOCKS
#define ROUTER_MIN_BLOCKS 6
#endif
#if ROUTER_MIN_BLOCKS > 0
#define ROUTER_LAUNCH_BOUNDS __launch_bounds__(kRouterWarps * 32, ROUTER_MIN_BLOCKS)
#else
#define ROUTER_LAUNCH_BOUNDS __launch_bounds__(kRouterWarps * 32)
#endif

#define ROUTER_PARAMS                                                                                \
  const bf16_t* __restrict__ grad_out, const float* __restrict__ topk_w,                             \
      const i64* __restrict__ topk_idx, const float* __restrict__ mask,                              \
      const float* __restrict__ scores, int T, int H, int E, int K, bf16_t* __restrict__ hi_rows,    \
      int ld, int lo_offset, int* __restrict__ check_scratch, volatile int* check_report
#define ROUTER_ARGS                                                                                  \
  grad_out, topk_w, topk_idx, mask, scores, T, H, E, K, hi_rows, ld, lo_offset, check_scratch,       \
      check_report

// The router's body. kLanes: K <= 32 and E <= kRouterLaneExperts (the host's choice), so a
// routing slot sits in each lane and each lane's experts are prefetched: the index check and the
// scatter of c run once per slot (a match and a shared-memory store), not once per slot per
// expert, and none of the general path's code takes registers. Both forms write the same bits.
template <bool kLanes>
__device__ __forceinline__ void route_tokens(ROUTER_PARAMS) {
  __shared__ int first_bad[2];
  // The lanes' form: each warp's token's G, scores and mask rows (the last two by cp.async, so
  // that no registers hold them across the sum of squares).
  __shared__ float G_rows[kLanes ? kRouterWarps : 1][kRouterLaneExperts];
  __shared__ float score_rows[kLanes ? kRouterWarps : 1][kRouterLaneExperts];
  __shared__ float mask_rows[kLanes ? kRouterWarps : 1][kRouterLaneExperts];
  if (threadIdx.x == 0) first_bad[0] = first_bad[1] = kNoRow;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * kRouterWarps + threadIdx.x / 32;
  if (t < T) {  // the whole warp: t is the warp's
    const i64 at0 = (i64)t * E;  // row t of scores and mask
    bf16_t* const hi = hi_rows + (i64)t * ld;
    bf16_t* const lo = hi + lo_offset;
    RoutingRow<kLanes> r{topk_idx + (i64)t * K, topk_w + (i64)t * K, K, E, -1, 0.f};
    if (r.in_lanes() && lane < K) {
      r.lane_e = expert_or_none(r.idx[lane], E);
      r.lane_w = r.w[lane];
    }
    const int warp = threadIdx.x / 32;
    float s_pre[kRouterPrefetch], m_pre[kRouterPrefetch];
    #pragma unroll
    for (int j = 0; j < kRouterPrefetch; ++j) {
      const int e = lane + 32 * j;
      if constexpr (kLanes) {
        if (e < E) {
          cp_async_4(&score_rows[warp][e], scores + at0 + e);
          cp_async_4(&mask_rows[warp][e], mask + at0 + e);
        }
      } else {
        s_pre[j] = e < E ? scores[at0 + e] : 0.f;
        m_pre[j] = e < E ? mask[at0 + e] : 0.f;
      }
    }
    if constexpr (kLanes) cp_async_commit();
    const float q = row_sum_squares(grad_out + (i64)t * H, H,
                                    H % 8 == 0 && ((unsigned long long)grad_out & 15) == 0, lane) / (float)K;

    bool out_of_range, repeated;
    if constexpr (!kLanes) {
      // The index check spread over the lanes: slot k is range-checked and compared with the
      // earlier slots by lane k % 32.
      TopkRowFaults f;
      for (int k = lane; k < K; k += 32) add_topk_slot_faults(f, r.idx, k, E);
      out_of_range = __any_sync(0xffffffffu, f.out_of_range);
      repeated = __any_sync(0xffffffffu, f.repeated);
    }
    float S = 0.f;
    for (int k = 0; k < K; ++k) S += r.weight(k);
    S += 1e-20f;
    // sum_k q w_k / S in k order: with K <= 32 lane k divides its own term, so the K divisions
    // run side by side instead of one after another (the same terms, summed in the same order).
    const float term = q * r.lane_w / S;
    float sum = 0.f;
    for (int k = 0; k < K; ++k) sum += r.in_lanes() ? __shfl_sync(0xffffffffu, term, k) : q * r.weight(k) / S;
    const float c = (q - sum) / S;

    if constexpr (kLanes) {
      // G[e] = 0 + c at the slots' experts, 0 elsewhere: each slot stores its term into the warp's
      // row of G (a repeated expert fails the check, and only its first slot stores).
      const LaneSlotFaults f = lane_topk_slot_faults(r.lane_e, K, lane);
      out_of_range = __any_sync(0xffffffffu, f.out_of_range);
      repeated = __any_sync(0xffffffffu, f.repeated);
      float* const G_row = G_rows[warp];
      #pragma unroll
      for (int j = 0; j < kRouterPrefetch; ++j) G_row[lane + 32 * j] = 0.f;
      __syncwarp();
      if (f.first_of_expert) G_row[r.lane_e] = 0.f + c;
      __syncwarp();
      cp_async_wait<0>();  // (a lane reads back only the scores and mask it copied)
      #pragma unroll
      for (int j = 0; j < kRouterPrefetch; ++j) {
        const int e = lane + 32 * j;
        if (e < E) {
          const float s = score_rows[warp][e];
          write_grl(G_row[e] * mask_rows[warp][e] * s * (1.f - s), e, hi, lo);
        }
      }
    } else {
      float G[kRouterPrefetch] = {};  // each slot's expert fetched once, matched against the lane's experts
      #pragma unroll 1  // unrolled, ptxas moved the prefetched values to the stack
      for (int k = 0; k < K; ++k) {
        const int ek = r.expert(k);  // a shuffle: every lane takes part
        #pragma unroll
        for (int j = 0; j < kRouterPrefetch; ++j) if (ek == lane + 32 * j) G[j] += c;
      }
      #pragma unroll
      for (int j = 0; j < kRouterPrefetch; ++j) {
        const int e = lane + 32 * j;
        if (e < E) write_grl(G[j] * m_pre[j] * s_pre[j] * (1.f - s_pre[j]), e, hi, lo);
      }
      for (int e0 = 32 * kRouterPrefetch; e0 < E; e0 += 32) {  // experts past the prefetched ones
        const int e = e0 + lane;
        float G = 0.f;
        for (int k = 0; k < K; ++k) if (r.expert(k) == e) G += c;
        if (e < E) {
          const float s = scores[at0 + e];
          write_grl(G * mask[at0 + e] * s * (1.f - s), e, hi, lo);
        }
      }
    }
    if (lane == 0 && out_of_range) atomicMin(&first_bad[0], t);
    if (lane == 0 && repeated) atomicMin(&first_bad[1], t);
  }
  __syncthreads();
  if (threadIdx.x == 0) publish_topk_verdict(first_bad[0], first_bad[1], check_scratch, check_report);
}

// The general form (K > 32 or E > 128: not the contract's shapes), with no spills at 64 registers.
extern "C" __global__ void __launch_bounds__(kRouterWarps * 32, 1) sol080_router(ROUTER_PARAMS) {
  wait_prior_grids();
  TRACE_SCOPE();
  route_tokens<false>(ROUTER_ARGS);
}

extern "C" __global__ void ROUTER_LAUNCH_BOUNDS sol080_router_lanes(ROUTER_PARAMS) {
  wait_prior_grids();
  TRACE_SCOPE();
  route_tokens<true>(ROUTER_ARGS);
}
