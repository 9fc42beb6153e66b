// What leaves a Hopper GEMM tile: bf16 / fp32 stores from registers or through shared memory
// and TMA, the fused SwiGLU backward (in the consumers, or staged for the epilogue warps), and
// the sum of a cluster's split-K pieces.
#pragma once
#include "../common/swiglu_contract.cuh"
#include "sm90_plan.cuh"

namespace gemm {
namespace sm90 {

// Accumulator fragment of wgmma m64nN: warp w of the warpgroup owns rows 16w..16w+15; for each
// 8-column block j, d[4j + 2h + e] is row 16w + lane / 4 + 8h, column 8j + 2 (lane % 4) + e.
// row_off: the first of the block's 64 rows within the tile.
template <class Cfg>
__device__ __forceinline__ void store_tile_direct(const GemmParams& p, const Tile& tc,
                                                  const float (&acc)[Cfg::BN / 2], int row_off, int warp, int lane) {
  const i64 c_off = Cfg::GROUPING == kKGrouped || Cfg::SPLIT_K ? (i64)tc.group * p.c_group_stride : 0;
  const int row0 = tc.m0 + row_off + 16 * warp + lane / 4;
  const int col0 = tc.n0 + 2 * (lane % 4);
  #pragma unroll
  for (int j = 0; j < Cfg::BN / 8; ++j) {
    const int col = col0 + 8 * j;
    if (col >= p.n) continue;  // n is even on this path: col + 1 < n too
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= tc.m_hi) continue;
      const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      if constexpr (Cfg::ROW_SPLIT) {
        if (row < p.c2_rows) {
          *(float2*)((float*)p.c2 + (i64)row * p.ldc2 + col) = make_float2(v0, v1);
          continue;
        }
      }
      const i64 at = c_off + (i64)(Cfg::ROW_SPLIT ? row - p.c2_rows : row) * p.ldc + col;
      if constexpr (Cfg::EPILOGUE == kStoreBf16) {
        *(u32*)((bf16_t*)p.c + at) = pack_bf16x2(v0, v1);
      } else if constexpr (Cfg::EPILOGUE == kStoreF32) {
        *(float2*)((float*)p.c + at) = make_float2(v0, v1);
      } else {
        float2* dst = (float2*)((float*)p.c + at);
        const float2 old = *dst;
        *dst = make_float2(old.x + v0, old.y + v1);
      }
    }
  }
}

// dg, du (packed bf16 pairs) of two adjacent elements from da' (d), gate and up (packed bf16
// pairs) and the row's routing weight w; contract: SOL-080's rounding points, no weight. PACKED
// (Cfg::PACKED_CONTRACT): the contract's products of two bf16 values as mul_bf16x2, the same
// bits with fewer instructions (the epilogue's math competes with the MMAs for issue slots);
// else element by element in fp32 (the A/B path).
template <bool PACKED>
__device__ __forceinline__ void swiglu_grad_pair(const float (&d)[2], u32 g2, u32 u2, float w, bool contract,
                                                 u32& dg2, u32& du2) {
  const float gv[2] = {bf16_to_f32(g2 & 0xffff), bf16_to_f32(g2 >> 16)};
  float sg[2], dg[2], du[2];
  #pragma unroll
  for (int e = 0; e < 2; ++e) sg[e] = sigmoid_fast(gv[e]);
  if (contract && PACKED) {  // sol080.md: d_act = bf16(.), then the contract on packed pairs
    contract_swiglu_pair(pack_bf16x2(d[0], d[1]), gv, sg, u2, dg2, du2);
    return;
  }
  const float uv[2] = {bf16_to_f32(u2 & 0xffff), bf16_to_f32(u2 >> 16)};
  #pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (contract) {
      const float da = round_bf16(d[e]);
      dg[e] = round_bf16(da * uv[e]) * sg[e] * (1.f + gv[e] * (1.f - sg[e]));
      du[e] = da * round_bf16(gv[e] * sg[e]);
    } else {
      const float da = w * d[e];
      dg[e] = da * uv[e] * (sg[e] * (1.f + gv[e] * (1.f - sg[e])));
      du[e] = da * (gv[e] * sg[e]);
    }
  }
  dg2 = pack_bf16x2(dg[0], dg[1]);
  du2 = pack_bf16x2(du[0], du[1]);
}

