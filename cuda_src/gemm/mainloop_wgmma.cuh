// The Hopper GEMM main loop: TMA / cp.async loads into 128-byte-swizzled stages, mbarrier
// pipeline, one producer warpgroup and two consumer warpgroups issuing wgmma, persistent tiles.
//
//   C[m, n] = sum over segments s, k of A_s(m, k) * B_s(k, n)    (bf16 in, fp32 accumulate)
//
// Tile BM = 128 rows x BN columns, BK = 64 reduction elements per stage. Two ways to share tiles
// between the consumer warpgroups (Cfg::PINGPONG): cooperative, both work on every tile, 64 rows
// each (BN up to 256); ping-pong, each owns every other tile whole (two 64-row halves, BN up to
// 128) and the two take turns at the tensor cores, so one's epilogue runs under the other's main
// loop (what short reductions and heavy epilogues need). Shared-memory layout of an operand tile, the one TMA's SWIZZLE_128B writes and wgmma
// reads (base 1024-byte aligned, 16-byte chunk c of a 128-byte row r stored at chunk c ^ (r % 8)):
//   K-major  [rows][64 k]                       one 128-byte row per m (or n)
//   MN-major [MN / 64 atoms][64 k][64 mn]       one 128-byte row per k, atoms 8 KB apart
// An operand comes by TMA unless its lines are gathered through an index map: those are copied
// by the producer warpgroup's 128 threads with cp.async into the same layout, zero-filled outside
// the valid range. wgmma reads shared memory through the async proxy, so cp.async data needs a
// proxy fence after it lands; the producer threads wait for their copies CPA_LAG stages behind
// the newest, fence and only then arrive, which keeps the fence off the consumers' path. A K-grouped GEMM's last reduction tile of a group reads past the group's end;
// the consumers zero those lines of TMA-loaded operands before the MMA (so another expert's
// Inf or NaN never leaks in). bf16 results leave through shared memory and TMA stores that
// overlap the next tile's main loop; fp32 results and M-grouped tiles that straddle a group's
// end are stored from registers. The fused SwiGLU backward (E_STAGED) leaves each tile's fp32
// accumulators in shared memory for seven epilogue warps, which read gate/up/act and write the
// gradients while the consumers run the next tile's main loop (done by the consumers themselves,
// it left the tensor cores idle for a third of the kernel). Cfg fields as in mainloop_mma.cuh,
// plus BN, STAGES, C_TMA, PINGPONG and E_STAGED.
#pragma once
#include "../common/swiglu_contract.cuh"
#include "wgmma_ops.cuh"
#include "scheduler.cuh"
#include "tile_feed.cuh"