// A row's routing weight for the SwiGLU epilogue (1 outside the rows or without weights).
__device__ __forceinline__ float swiglu_row_weight(const GemmParams& p, int row, int m_hi) {
  return p.e_row_weight && row < m_hi ? p.e_row_weight[p.e_row_index ? p.e_row_index[row] : row] : 1.f;
}

// SwiGLU backward from the unweighted activation gradient da' (the accumulators, never stored):
// da = w da'; dg = bf16(da u silu'(g)), du = bf16(da silu(g)); routed experts (e_aw set) also
// get aw = bf16(w a) and one partial of <da', a> per (row, column tile), summed by the caller in a
// fixed order. The same fp32 operations as cuda_src/swiglu.cu, or with e_contract those of
// cuda_src/sol080.cu (SOL-080's rounding points). dg and du rows are e_ld_grad apart (or ldc).
// Operands are read a batch of column blocks at a time, all loads before any store, so their
// latencies overlap.
template <class Cfg>
__device__ __forceinline__ void swiglu_backward_tile(const GemmParams& p, const Tile& tc,
                                                     const float (&acc)[Cfg::BN / 2], int row_off, int warp, int lane) {
  // 8-column blocks per batch; a ping-pong warpgroup holds twice the accumulators (and the other
  // warpgroup's MMAs hide its epilogue anyway), and so does a 256-wide tile.
  constexpr int JB = Plan<Cfg>::PINGPONG || Cfg::BN == 256 ? 4 : 8;
  const int row0 = tc.m0 + row_off + 16 * warp + lane / 4;
  const int col0 = tc.n0 + 2 * (lane % 4);
  const bool routed = p.e_aw != nullptr;
  const i64 ld_grad = p.e_ld_grad ? p.e_ld_grad : p.ldc;  // dg and du's rows
  float w[2], dot[2] = {0.f, 0.f};
  #pragma unroll
  for (int h = 0; h < 2; ++h) w[h] = swiglu_row_weight(p, row0 + 8 * h, tc.m_hi);
  #pragma unroll
  for (int jb = 0; jb < Cfg::BN / 8; jb += JB) {
    u32 g2[JB][2], u2[JB][2], a2[JB][2];
    #pragma unroll
    for (int j = 0; j < JB; ++j)
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h, col = col0 + 8 * (jb + j);
        const bool ok = row < tc.m_hi && col < p.n;
        const i64 at = (i64)row * p.ldc + col;
        g2[j][h] = ok ? __ldg((const unsigned int*)((const bf16_t*)p.e_gate + at)) : 0u;
        u2[j][h] = ok ? __ldg((const unsigned int*)((const bf16_t*)p.e_up + at)) : 0u;
        a2[j][h] = ok && routed ? __ldg((const unsigned int*)((const bf16_t*)p.e_act + at)) : 0u;
      }
    #pragma unroll
    for (int j = 0; j < JB; ++j)
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h, col = col0 + 8 * (jb + j);
        if (row >= tc.m_hi || col >= p.n) continue;
        const i64 at = (i64)row * p.ldc + col, at_grad = (i64)row * ld_grad + col;
        const float d[2] = {acc[4 * (jb + j) + 2 * h], acc[4 * (jb + j) + 2 * h + 1]};
        u32 dg2, du2;
        swiglu_grad_pair<Cfg::PACKED_CONTRACT>(d, g2[j][h], u2[j][h], w[h], p.e_contract, dg2, du2);
        *(u32*)((bf16_t*)p.e_dg + at_grad) = dg2;
        *(u32*)((bf16_t*)p.e_du + at_grad) = du2;
        if (routed) {
          const float a0 = bf16_to_f32(a2[j][h] & 0xffff), a1 = bf16_to_f32(a2[j][h] >> 16);
          *(u32*)((bf16_t*)p.e_aw + at) = pack_bf16x2(w[h] * a0, w[h] * a1);
          dot[h] += d[0] * a0 + d[1] * a1;
        }
      }
  }
  if (!p.e_row_partial) return;
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], 1);
    dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], 2);
    const int row = row0 + 8 * h;
    if (lane % 4 == 0 && row < tc.m_hi) p.e_row_partial[(i64)row * p.e_partial_ld + tc.n0 / Cfg::BN] = dot[h];
  }
}