namespace gemm {

namespace sm90 {

constexpr int BM = 128, BK = 64;
constexpr int PRODUCER_THREADS = 128, CONSUMER_WARPGROUPS = 2;
// The producer and consumer warpgroups; a staged SwiGLU epilogue adds one (Plan::THREADS).
constexpr int MAIN_THREADS = PRODUCER_THREADS * (1 + CONSUMER_WARPGROUPS);
constexpr int ATOM_BYTES = BK * 128;  // one 64-wide MN atom of an MN-major tile

template <class Cfg>
struct Plan {
  static constexpr bool CPA_A = Cfg::GATHER_A, CPA_B = Cfg::GATHER_B;
  static constexpr bool CPA = CPA_A || CPA_B;
  static constexpr bool MASK_A = Cfg::GROUPING == kKGrouped && !CPA_A;
  static constexpr bool MASK_B = Cfg::GROUPING == kKGrouped && !CPA_B;
  // K-grouped, a group's last k-tile short of BK lines (of at least BK in all): its loads end at
  // the group's end instead, and the lines the tile before already counted are zeroed in A alone
  // (mask_lines): both operands hold the group's own lines, so one zero operand suffices, where
  // lines past the end (the next group's) had to be zeroed in both (a non-finite B line of the
  // group makes its result non-finite either way). A third of the stores for 128 x 256 tiles:
  // the layer's [1408 x 4096] per-expert weight gradient at random routing 1460 -> 1298 us
  // (64-aligned groups: 1217; bench/k_grouped_align.py, bench/NOTES.md v0.14).
  static constexpr bool SHIFT_LAST = MASK_A;
  static constexpr bool TMA_STORE = Cfg::C_TMA;  // bf16 output with 16-byte aligned strides
  static constexpr int A_BYTES = BM * BK * 2, B_BYTES = Cfg::BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr u32 TMA_BYTES = (CPA_A ? 0 : A_BYTES) + (CPA_B ? 0 : B_BYTES);
  static constexpr bool PINGPONG = Cfg::PINGPONG;
  static constexpr int HALVES = PINGPONG ? 2 : 1;     // 64-row accumulator blocks per warpgroup
  static constexpr int WG_ROWS = 64 * HALVES;
  static constexpr int STAGING = Cfg::STAGES * STAGE_BYTES;        // per consumer warpgroup:
  static constexpr int STAGING_BYTES = TMA_STORE ? WG_ROWS * Cfg::BN * 2 : 0;  // its rows in bf16
  // SwiGLU backward with E_STAGED: the consumers leave each tile's fp32 accumulators (da') in
  // this buffer and go on with the next tile; E_WARPS epilogue warps (the producer warpgroup's
  // spare warps 1..3 and a fourth warpgroup) turn them into dg, du (and aw, dw) meanwhile,
  // reading gate, up (and act) from global memory. (Their cost to the main loop is mostly their
  // math's issue slots, not their loads' latency: bench/NOTES.md v0.7.)
  static constexpr bool E_STAGED = Cfg::E_STAGED;
  static constexpr int E_WARPS = E_STAGED ? 3 + 4 : 0;
  static constexpr int THREADS = MAIN_THREADS + (E_STAGED ? 128 : 0);
  static constexpr int DACC = STAGING + CONSUMER_WARPGROUPS * STAGING_BYTES;  // see dacc_offset
  static constexpr int DACC_BYTES = E_STAGED ? BM * Cfg::BN * 4 : 0;
  static constexpr int BARRIERS = DACC + DACC_BYTES;                // full, empty
  static constexpr int TURNS = BARRIERS + 2 * Cfg::STAGES * 8;     // ping-pong: whose MMAs next
  static constexpr int EPI_BARRIERS = TURNS + 2 * 8;                // da' staged, buffer free
  static constexpr int FEED = EPI_BARRIERS + (E_STAGED ? 2 * 8 : 0);      // TileFeed
  static constexpr int SCHEDULE = FEED + TileFeed<true>::BYTES;           // TileScheduler::tile_start
  static constexpr int FULL_ARRIVALS = 1 + (CPA ? PRODUCER_THREADS : 0);
  static constexpr int CPA_LAG = Cfg::STAGES - 2;  // cp.async stages in flight past the newest
  // Lane 0 of each warp that reads a stage: both consumer warpgroups', or its owner's.
  static constexpr int EMPTY_ARRIVALS = (PINGPONG ? 1 : CONSUMER_WARPGROUPS) * 4;
  // Warps that read every tile index from the feed: the consumers (both warpgroups, ping-pong
  // too: the other's tiles pass by) and the epilogue warps. (A cp.async producer's threads get
  // thread 0's through TileFeed::to_producer.)
  static constexpr int FEED_READERS = CONSUMER_WARPGROUPS * 4 + E_WARPS;
  // Register split: the producer needs few, each consumer thread holds BN / 2 accumulators.
  // (With the epilogue warpgroup, 512 threads share the file evenly: 128 each, no reallocation.)
  // (The CTA's registers are fixed at launch, 168 x 384: what the producer gives back, 112 x 128,
  // is exactly what the consumers take, 56 x 256. A producer at 64 leaves them waiting forever.)
  static constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
  static_assert(Cfg::BN == 64 || Cfg::BN == 128 || Cfg::BN == 256, "BN");
  static_assert(!PINGPONG || Cfg::BN <= 128, "a ping-pong warpgroup holds 128 x BN accumulators");
  static_assert(MAX_SEGMENTS >= 1, "segments");
  static_assert(!Cfg::C_TMA || Cfg::EPILOGUE == kStoreBf16, "TMA stores carry bf16 results");
  static_assert(!Cfg::C_TRANS || (Cfg::C_TMA && Cfg::GROUPING != kMGrouped && !Cfg::ROW_SPLIT),
                "a transposed result leaves by TMA stores only (every tile whole)");
  static_assert(Cfg::EPILOGUE != kSwigluBackward || Cfg::GROUPING != kKGrouped, "row epilogue");
  static_assert(PRODUCER_REGS * PRODUCER_THREADS + CONSUMER_REGS * 128 * CONSUMER_WARPGROUPS <= 65536, "regs");
  // setmaxnreg moves registers within the CTA's launch allocation (168 each at 384 threads):
  // what the producer gives back must cover what the consumers take, or they wait forever.
  static constexpr int LAUNCH_REGS = (65536 / MAIN_THREADS) & ~7;
  static_assert((LAUNCH_REGS - PRODUCER_REGS) * PRODUCER_THREADS >=
                (CONSUMER_REGS - LAUNCH_REGS) * 128 * CONSUMER_WARPGROUPS, "setmaxnreg: consumers would wait");
  static_assert(Cfg::GROUPING != kMGrouped || Cfg::A_KMAJOR, "M-grouped GEMMs take a K-major A");
  static_assert(!Cfg::SPLIT_K || (Cfg::GROUPING == kNone && (Cfg::EPILOGUE == kStoreF32 || Cfg::SPLIT_CLUSTER)),
                "split-K: fp32 pieces of an ungrouped GEMM, or summed in their cluster");
  // SPLIT_CLUSTER: the S pieces of a tile are a cluster of S CTAs, one tile each; each leaves its
  // fp32 accumulators in its shared memory (over the idle stages) and the cluster sums them over
  // DSMEM, in piece order, a row at a time, before the epilogue (split_cluster_epilogue).
  static_assert(!Cfg::SPLIT_CLUSTER || ((Cfg::SPLIT_K || Cfg::GROUPING == kKGrouped) && Cfg::BN == 128 &&
                                        !PINGPONG && !Cfg::C_TMA &&
                                        !E_STAGED && Cfg::EPILOGUE != kAccumulateF32 &&
                                        Cfg::STAGES * STAGE_BYTES >= BM * 128 * 4),
                "cluster split-K: cooperative 128 x 128 tiles, register epilogues");
  static_assert(!Cfg::DYNAMIC || !Cfg::SPLIT_CLUSTER, "a cluster's CTAs take their rank's tile");
  // ROW_SPLIT: rows [0, c2_rows) of the result leave as fp32 to c2, the rest as bf16 to c (from
  // its row 0); tiles that reach into the fp32 rows store from registers.
  static_assert(!Cfg::ROW_SPLIT || (Cfg::EPILOGUE == kStoreBf16 && Cfg::GROUPING == kNone && !Cfg::SPLIT_K),
                "row split: a bf16 result of an ungrouped, unsplit GEMM");
  static_assert(Cfg::GROUPING != kKGrouped || (!Cfg::A_KMAJOR && !Cfg::B_KMAJOR),
                "K-grouped GEMMs reduce over memory lines: both operands MN-major");
  static_assert(!E_STAGED || (Cfg::EPILOGUE == kSwigluBackward && !PINGPONG && !Cfg::C_TMA && !CPA &&
                               Cfg::BN == 128), "staged SwiGLU epilogue: cooperative 128 x 128, TMA loads");
  static_assert(THREADS == HOST_THREADS, "Sm90Config.threads (cupy_moe/gpu/gemm.py) disagrees with this block");
  static_assert(SCHEDULE == HOST_TABLE_OFFSET,
                "Sm90Config.smem_bytes (cupy_moe/gpu/gemm.py) disagrees with this layout");
};

template <class Cfg>
using Scheduler = TileScheduler<BM, Cfg::BN, Cfg::GROUPING, Cfg::SPLIT_K, Cfg::SPLIT_CLUSTER, BK, Cfg::SEG_ROWS,
                                Cfg::M_FASTEST>;
template <class Cfg>
using Feed = TileFeed<Cfg::DYNAMIC>;

// cp.async copy of memory lines [line0, line0 + LINES) x columns [col0, col0 + WIDTH) into the
// swizzled layout (K-major: LINES rows of WIDTH = 64; MN-major: LINES = 64 k rows of WIDTH
// elements in 64-wide atoms). Lines at or past line_hi and chunks at or past col_hi are zeros;
// map (optional) gathers memory line map[line] / div.
template <int LINES, int WIDTH>
__device__ __forceinline__ void cp_async_tile(u8* tile, const bf16_t* base, i64 ld, const int* map,
                                              int div, int line0, int line_hi, int col0, int col_hi,
                                              int tid) {
  constexpr int CPL = WIDTH / 8;  // 16-byte chunks per line
  static_assert((LINES * CPL) % PRODUCER_THREADS == 0, "tile chunks");
  #pragma unroll 4  // a few index loads in flight within the producer's small register budget
  for (int j = 0; j < LINES * CPL / PRODUCER_THREADS; ++j) {
    const int i = tid + j * PRODUCER_THREADS;
    const int r = i / CPL, c = i % CPL;  // consecutive lanes take consecutive chunks of a line
    const int line = line0 + r, col = col0 + c * 8;
    const bool ok = line < line_hi && col < col_hi;
    const bf16_t* src = base;
    if (ok) {
      const i64 mem = map ? (i64)(__ldg(map + line) / div) : (i64)line;
      src = base + mem * ld + col;
    }
    u8* dst = tile + (c / 8) * (LINES * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4);
    cp_async_16(dst, src, ok ? 16 : 0);
  }
}

// One operand's tile of OUTER rows (m or n) by cp.async: a K-major operand's memory lines are its
// rows, an MN-major operand's are the k rows.
template <int OUTER, bool KMAJOR>
__device__ __forceinline__ void cp_async_operand(u8* tile, const bf16_t* base, i64 ld, const int* map,
                                                 int div, int outer0, int outer_hi, int k0, int k_end,
                                                 int tid) {
  if constexpr (KMAJOR) cp_async_tile<OUTER, BK>(tile, base, ld, map, div, outer0, outer_hi, k0, k_end, tid);
  else cp_async_tile<BK, OUTER>(tile, base, ld, map, div, k0, k_end, outer0, outer_hi, tid);
}

// TMA copy of the same tile: K-major one box {64 k, OUTER}; MN-major one box {64 mn, 64 k} per atom.
template <int OUTER, bool KMAJOR>
__device__ __forceinline__ void tma_tile(u8* tile, const TmaDesc* map, u64* bar, int outer0, int k0, int group) {
  if constexpr (KMAJOR) {
    tma_load_3d(tile, map, bar, k0, outer0, group);
  } else {
    #pragma unroll
    for (int a = 0; a < OUTER / 64; ++a) tma_load_3d(tile + a * ATOM_BYTES, map, bar, outer0 + 64 * a, k0, group);
  }
}

// Thread 0 also claims the CTA's tiles and feeds their indices to the other warps: the next one
// once the current one's loads are issued (its latency hides behind the stages in flight).
template <class Cfg>
__device__ __forceinline__ void producer(const GemmSm90Params& P, const Scheduler<Cfg>& sched,
                                         const Feed<Cfg>& feed, u8* smem, u64* full, u64* empty, int tid) {
  using L = Plan<Cfg>;
  constexpr int BN = Cfg::BN;
  const GemmParams& p = P.base;
  if (!L::CPA && tid != 0) return;  // TMA needs one thread
  int stage = 0, issued = 0;
  u32 phase = 0;
  int claimed = feed.first();  // static, a cp.async producer's threads each walk the order
  for (int i = 0;; ++i) {
    if (tid == 0) feed.publish(i, claimed);
    const int t = L::CPA ? feed.to_producer(claimed, tid) : claimed;
    if (t >= sched.total) break;
    const Tile tc = sched.tile(t);
    const int grp = Cfg::GROUPING == kMGrouped ? tc.group : 0;
    int kt = 0;  // k-tile over all segments
    for (int s = 0; s < p.num_segments; ++s) {
      if (!sched.in_segment(tc, s)) continue;  // as k_tiles counts them
      const int k_begin = Cfg::GROUPING == kKGrouped ? tc.k_lo : 0;
      const int k_end = Cfg::GROUPING == kKGrouped ? tc.k_hi : p.seg_k[s];
      const bool shift_last = L::SHIFT_LAST && k_end - k_begin >= BK;  // (as the consumers decide)
      const bf16_t* a_base = (const bf16_t*)p.a[s];
      const bf16_t* b_base = (const bf16_t*)p.b[s] + (i64)grp * p.b_group_stride[s];
      for (int k0 = k_begin; k0 < k_end; k0 += BK, ++kt) {
        if constexpr (Cfg::SPLIT_K)
          if (!sched.loads(tc, kt)) continue;  // another piece's
        mbar_wait(&empty[stage], phase ^ 1);
        u8* ta = smem + stage * L::STAGE_BYTES;
        u8* tb = ta + L::A_BYTES;
        const int kl = shift_last && k0 + BK > k_end ? k_end - BK : k0;  // the lines loaded
        if (tid == 0) {
          if constexpr (L::TMA_BYTES > 0) mbar_arrive_expect_tx(&full[stage], L::TMA_BYTES);
          else mbar_arrive(&full[stage]);
          if constexpr (!L::CPA_A)
            tma_tile<BM, Cfg::A_KMAJOR>(ta, &P.tma_a[s], &full[stage], tc.m0, kl, 0);
          if constexpr (!L::CPA_B)
            tma_tile<BN, Cfg::B_KMAJOR>(tb, &P.tma_b[s], &full[stage], tc.n0, kl, grp);
        }
        if constexpr (L::CPA_A)  // rows stop at the group's end (K-major) or at m
          cp_async_operand<BM, Cfg::A_KMAJOR>(ta, a_base, p.lda[s], p.gather_a, p.gather_div, tc.m0,
                                              Cfg::A_KMAJOR ? tc.m_hi : p.m, kl, k_end, tid);
        if constexpr (L::CPA_B)
          cp_async_operand<BN, Cfg::B_KMAJOR>(tb, b_base, p.ldb[s], p.gather_b, p.gather_div, tc.n0,
                                              p.n, kl, k_end, tid);
        if constexpr (L::CPA) {
          cp_async_commit();
          cp_async_wait<L::CPA_LAG>();  // the copies of issue number `issued - CPA_LAG` have landed
          if (issued >= L::CPA_LAG) {
            fence_proxy_async();
            mbar_arrive(&full[(issued - L::CPA_LAG) % Cfg::STAGES]);
          }
        }
        ++issued;
        if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
      }
    }
    if (tid == 0 || !Cfg::DYNAMIC) claimed = feed.after(t);  // (dynamic: thread 0 claims for all)
  }
  if (tid == 0) feed.done();
  if constexpr (L::CPA) {
    cp_async_wait<0>();
    fence_proxy_async();
    for (int q = issued > L::CPA_LAG ? issued - L::CPA_LAG : 0; q < issued; ++q)
      mbar_arrive(&full[q % Cfg::STAGES]);
  }
}

// K-grouped: zero lines [first, first + count) of the stage's TMA-loaded MN-major tiles (one
// 128-byte row per line and atom), A's and, with b_too, B's, by the `threads` consumer threads
// that read the stage (barrier `bar`) before any of them issues its MMAs.
template <class Cfg>
__device__ __forceinline__ void mask_lines(u8* stage, int first, int count, bool b_too, int tid, int threads,
                                           int bar) {
  using L = Plan<Cfg>;
  constexpr int ATOMS_A = L::MASK_A ? BM / 64 : 0, ATOMS_B = L::MASK_B ? Cfg::BN / 64 : 0;
  const int chunks = count * 8 * (ATOMS_A + (b_too ? ATOMS_B : 0));
  for (int i = tid; i < chunks; i += threads) {
    const int atom = i / (count * 8), rest = i % (count * 8);
    u8* tile = atom < ATOMS_A ? stage + atom * ATOM_BYTES
                              : stage + L::A_BYTES + (atom - ATOMS_A) * ATOM_BYTES;
    *(uint4*)(tile + (first + rest / 8) * 128 + (rest % 8) * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  named_barrier(bar, threads);
}

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
  float w[R];

  __device__ __forceinline__ void load(const GemmParams& p, const Tile& tc, int r0, int rows, int col) {
    const bool routed = p.e_aw != nullptr, col_ok = col < p.n;
    const bf16_t *gate = (const bf16_t*)p.e_gate, *up = (const bf16_t*)p.e_up, *act = (const bf16_t*)p.e_act;
    #pragma unroll
    for (int q = 0; q < R; ++q) {
      const int r = r0 + q, row = tc.m0 + r;
      const bool ok = r < rows && col_ok;
      const i64 at = (i64)row * p.ldc + col;
      g2[q] = ok ? __ldg((const uint2*)(gate + at)) : make_uint2(0, 0);
      u2[q] = ok ? __ldg((const uint2*)(up + at)) : make_uint2(0, 0);
      a2[q] = ok && routed ? __ldg((const uint2*)(act + at)) : make_uint2(0, 0);
      w[q] = r < rows ? swiglu_row_weight(p, row, tc.m_hi) : 1.f;
    }
  }

  __device__ __forceinline__ void finish(const GemmParams& p, const Tile& tc, const u8* dacc, int r0, int rows,
                                         int col, int lane) const {
    const bool routed = p.e_aw != nullptr, contract = p.e_contract != 0, col_ok = col < p.n;
    const i64 ld_grad = p.e_ld_grad ? p.e_ld_grad : p.ldc;
    #pragma unroll
    for (int q = 0; q < R; ++q) {
      const int r = r0 + q, row = tc.m0 + r;
      if (r >= rows) break;  // the same for the whole warp
      const float4 d = *(const float4*)(dacc + dacc_offset(r, lane));
      const float lo[2] = {d.x, d.y}, hi[2] = {d.z, d.w};
      uint2 dg, du;
      swiglu_grad_pair<Cfg::PACKED_CONTRACT>(lo, g2[q].x, u2[q].x, w[q], contract, dg.x, du.x);
      swiglu_grad_pair<Cfg::PACKED_CONTRACT>(hi, g2[q].y, u2[q].y, w[q], contract, dg.y, du.y);
      const i64 at = (i64)row * p.ldc + col, at_grad = (i64)row * ld_grad + col;
      if (col_ok) {
        *(uint2*)((bf16_t*)p.e_dg + at_grad) = dg;
        *(uint2*)((bf16_t*)p.e_du + at_grad) = du;
      }
      if (routed) {  // act is zero past n: no term in the dot
        const float a[4] = {bf16_to_f32(a2[q].x & 0xffff), bf16_to_f32(a2[q].x >> 16),
                            bf16_to_f32(a2[q].y & 0xffff), bf16_to_f32(a2[q].y >> 16)};
        if (col_ok)
          *(uint2*)((bf16_t*)p.e_aw + at) = make_uint2(pack_bf16x2(w[q] * a[0], w[q] * a[1]),
                                                       pack_bf16x2(w[q] * a[2], w[q] * a[3]));
        float dot = (d.x * a[0] + d.y * a[1]) + (d.z * a[2] + d.w * a[3]);
        #pragma unroll
        for (int s = 16; s > 0; s >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, s);
        if (lane == 0 && p.e_row_partial) p.e_row_partial[(i64)row * p.e_partial_ld + tc.n0 / Cfg::BN] = dot;
      }
    }
  }
};

template <class Cfg>
__device__ __forceinline__ void swiglu_epilogue_warps(const GemmSm90Params& P,
                                                      const Scheduler<Cfg>& sched, const Feed<Cfg>& feed,
                                                      const u8* dacc, u64* epi_bar, int ew, int lane) {
  using L = Plan<Cfg>;
  using Rows = EpilogueRows<Cfg>;
  constexpr int STEP = L::E_WARPS * Rows::R;
  const GemmParams& p = P.base;
  for (int j = 0;; ++j) {
    const int t = feed.read(j, lane);
    if (t >= sched.total) break;
    const Tile tc = sched.tile(t);
    const int rows = min(BM, tc.m_hi - tc.m0), col = tc.n0 + 4 * lane;
    Rows cur, next;
    cur.load(p, tc, ew * Rows::R, rows, col);  // before da' is staged: they do not depend on it
    mbar_wait(&epi_bar[0], j & 1);
    for (int r0 = ew * Rows::R; r0 < rows; r0 += STEP) {
      if (r0 + STEP < rows) next.load(p, tc, r0 + STEP, rows, col);
      cur.finish(p, tc, dacc, r0, rows, col, lane);
      cur = next;
    }
    mbar_arrive(&epi_bar[1]);  // this thread's reads of the buffer are done
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
// ... of the tile, its 8 consumer warps a row at a time, a lane 4 columns, reading every piece's
// row from its CTA over DSMEM (four loads in flight, then their adds in piece order: the same
// bits whichever CTA sums a row). Run by the consumer warps (warp 0 .. 7); every thread of the
// CTA takes part in both cluster barriers (the producer warpgroup on its own path, kernel_body):
// the first makes the pieces visible, the second keeps each CTA's shared memory until its peers
// have read it.
template <class Cfg>
__device__ __forceinline__ void split_cluster_epilogue(const GemmSm90Params& P, const Scheduler<Cfg>& sched,
                                                       u8* smem, int warp, int lane) {
  constexpr int MAX_PIECES = 8, IN_FLIGHT = 4;
  const GemmParams& p = P.base;
  __syncwarp();
  cluster_sync();
  if ((int)blockIdx.x < sched.total) {
    const int pieces = (int)cluster_size(), rank = (int)cluster_rank();
    const Tile tc = sched.tile(blockIdx.x);
    // K-grouped: rows m0 and m0 + m / 2 land on the same output row (the two halves add up).
    const int out_m0 = Cfg::GROUPING == kKGrouped ? tc.m0 % (p.m / 2) : tc.m0;
    const int rows = Cfg::GROUPING == kKGrouped ? min(BM, p.m / 2 - out_m0) : min(BM, tc.m_hi - tc.m0);
    const u32 base = smem_addr(smem);
    for (int r = rank + pieces * warp; r < rows; r += pieces * 8) {
      const u32 at = base + dacc_offset(r, lane);
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      #pragma unroll
      for (int q0 = 0; q0 < MAX_PIECES; q0 += IN_FLIGHT) {  // IN_FLIGHT loads, then their adds
        if (q0 >= pieces) break;
        float4 v[IN_FLIGHT];
        #pragma unroll
        for (int q = 0; q < IN_FLIGHT; ++q)
          if (q0 + q < pieces) v[q] = ld_peer_f4(peer_smem_addr(at, q0 + q));
        #pragma unroll
        for (int q = 0; q < IN_FLIGHT; ++q)
          if (q0 + q < pieces) {
            if (q0 + q == 0) {
              sum = v[0];  // not 0 + v: the same bits as a sum that starts from piece 0
            } else {
              sum.x += v[q].x;
              sum.y += v[q].y;
              sum.z += v[q].z;
              sum.w += v[q].w;
            }
          }
      }
      split_cluster_row<Cfg>(p, out_m0 + r, tc.m_hi, tc.n0 + 4 * lane, sum);
    }
  }
  __syncwarp();
  cluster_sync();
}

// bf16 rows of one warpgroup (its 64-row blocks) through its shared-memory staging buffer
// (64 x 64 sub-tiles, 128-byte swizzled: conflict-free writes) and TMA stores, which clip at the
// tensor's edges. The store runs while the warpgroup goes on with its next tile; the staging
// buffer is reused only after the previous store has read it. row_off: the first block's row.
template <class Cfg>
__device__ __forceinline__ void store_tile_tma(const GemmSm90Params& P, const Tile& tc,
                                               const float (&acc)[Plan<Cfg>::HALVES][Cfg::BN / 2],
                                               u8* staging, int row_off, int wg, int tid) {
  constexpr int HV = Plan<Cfg>::HALVES, ATOMS = Cfg::BN / 64;
  const int warp = tid / 32, lane = tid % 32;
  if (tid == 0) bulk_wait_read();
  named_barrier(2 + wg, 128);
  #pragma unroll
  for (int b = 0; b < HV; ++b) {
    if constexpr (Cfg::C_TRANS) {
      // C^T: sub-tile a holds columns 64 a .. 64 a + 63 as its 64 rows of 128 bytes (this block's
      // 64 result rows, 16-byte chunk c of row h at c ^ (h % 8)), written by stmatrix.trans: two
      // column blocks of 8 x the warp's two 8-row halves per instruction. Lane L gives the address
      // of column 8 (j + L / 16) + L % 8, rows 16 warp + 8 (L / 8 % 2) ...
      const int q = lane / 8, hq = lane % 8;
      #pragma unroll
      for (int j = 0; j < Cfg::BN / 8; j += 2) {
        const int col = 8 * (j + q / 2) + hq, chunk = 2 * warp + q % 2;
        const u32 dst = smem_addr(staging + (b * ATOMS + col / 64) * (64 * 128) + (col % 64) * 128 +
                                  ((chunk ^ (col % 8)) << 4));
        stmatrix_x4_trans(dst, pack_bf16x2(acc[b][4 * j], acc[b][4 * j + 1]),
                          pack_bf16x2(acc[b][4 * j + 2], acc[b][4 * j + 3]),
                          pack_bf16x2(acc[b][4 * j + 4], acc[b][4 * j + 5]),
                          pack_bf16x2(acc[b][4 * j + 6], acc[b][4 * j + 7]));
      }
      continue;
    }
    #pragma unroll
    for (int j = 0; j < Cfg::BN / 8; ++j) {
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + lane / 4 + 8 * h;
        u8* dst = staging + (b * ATOMS + j / 8) * (64 * 128) + r * 128 + (((j % 8) ^ (r % 8)) << 4) + 4 * (lane % 4);
        *(u32*)dst = pack_bf16x2(acc[b][4 * j + 2 * h], acc[b][4 * j + 2 * h + 1]);
      }
    }
  }
  fence_proxy_async();
  named_barrier(2 + wg, 128);
  if (tid == 0) {
    const int group = Cfg::GROUPING == kKGrouped ? tc.group : 0;
    #pragma unroll
    for (int b = 0; b < HV; ++b)
      #pragma unroll
      for (int a = 0; a < ATOMS; ++a) {
        const int row = tc.m0 + row_off + 64 * b - (Cfg::ROW_SPLIT ? P.base.c2_rows : 0), col = tc.n0 + 64 * a;
        if constexpr (Cfg::C_TRANS)  // the map is C^T's: (result rows, result columns) = (its columns, rows)
          tma_store_3d(&P.tma_c, staging + (b * ATOMS + a) * (64 * 128), row, col, group);
        else
          tma_store_3d(&P.tma_c, staging + (b * ATOMS + a) * (64 * 128), col, row, group);
      }
    bulk_commit();
  }
}

// A consumer warpgroup's tiles: all of them (cooperative, rows 64 wg ... 64 wg + 63 of each) or
// every other one (ping-pong: wg owns the CTA's tiles i with i % 2 == wg, skipping the stages of
// the others', and waits for its turn at the tensor cores: turn[wg] completes when the other
// warpgroup has issued its previous tile's MMAs).
template <class Cfg>
__device__ __forceinline__ void consumer(const GemmSm90Params& P, const Scheduler<Cfg>& sched,
                                         const Feed<Cfg>& feed, u8* smem, u64* full, u64* empty, u64* turn,
                                         u64* epi_bar, int wg, int tid) {
  using L = Plan<Cfg>;
  constexpr int BN = Cfg::BN, HV = L::HALVES;
  const int warp = tid / 32, lane = tid % 32;
  float acc[HV][BN / 2];
  int stage = 0, mine = 0;
  u32 phase = 0;
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
  };
  // Row offset of accumulator block b within the tile.
  auto row_off = [&](int b) { return L::PINGPONG ? 64 * b : 64 * wg; };
  for (int i = 0;; ++i) {
    const int t = feed.read(i, lane);
    if (t >= sched.total) break;
    const Tile tc = sched.tile(t);
    const int nk = sched.k_tiles(tc);
    if constexpr (L::PINGPONG) {
      if (i % 2 != wg) {  // the other warpgroup's tile: its stages pass by
        const int s = stage + nk;
        phase ^= (s / Cfg::STAGES) & 1;
        stage = s % Cfg::STAGES;
        continue;
      }
      if (i > 0) mbar_wait(&turn[wg], (mine - (wg == 0)) & 1);
    }
    #pragma unroll
    for (int b = 0; b < HV; ++b)
      #pragma unroll
      for (int j = 0; j < BN / 2; ++j) acc[b][j] = 0.f;
    // A cooperative warpgroup whose 64 rows all lie past an expert's end or past m (the last tile
    // of a group) issues no MMAs: the other one then has the tensor cores to itself. (K-grouped
    // tiles keep both: their masking is a barrier of the two.)
    const bool idle = Cfg::GROUPING != kKGrouped && !L::PINGPONG && tc.m0 + 64 * wg >= tc.m_hi;
    TRACE_TILE_BEGIN();
    int prev = -1;
    for (int kt = 0; kt < nk; ++kt) {
      mbar_wait(&full[stage], phase);
      if (idle) {
        release(stage);
        if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
        continue;
      }
      if constexpr (L::MASK_A || L::MASK_B) {
        const int seg_tiles = (tc.k_hi - tc.k_lo + BK - 1) / BK;
        const int valid = tc.k_hi - tc.k_lo - (kt % seg_tiles) * BK;
        if (valid < BK) {
          // Loaded shifted to the group's end (the producer's shift_last): the tile before's
          // lines [0, BK - valid) in A; else the next group's [valid, BK) in both operands.
          const bool shifted = L::SHIFT_LAST && tc.k_hi - tc.k_lo >= BK;
          const int first = shifted ? 0 : valid;
          u8* st = smem + stage * L::STAGE_BYTES;
          if constexpr (L::PINGPONG) mask_lines<Cfg>(st, first, BK - valid, !shifted, tid, 128, 4 + wg);
          else mask_lines<Cfg>(st, first, BK - valid, !shifted, tid + 128 * wg, 256, 1);
        }
      }
      const u32 a_tile = smem_addr(smem + stage * L::STAGE_BYTES);
      const u32 b_tile = a_tile + L::A_BYTES;
      #pragma unroll
      for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
      wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const u64 db = Cfg::B_KMAJOR ? smem_desc_sw128(b_tile + kk * 32, 16, 1024)
                                     : smem_desc_sw128(b_tile + kk * 2048, ATOM_BYTES, 1024);
        #pragma unroll
        for (int b = 0; b < HV; ++b) {
          const int rb = row_off(b) / 64;  // the 64-row block of A
          const u64 da = Cfg::A_KMAJOR ? smem_desc_sw128(a_tile + rb * 64 * 128 + kk * 32, 16, 1024)
                                       : smem_desc_sw128(a_tile + rb * ATOM_BYTES + kk * 2048, ATOM_BYTES, 1024);
          wgmma_m64k16<BN, Cfg::A_KMAJOR ? 0 : 1, Cfg::B_KMAJOR ? 0 : 1>(acc[b], da, db, 1);
        }
      }
      wgmma_commit();
      #pragma unroll
      for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
      wgmma_wait<1>();  // the previous stage's MMAs are done: hand its buffers back
      if (prev >= 0) release(prev);
      prev = stage;
      if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
    }
    if constexpr (L::PINGPONG) {
      if (tid == 0) mbar_arrive(&turn[wg ^ 1]);  // all MMAs issued: the other warpgroup's turn
      ++mine;
    }
    wgmma_wait<0>();
    #pragma unroll
    for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
    TRACE_TILE_END(tid == 0 && (L::PINGPONG || wg == 0), t);
    TRACE_EPI_BEGIN();
    if (prev >= 0) release(prev);
    if constexpr (Cfg::SPLIT_CLUSTER) {  // summed in the cluster (split_cluster_epilogue)
      named_barrier(6, 128 * CONSUMER_WARPGROUPS);  // both warpgroups' MMAs are done with the stages
      stage_accumulators<Cfg>(acc[0], smem, wg, tid);
      continue;
    }
    if constexpr (L::E_STAGED) {  // hand da' to the epilogue warps once they are done with the last
      mbar_wait(&epi_bar[1], (i & 1) ^ 1);
      stage_accumulators<Cfg>(acc[0], smem + L::DACC, wg, tid);
      mbar_arrive(&epi_bar[0]);
    } else if (L::TMA_STORE && (Cfg::GROUPING != kMGrouped || tc.m0 + row_off(0) + L::WG_ROWS <= tc.m_hi) &&
               (!Cfg::ROW_SPLIT || tc.m0 >= P.base.c2_rows)) {
      store_tile_tma<Cfg>(P, tc, acc, smem + L::STAGING + wg * L::STAGING_BYTES, row_off(0), wg, tid);
    } else {
      #pragma unroll
      for (int b = 0; b < HV; ++b) {
        if constexpr (Cfg::EPILOGUE == kSwigluBackward)
          swiglu_backward_tile<Cfg>(P.base, tc, acc[b], row_off(b), warp, lane);
        else
          store_tile_direct<Cfg>(P.base, tc, acc[b], row_off(b), warp, lane);
      }
    }
    TRACE_EPI_END(tid == 0 && (L::PINGPONG || wg == 0), t);
  }
  if (L::TMA_STORE && tid == 0) bulk_wait();
}

template <class Cfg>
__device__ __forceinline__ void kernel_body(const GemmSm90Params& P, u8* smem_raw) {
  using L = Plan<Cfg>;
  // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
  u8* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  u64* full = (u64*)(smem + L::BARRIERS);
  u64* empty = full + Cfg::STAGES;
  u64* turn = (u64*)(smem + L::TURNS);
  u64* epi_bar = (u64*)(smem + L::EPI_BARRIERS);  // [0] da' staged, [1] buffer free
  int* tile_start = (int*)(smem + L::SCHEDULE);
  const Feed<Cfg> feed(smem + L::FEED, P.base.tile_counter);  // (static: the counter is unused)
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < Cfg::STAGES; ++s) {
      mbar_init(&full[s], L::FULL_ARRIVALS);
      mbar_init(&empty[s], L::EMPTY_ARRIVALS);
    }
    mbar_init(&turn[0], 1);
    mbar_init(&turn[1], 1);
    if constexpr (L::E_STAGED) {
      mbar_init(&epi_bar[0], 128 * CONSUMER_WARPGROUPS);
      mbar_init(&epi_bar[1], 32 * L::E_WARPS);
    }
    feed.init(L::FEED_READERS);
    fence_barrier_init();
  }
  if constexpr (Cfg::GROUPING == kMGrouped) {
    if (tid >= 32 && tid < 64) Scheduler<Cfg>::build(P.base, tile_start, tid - 32);
  }
  __syncthreads();
  const Scheduler<Cfg> sched(P.base, tile_start);
  if (tid < PRODUCER_THREADS) {
    if constexpr (L::E_STAGED) {
      if (tid >= 32) {
        swiglu_epilogue_warps<Cfg>(P, sched, feed, smem + L::DACC, epi_bar, tid / 32 - 1, tid % 32);
        return;
      }
    } else {
      setmaxnreg_dec<L::PRODUCER_REGS>();
    }
    producer<Cfg>(P, sched, feed, smem, full, empty, tid);
    if constexpr (Cfg::SPLIT_CLUSTER) {  // the producer's part of the cluster's two barriers
      __syncwarp();  // (on its own path: these warps run on the producer's few registers)
      cluster_sync();
      cluster_sync();
    }
  } else if (tid < MAIN_THREADS) {
    if constexpr (!L::E_STAGED) setmaxnreg_inc<L::CONSUMER_REGS>();
    const int c = tid - PRODUCER_THREADS;
    consumer<Cfg>(P, sched, feed, smem, full, empty, turn, epi_bar, c / 128, c % 128);
    if constexpr (Cfg::SPLIT_CLUSTER) split_cluster_epilogue<Cfg>(P, sched, smem, c / 32, tid % 32);
  } else if constexpr (L::E_STAGED) {  // the epilogue warpgroup (no threads past MAIN_THREADS otherwise)
    swiglu_epilogue_warps<Cfg>(P, sched, feed, smem + L::DACC, epi_bar, 3 + (tid - MAIN_THREADS) / 32, tid % 32);
  }
}

}  // namespace sm90
}  // namespace gemm