// Staged SwiGLU epilogue. The buffer holds a tile's da' as fp32 rows of BN = 128 (512 bytes),
// 16-byte chunk c of row r at chunk c ^ (2 (r % 4)): the consumers' float2 writes (4 rows x 2
// chunks per half-warp) and the epilogue warps' row reads are free of bank conflicts.
__device__ __forceinline__ int dacc_offset(int r, int chunk) {
  return r * 512 + ((chunk ^ (2 * (r % 4))) << 4);
}

// The same for row r0 + q of an epilogue warp's batch (r0 a multiple of 4, q < 4): the swizzle's
// r % 4 is q, known at compile time in the batch's unrolled loop.
__device__ __forceinline__ int dacc_offset_in_batch(int r0, int q, int chunk) {
  return (r0 + q) * 512 + ((chunk ^ (2 * q)) << 4);
}

// A consumer warpgroup's accumulators (its 64 rows) into the buffer.
template <class Cfg>
__device__ __forceinline__ void stage_accumulators(const float (&acc)[Cfg::BN / 2], u8* dacc, int wg, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  #pragma unroll
  for (int j = 0; j < Cfg::BN / 8; ++j)
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 64 * wg + 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4);
      *(float2*)(dacc + dacc_offset(r, col / 4) + 4 * (col % 4)) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
}

// Each of four rows' sum over the warp (v[q]: the lane's term of row q), by the tree of four
// separate xor-16, 8, 4, 2, 1 butterflies, so with their bits, in 6 shuffles instead of 20: the
// first step swaps half the rows with the other half-warp, the second half of the rest, so lanes
// 8 q .. 8 q + 7 end with row q's sum. (The staged epilogue's shuffles and adds compete with the
// consumers for issue slots.)
__device__ __forceinline__ float warp_sum_4_rows(const float (&v)[4], int lane) {
  const bool upper = lane & 16;  // lanes 0-15 keep rows 0 and 1, lanes 16-31 rows 2 and 3
  const float r0 = (upper ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, upper ? v[0] : v[2], 16);
  const float r1 = (upper ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, upper ? v[1] : v[3], 16);
  const bool second = lane & 8;  // of the two rows a half-warp holds, lanes 8-15 (24-31) keep the second
  float s = (second ? r1 : r0) + __shfl_xor_sync(0xffffffffu, second ? r0 : r1, 8);
  #pragma unroll
  for (int m = 4; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  return s;
}

// The epilogue warps (ew = 0 .. E_WARPS - 1): for every tile of the CTA, once the consumers have
// staged its da', rows ew * R, ew * R + E_WARPS * R, ... (R at a time), one row per warp, 4
// columns per lane: dg, du (and aw = bf16(w a), one partial of <da', a> per row and tile) from
// gate, up (and act), 8-byte loads and stores, coalesced along the row. Then the buffer is
// handed back. Columns past n and rows past the tile's group are neither read nor written.
// The operands of the next R rows load while the current ones are computed, and a tile's first
// rows before its da' is staged (they do not depend on it). What these warps still cost the main
// loop is mostly their math's issue slots (SOL-080 d_act at T = 8192: 183 us, 145 without the
// work, 163 without the math; bench/NOTES.md v0.7).
template <class Cfg>
struct EpilogueRows {
  static constexpr int R = 4;  // rows per batch; two batches in flight per warp
  uint2 g2[R], u2[R], a2[R];
  float w_lane;  // lane q < R: row r0 + q's routing weight (finish broadcasts it to the warp)

  __device__ __forceinline__ void load(const GemmParams& p, const Tile& tc, int r0, int rows, int col, int lane) {
    const bool routed = p.e_aw != nullptr, col_ok = col < p.n;
    // The batch's first row once, then a row pointer stepped by ldc: the same addresses with
    // one 64-bit add a row instead of a multiply-add per operand.
    const i64 at = (i64)(tc.m0 + r0) * p.ldc + col;
    const bf16_t *gate = (const bf16_t*)p.e_gate + at, *up = (const bf16_t*)p.e_up + at;
    const bf16_t* act = (const bf16_t*)p.e_act + at;
    #pragma unroll
    for (int q = 0; q < R; ++q, gate += p.ldc, up += p.ldc, act += p.ldc) {
      const bool ok = r0 + q < rows && col_ok;
      g2[q] = ok ? __ldg((const uint2*)gate) : make_uint2(0, 0);
      u2[q] = ok ? __ldg((const uint2*)up) : make_uint2(0, 0);
      a2[q] = ok && routed ? __ldg((const uint2*)act) : make_uint2(0, 0);
    }
    // The batch's R weights by one load (and its index load) over R lanes instead of R loads
    // by every lane: fewer instructions beside the consumers' MMAs.
    w_lane = lane < R && r0 + lane < rows ? swiglu_row_weight(p, tc.m0 + r0 + lane, tc.m_hi) : 1.f;
  }

  __device__ __forceinline__ void finish(const GemmParams& p, const Tile& tc, const u8* dacc, int r0, int rows,
                                         int col, int lane) const {
    const bool routed = p.e_aw != nullptr, contract = p.e_contract != 0, col_ok = col < p.n;
    const i64 ld_grad = p.e_ld_grad ? p.e_ld_grad : p.ldc;
    // Row pointers of the batch's first row, stepped a row at a time (as in load).
    const i64 row0 = tc.m0 + r0;
    bf16_t* dg_row = (bf16_t*)p.e_dg + row0 * ld_grad + col;
    bf16_t* du_row = (bf16_t*)p.e_du + row0 * ld_grad + col;
    bf16_t* aw_row = (bf16_t*)p.e_aw + row0 * p.ldc + col;
    float dots[R];  // the lane's terms of each row's <da', a>
    #pragma unroll
    for (int q = 0; q < R; ++q, dg_row += ld_grad, du_row += ld_grad, aw_row += p.ldc) {
      dots[q] = 0.f;
      if (r0 + q >= rows) continue;  // the same for the whole warp
      const float w = __shfl_sync(0xffffffffu, w_lane, q);
      const float4 d = *(const float4*)(dacc + dacc_offset_in_batch(r0, q, lane));
      const float lo[2] = {d.x, d.y}, hi[2] = {d.z, d.w};
      uint2 dg, du;
      swiglu_grad_pair<Cfg::PACKED_CONTRACT>(lo, g2[q].x, u2[q].x, w, contract, dg.x, du.x);
      swiglu_grad_pair<Cfg::PACKED_CONTRACT>(hi, g2[q].y, u2[q].y, w, contract, dg.y, du.y);
      if (col_ok) {
        *(uint2*)dg_row = dg;
        *(uint2*)du_row = du;
      }
      if (routed) {  // act is zero past n: no term in the dot
        const float a[4] = {bf16_to_f32(a2[q].x & 0xffff), bf16_to_f32(a2[q].x >> 16),
                            bf16_to_f32(a2[q].y & 0xffff), bf16_to_f32(a2[q].y >> 16)};
        if (col_ok)
          *(uint2*)aw_row = make_uint2(pack_bf16x2(w * a[0], w * a[1]), pack_bf16x2(w * a[2], w * a[3]));
        dots[q] = (d.x * a[0] + d.y * a[1]) + (d.z * a[2] + d.w * a[3]);
      }
    }
    if (routed && p.e_row_partial) {
      const float dot = warp_sum_4_rows(dots, lane);
      const int q = lane / 8;  // lane 8 q holds row q's sum
      if (lane % 8 == 0 && r0 + q < rows)
        p.e_row_partial[(i64)(tc.m0 + r0 + q) * p.e_partial_ld + tc.n0 / Cfg::BN] = dot;
    }
  }
  static_assert(R == 4, "warp_sum_4_rows, and dacc_offset_in_batch's batches of 4 rows");
};

// Rows w R, w R + warps R, ... (R at a time) of a staged tile, by warp w of the `warps` that share
// it: their operands (which do not depend on da') load first, then, where `staged` is given, the
// warp waits for da' (its phase `parity`); the next R rows load while the current ones are
// computed.
template <class Cfg>
__device__ __forceinline__ void staged_tile_rows(const GemmParams& p, const Tile& tc, const u8* dacc, int w,
                                                 int warps, int lane, u64* staged, u32 parity) {
  using Rows = EpilogueRows<Cfg>;
  const int step = warps * Rows::R;
  const int rows = min(BM, tc.m_hi - tc.m0), col = tc.n0 + 4 * lane;
  Rows cur, next;
  cur.load(p, tc, w * Rows::R, rows, col, lane);
  if (staged) mbar_wait(staged, parity);
  for (int r0 = w * Rows::R; r0 < rows; r0 += step) {  // (r0: multiples of R)
    if (r0 + step < rows) next.load(p, tc, r0 + step, rows, col, lane);
    cur.finish(p, tc, dacc, r0, rows, col, lane);
    cur = next;
  }
}

// The epilogue warps (ew = 0 .. E_WARPS - 1): every tile of the CTA, once the consumers have
// staged its da'. HELP_LAST: the CTA's last tile, which no main loop follows, is shared with the
// consumers' 8 warps (LAST_TILE_WARPS in all), so that its epilogue, which nothing hides, takes
// about half as long; whether a tile is the last is known from the feed's next entry, read ahead.
template <class Cfg>
__device__ __forceinline__ void swiglu_epilogue_warps(const GemmSm90Params& P,
                                                      const Scheduler<Cfg>& sched, const Feed<Cfg>& feed,
                                                      const u8* dacc, u64* epi_bar, int ew, int lane) {
  using L = Plan<Cfg>;
  const GemmParams& p = P.base;
  int t = feed.read(0, lane);
  for (int j = 0; t < sched.total; ++j) {
    const Tile tc = sched.tile(t);
    const int t_next = Cfg::HELP_LAST ? feed.read(j + 1, lane) : 0;
    const bool last = Cfg::HELP_LAST && t_next >= sched.total;
    staged_tile_rows<Cfg>(p, tc, dacc, ew, last ? L::LAST_TILE_WARPS : L::E_WARPS, lane, &epi_bar[0], j & 1);
    mbar_arrive(&epi_bar[1]);  // this thread's reads of the buffer are done
    t = Cfg::HELP_LAST ? t_next : feed.read(j + 1, lane);
  }
}

// One row's 4 columns (col .. col + 3, a lane's share) of a cluster-summed split-K tile: stored
// as bf16 or fp32, or turned into the SwiGLU backward's dg, du (no routed-expert outputs: aw and
// the row partials need the whole row in one CTA). n is even: col + 2 < n says whether the
// second pair is real.
template <class Cfg>
__device__ __forceinline__ void split_cluster_row(const GemmParams& p, int row, int m_hi, int col, float4 d) {
  if (col >= p.n) return;
  const bool pair2 = col + 2 < p.n;
  const i64 at = (i64)row * p.ldc + col;
  if constexpr (Cfg::EPILOGUE == kStoreBf16) {
    u32* dst = (u32*)((bf16_t*)p.c + at);
    dst[0] = pack_bf16x2(d.x, d.y);
    if (pair2) dst[1] = pack_bf16x2(d.z, d.w);
  } else if constexpr (Cfg::EPILOGUE == kStoreF32) {
    float2* dst = (float2*)((float*)p.c + at);
    dst[0] = make_float2(d.x, d.y);
    if (pair2) dst[1] = make_float2(d.z, d.w);
  } else if constexpr (Cfg::EPILOGUE == kSwigluBackward) {
    const u32* gate = (const u32*)((const bf16_t*)p.e_gate + at);
    const u32* up = (const u32*)((const bf16_t*)p.e_up + at);
    const u32 g2[2] = {__ldg(gate), pair2 ? __ldg(gate + 1) : 0u};
    const u32 u2[2] = {__ldg(up), pair2 ? __ldg(up + 1) : 0u};
    const float w = swiglu_row_weight(p, row, m_hi);
    const float lo[2] = {d.x, d.y}, hi[2] = {d.z, d.w};
    u32 dg[2], du[2];
    swiglu_grad_pair<Cfg::PACKED_CONTRACT>(lo, g2[0], u2[0], w, p.e_contract != 0, dg[0], du[0]);
    swiglu_grad_pair<Cfg::PACKED_CONTRACT>(hi, g2[1], u2[1], w, p.e_contract != 0, dg[1], du[1]);
    const i64 at_grad = (i64)row * (p.e_ld_grad ? p.e_ld_grad : p.ldc) + col;
    u32* dgp = (u32*)((bf16_t*)p.e_dg + at_grad);
    u32* dup = (u32*)((bf16_t*)p.e_du + at_grad);
    dgp[0] = dg[0];
    dup[0] = du[0];
    if (pair2) {
      dgp[1] = dg[1];
      dup[1] = du[1];
    }
  }
}

// Cluster split-K (Cfg::SPLIT_CLUSTER): the sum of the tile's pieces, in piece order, and the
// epilogue on it. Each CTA of the cluster has staged its piece's fp32 accumulators in its own
// shared memory (the dacc layout, over the idle stages); CTA rank q takes rows q, q + S, q + 2 S,
// ... of the tile, its 8 consumer warps CLUSTER_ROWS rows at a time, a lane 4 columns, reading every
// piece's row from its CTA over DSMEM (loads in flight, then their adds in piece order: the same
// bits whichever CTA sums a row). Run by the consumer warps (warp 0 .. 7); every thread of the
// CTA takes part in both cluster barriers (the producer warpgroup on its own path, kernel_body):
// the first makes the pieces visible, the second keeps each CTA's shared memory until its peers
// have read it.
template <class Cfg>
__device__ __forceinline__ void split_cluster_epilogue(const GemmSm90Params& P, const Scheduler<Cfg>& sched,
                                                       u8* smem, int warp, int lane) {
  constexpr int MAX_PIECES = 8, IN_FLIGHT = 4, ROWS = Cfg::CLUSTER_ROWS;
  static_assert(ROWS >= 1 && ROWS <= 8, "rows a warp sums at once");
  const GemmParams& p = P.base;
  TRACE_EPI_BEGIN();
  __syncwarp();
  cluster_sync();
  if ((int)blockIdx.x < sched.total) {
    const int pieces = (int)cluster_size(), rank = (int)cluster_rank();
    const Tile tc = sched.tile(blockIdx.x);
    // K-grouped: rows m0 and m0 + m / 2 land on the same output row (the two halves add up;
    // PAIR_ROWS: already added in each CTA, whose m0 is the output row).
    const int out_m0 = Cfg::GROUPING == kKGrouped ? tc.m0 % (p.m / 2) : tc.m0;
    const int rows = Cfg::GROUPING == kKGrouped ? min(BM, p.m / 2 - out_m0) : min(BM, tc.m_hi - tc.m0);
    const u32 base = smem_addr(smem);
    const int step = pieces * 8;  // a warp's rows r, r + step, ...
    // ROWS of them at once: every piece's loads of the batch in flight (IN_FLIGHT pieces at a
    // time) before their adds, so a warp pays the DSMEM latency once a batch instead of once a row.
    for (int r0 = rank + pieces * warp; r0 < rows; r0 += ROWS * step) {
      float4 sum[ROWS];
      #pragma unroll
      for (int q0 = 0; q0 < MAX_PIECES; q0 += IN_FLIGHT) {  // IN_FLIGHT loads a row, then their adds
        if (q0 >= pieces) break;
        float4 v[ROWS][IN_FLIGHT];
        #pragma unroll
        for (int j = 0; j < ROWS; ++j)
          #pragma unroll
          for (int q = 0; q < IN_FLIGHT; ++q)
            if (r0 + j * step < rows && q0 + q < pieces)
              v[j][q] = ld_peer_f4(peer_smem_addr(base + dacc_offset(r0 + j * step, lane), q0 + q));
        #pragma unroll
        for (int j = 0; j < ROWS; ++j)
          #pragma unroll
          for (int q = 0; q < IN_FLIGHT; ++q)
            if (r0 + j * step < rows && q0 + q < pieces) {
              if (q0 + q == 0) {
                sum[j] = v[j][0];  // not 0 + v: the same bits as a sum that starts from piece 0
              } else {
                sum[j].x += v[j][q].x;
                sum[j].y += v[j][q].y;
                sum[j].z += v[j][q].z;
                sum[j].w += v[j][q].w;
              }
            }
      }
      #pragma unroll
      for (int j = 0; j < ROWS; ++j)
        if (r0 + j * step < rows) split_cluster_row<Cfg>(p, out_m0 + r0 + j * step, tc.m_hi, tc.n0 + 4 * lane, sum[j]);
    }
  }
  __syncwarp();
  if constexpr (Cfg::CLUSTER_RELAXED_EXIT) cluster_sync_relaxed(); else cluster_sync();
  TRACE_EPI_END(warp == 0 && lane == 0, blockIdx.x);
}

// A consumer thread's results as store_tile_tma reads them: pair i of accumulator block b (its
// fragment's values 2 i and 2 i + 1) as bf16x2, or as fp32.
template <class Cfg>
struct LiveResults {  // the accumulators themselves
  const float (&acc)[Plan<Cfg>::HALVES][Cfg::BN / 2];
  __device__ __forceinline__ u32 bf16x2(int b, int i) const { return pack_bf16x2(acc[b][2 * i], acc[b][2 * i + 1]); }
  __device__ __forceinline__ float2 f32x2(int b, int i) const { return make_float2(acc[b][2 * i], acc[b][2 * i + 1]); }
};
template <class Cfg>
struct HeldResults {  // DEFER_STORE: a finished tile's bf16 results past its first HELD_FROM
  using L = Plan<Cfg>;  // batches, kept while the next tile starts
  static constexpr int FIRST = L::HELD_FROM * L::STORE_BATCH * L::UNIT_REGS, PAIRS = Cfg::BN / 4 - FIRST;
  u32 v[L::HALVES][PAIRS > 0 ? PAIRS : 1];
  __device__ __forceinline__ void hold(const float (&acc)[L::HALVES][Cfg::BN / 2]) {
    #pragma unroll
    for (int b = 0; b < L::HALVES; ++b)
      #pragma unroll
      for (int i = 0; i < PAIRS; ++i) v[b][i] = pack_bf16x2(acc[b][2 * (FIRST + i)], acc[b][2 * (FIRST + i) + 1]);
  }
  __device__ __forceinline__ u32 bf16x2(int b, int i) const { return v[b][i - FIRST]; }
};

// The bf16 or fp32 rows of one warpgroup (its 64-row blocks) through its shared-memory staging
// buffer (units of 64 rows of 128 bytes, swizzled: conflict-free writes) and TMA stores, which
// clip at the tensor's edges. The stores run while the warpgroup goes on with its next tile.
// The units go in batches (Plan::STORE_BATCHES of them): all at once, or with a ring
// (Plan::RING) half of it at a time, each batch's buffers reused once the stores of the batch
// before the last have read them; this call stores batches [from, to). row_off: the first
// block's row.
template <class Cfg, class Results>
__device__ __forceinline__ void store_tile_tma(const GemmSm90Params& P, const Tile& tc, const Results& res,
                                               u8* staging, int row_off, int wg, int tid,
                                               int from = 0, int to = Plan<Cfg>::STORE_BATCHES) {
  using L = Plan<Cfg>;
  constexpr int ATOMS = Cfg::BN / L::UNIT_COLS, UNITS = L::STORE_UNITS;  // units per 64-row block, all
  constexpr int BATCH = L::STORE_BATCH;
  const int warp = tid / 32, lane = tid % 32;
  #pragma unroll
  for (int first = 0; first < UNITS; first += BATCH) {
    if (first < from * BATCH || first >= to * BATCH) continue;
    if (first == 0 || first >= L::RING) {  // the batch's buffers: the stores that read them are done
      if (tid == 0) {
        if (first == 0) bulk_wait_read<0>();  // (the last tile's)
        else bulk_wait_read<1>();             // (all but the batch just stored)
      }
      named_barrier(2 + wg, 128);
    }
    #pragma unroll
    for (int u = first; u < first + BATCH; ++u) {
      const int b = u / ATOMS, a = u % ATOMS;
      u8* unit = staging + (u % L::RING) * ATOM_BYTES;
      if constexpr (Cfg::C_TRANS) {
        // C^T: the unit holds columns 64 a .. 64 a + 63 as its 64 rows of 128 bytes (this block's
        // 64 result rows, 16-byte chunk c of row h at c ^ (h % 8)), written by stmatrix.trans: two
        // column blocks of 8 x the warp's two 8-row halves per instruction. Lane L gives the address
        // of column 8 (j + L / 16) + L % 8, rows 16 warp + 8 (L / 8 % 2) ...
        const int q = lane / 8, hq = lane % 8;
        #pragma unroll
        for (int j = 8 * a; j < 8 * a + 8; j += 2) {
          const int col = 8 * (j + q / 2) + hq, chunk = 2 * warp + q % 2;
          const u32 dst = smem_addr(unit + (col % 64) * 128 + ((chunk ^ (col % 8)) << 4));
          stmatrix_x4_trans(dst, res.bf16x2(b, 2 * j), res.bf16x2(b, 2 * j + 1), res.bf16x2(b, 2 * j + 2),
                            res.bf16x2(b, 2 * j + 3));
        }
      } else if constexpr (L::C_BYTES == 4) {
        // fp32: the unit's 32 columns are the 8-column blocks j = 4 a .. 4 a + 3, each two 16-byte
        // chunks of a row; a thread's pair of columns is 8 bytes of chunk 2 (j % 4) + lane % 4 / 2.
        #pragma unroll
        for (int j = 4 * a; j < 4 * a + 4; ++j) {
          #pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = 16 * warp + lane / 4 + 8 * h, chunk = 2 * (j % 4) + (lane % 4) / 2;
            u8* dst = unit + r * 128 + ((chunk ^ (r % 8)) << 4) + 8 * (lane % 2);
            *(float2*)dst = res.f32x2(b, 2 * j + h);
          }
        }
      } else {
        #pragma unroll
        for (int j = 8 * a; j < 8 * a + 8; ++j) {
          #pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = 16 * warp + lane / 4 + 8 * h;
            u8* dst = unit + r * 128 + (((j % 8) ^ (r % 8)) << 4) + 4 * (lane % 4);
            *(u32*)dst = res.bf16x2(b, 2 * j + h);
          }
        }
      }
    }
    fence_proxy_async();
    named_barrier(2 + wg, 128);
    if (tid == 0) {
      const int group = Cfg::GROUPING == kKGrouped ? tc.group : 0;
      #pragma unroll
      for (int u = first; u < first + BATCH; ++u) {
        const int b = u / ATOMS, a = u % ATOMS;
        const u8* unit = staging + (u % L::RING) * ATOM_BYTES;
        const int row = tc.m0 + row_off + 64 * b - (Cfg::ROW_SPLIT ? P.base.c2_rows : 0),
                  col = tc.n0 + L::UNIT_COLS * a;
        if constexpr (Cfg::C_TRANS)  // the map is C^T's: (result rows, result columns) = (its columns, rows)
          tma_store_3d(&P.tma_c, unit, row, col, group);
        else
          tma_store_3d(&P.tma_c, unit, col, row, group);
      }
      bulk_commit();
    }
  }
}

}  // namespace sm90
}  // namespace gemm
