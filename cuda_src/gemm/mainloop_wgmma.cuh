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
// Inf or NaN never leaks in). bf16 results, and fp32 ones of cooperative tiles, leave through
// shared memory and TMA stores that overlap the next tile's main loop; the others and M-grouped
// tiles that straddle a group's end are stored from registers. The fused SwiGLU backward
// (E_STAGED) leaves each tile's fp32 accumulators in shared memory for seven epilogue warps,
// which read gate/up/act and write the gradients while the consumers run the next tile's main
// loop (done by the consumers themselves, it left the tensor cores idle for a third of the
// kernel). Cfg fields as in mainloop_mma.cuh, plus BN, STAGES, C_TMA, PINGPONG and E_STAGED.
#pragma once
#include "sm90_plan.cuh"
#include "sm90_loads.cuh"
#include "sm90_epilogues.cuh"
#include "wgmma_ops.cuh"

namespace gemm {

namespace sm90 {

// Thread 0 also claims the CTA's tiles and feeds their indices to the other warps: the next one
// once the current one's loads are issued (its latency hides behind the stages in flight; an
// earlier claim timed the same: bench/NOTES.md v0.31).
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
    // A claimed index comes from an atomic: a per-thread register, so every TMA copy of the tile
    // took a waterfall loop of R2UR conversions. Passed through a shuffle (a no-op: one lane), it
    // is warp-uniform, and the tile's coordinates stay in uniform registers as a static tile's do.
    const int t = L::CPA ? feed.to_producer(claimed, tid) : Cfg::DYNAMIC ? __shfl_sync(1u, claimed, 0) : claimed;
    if (t >= sched.total) break;
    const Tile tc = sched.tile(t);
    const int grp = Cfg::GROUPING == kMGrouped ? tc.group : 0;
    const bool half_a = L::HALF_A && tc.m_hi - tc.m0 <= 64;  // (as the consumers' idle test)
    // Ungrouped: the last row tile of a segment with all m rows loads exactly its rows (a box that
    // reaches past the map's last row slows every CTA's loads; gpu/gemm.py TAIL_BOXES). The
    // stage's other rows keep older data, which reaches only result rows past m.
    const bool tail_tile = L::HALF_A && Cfg::GROUPING == kNone && p.a_tail_rows > 0 && tc.m0 + BM > p.m;
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
        TRACE_PRODUCER_BEGIN();
        mbar_wait(&empty[stage], phase ^ 1);
        u8* ta = smem + stage * L::STAGE_BYTES;
        u8* tb = ta + L::A_BYTES;
        const int kl = shift_last && k0 + BK > k_end ? k_end - BK : k0;  // the lines loaded
        const int k_lines = L::K_TAIL && k0 + BK > k_end ? k_end - k0 : BK;  // K_TAIL: this step's lines
        if (tid == 0 && k_lines < BK) {
          // Each 64-wide atom: the step's lines by a box of exactly them, the rest of its lines
          // from a block of zeros in global memory by a bulk copy (zero lines look the same in
          // any swizzle): no load reaches past K, and nothing is written by the threads.
          const u32 zeros = (BK - k_lines) * 128;
          mbar_arrive_expect_tx(&full[stage], L::TMA_BYTES);
          #pragma unroll
          for (int a = 0; a < BM / 64; ++a) {
            tma_load_3d(ta + a * ATOM_BYTES, &P.tma_a_half[s], &full[stage], tc.m0 + 64 * a, k0, 0);
            bulk_load(ta + a * ATOM_BYTES + k_lines * 128, p.zeros, zeros, &full[stage]);
          }
          #pragma unroll
          for (int a = 0; a < BN / 64; ++a) {
            tma_load_3d(tb + a * ATOM_BYTES, &P.tma_b_tail[s], &full[stage], tc.n0 + 64 * a, k0, grp);
            bulk_load(tb + a * ATOM_BYTES + k_lines * 128, p.zeros, zeros, &full[stage]);
          }
          if (kt == 0) TRACE_PRODUCER_END(true, t);
        } else if (tid == 0) {
          // A's rows this stage loads: all BM, or by tma_a_half 64 (an idle warpgroup) or the tail's
          const int a_rows = tail_tile && p.seg_m[s] == 0 ? p.a_tail_rows : half_a ? 64 : BM;
          if constexpr (L::TMA_BYTES > 0)
            mbar_arrive_expect_tx(&full[stage], L::TMA_BYTES - (BM - a_rows) * (L::A_BYTES / BM));
          else mbar_arrive(&full[stage]);
          if (a_rows < BM) tma_tile<64, true>(ta, &P.tma_a_half[s], &full[stage], tc.m0, kl, 0);
          else if constexpr (!L::CPA_A) tma_tile<BM, Cfg::A_KMAJOR>(ta, &P.tma_a[s], &full[stage], tc.m0, kl, 0);
          if constexpr (L::PAIR_ROWS)  // the same rows of the second half
            tma_tile<BM, Cfg::A_KMAJOR>(ta + L::A_BYTES / 2, &P.tma_a[s], &full[stage], tc.m0 + p.m / 2, kl, 0);
          if constexpr (!L::CPA_B)
            tma_tile<BN, Cfg::B_KMAJOR>(tb, &P.tma_b[s], &full[stage], tc.n0, kl, grp);
          if (kt == 0) TRACE_PRODUCER_END(true, t);
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
  constexpr int ATOMS_A = L::MASK_A ? L::A_ROWS / 64 : 0, ATOMS_B = L::MASK_B ? Cfg::BN / 64 : 0;
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

// K-grouped, cooperative, a shifted last k-tile (only A's lines are zeroed): lines [first, first +
// count) of A's atom `atom` alone, the rows warpgroup `atom` multiplies, by its own 128 threads
// (barrier `bar`), so neither warpgroup waits for the other's zeroing.
template <class Cfg>
__device__ __forceinline__ void mask_a_atom(u8* stage, int atom, int first, int count, int tid, int bar) {
  u8* tile = stage + atom * ATOM_BYTES + first * 128;
  for (int i = tid; i < count * 8; i += 128) {
    *(uint4*)(tile + (i / 8) * 128 + (i % 8) * 16) = make_uint4(0, 0, 0, 0);
    if constexpr (Plan<Cfg>::PAIR_ROWS)  // the warpgroup's atom of the second half too
      *(uint4*)(tile + (BM / 64) * ATOM_BYTES + (i / 8) * 128 + (i % 8) * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  named_barrier(bar, 128);
}

// A stage's MMAs over its k16 steps [LO, HI) (a K-grouped tail's run, SKIP_K16: a run of wgmmas
// with no branch between them; a branch there made ptxas fence before each, or serialize all).
// a_desc(b, kk): A's descriptor for accumulator block b at step kk.
template <class Cfg, int LO, int HI, int HV, class ADesc>
__device__ __forceinline__ void stage_mmas(float (&acc)[HV][Cfg::BN / 2], const ADesc& a_desc, u32 b_tile) {
  constexpr int STEP_B = Cfg::B_KMAJOR ? 32 : 2048;
  constexpr u32 LBO_B = Cfg::B_KMAJOR ? 16 : ATOM_BYTES;
  #pragma unroll
  for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
  wgmma_fence();
  const u64 db0 = smem_desc_sw128(b_tile, LBO_B, 1024);
  const u32 db0_lo = smem_desc_sw128_lo(b_tile, LBO_B);
  #pragma unroll
  for (int kk = LO; kk < HI; ++kk) {
    const u64 db = Cfg::DESC_STEP && Cfg::DESC_LO32 ? smem_desc_sw128_hi(1024) | (db0_lo + kk * (STEP_B / 16))
                   : Cfg::DESC_STEP ? db0 + kk * (STEP_B / 16)
                                    : smem_desc_sw128(b_tile + kk * STEP_B, LBO_B, 1024);
    #pragma unroll
    for (int b = 0; b < HV; ++b)
      wgmma_m64k16<Cfg::BN, Cfg::A_KMAJOR ? 0 : 1, Cfg::B_KMAJOR ? 0 : 1>(acc[b], a_desc(b, kk), db, 1);
  }
  wgmma_commit();
}

// A consumer warpgroup's tiles: all of them (cooperative, rows 64 wg ... 64 wg + 63 of each) or
// every other one (ping-pong: wg owns the CTA's tiles i with i % 2 == wg, skipping the stages of
// the others', and waits for its turn at the tensor cores: turn[wg] completes when every warp of
// the other warpgroup has issued its previous tile's MMAs).
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
  // SLIM_CONSUMER: one elected lane arrives (the warp is converged after its wgmma wait), and an
  // idle warpgroup's stages pass by in a loop of their own, so the MMA loop has neither the
  // divergence check of __syncwarp nor the idle test in it.
  auto release = [&](int s) {
    if constexpr (Cfg::SLIM_CONSUMER) {
      if (elect_one()) mbar_arrive(&empty[s]);
    } else {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  };
  // Row offset of accumulator block b within the tile.
  auto row_off = [&](int b) { return L::PINGPONG ? 64 * b : 64 * wg; };
  u8* const staging = smem + L::STAGING + wg * L::STAGING_BYTES;
  // DEFER_STORE: the last tile's results, stored batch by batch under this tile's first MMAs.
  HeldResults<Cfg> held;
  Tile held_tc;
  bool holding = false;
  auto store_held = [&](int from, int to) {
    if constexpr (L::DEFER_STORE) store_tile_tma<Cfg>(P, held_tc, held, staging, row_off(0), wg, tid, from, to);
  };
  int t_ahead = 0;  // HELP_LAST: entry i, read ahead at tile i - 1's end
  bool ahead = false;
  for (int i = 0;; ++i) {
    const int t = ahead ? t_ahead : feed.read(i, lane);
    ahead = false;
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
    // K-grouped: the k-tile's rank within its segment's run over the group's lines (a counter:
    // a runtime modulo here was ~4% of the wgrad's stall samples, ahead of every k-step's MMAs).
    const int seg_tiles = (tc.k_hi - tc.k_lo + BK - 1) / BK;
    int kin = 0;
    if (Cfg::SLIM_CONSUMER && idle) {
      for (int kt = 0; kt < nk; ++kt) {
        mbar_wait(&full[stage], phase);
        release(stage);
        if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
      }
    }
    const int nk_mma = Cfg::SLIM_CONSUMER && idle ? 0 : nk;
    for (int kt = 0; kt < nk_mma; ++kt) {
      mbar_wait(&full[stage], phase);
      if (kt == 0) TRACE_FIRST_WAIT(tid == 0 && (L::PINGPONG || wg == 0), t);
      if (!Cfg::SLIM_CONSUMER && idle) {
        release(stage);
        if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
        continue;
      }
      int kk_lo = 0, kk_hi = BK / 16;  // the k16 steps this k-tile issues
      if constexpr (L::MASK_A || L::MASK_B) {
        const int valid = tc.k_hi - tc.k_lo - kin * BK;
        if (++kin == seg_tiles) kin = 0;
        if (valid < BK) {
          // Loaded shifted to the group's end (the producer's shift_last): the tile before's
          // lines [0, BK - valid) in A; else the next group's [valid, BK) in both operands.
          // SKIP_K16: the k16 steps made wholly of such lines are not issued, and only the lines
          // of the one step they split are zeroed (a group's last k-tile holds 32 such lines on
          // average at random routing: ~1.5 of a tile's ~34 steps).
          const bool shifted = L::SHIFT_LAST && tc.k_hi - tc.k_lo >= BK;
          int first = shifted ? 0 : valid, count = BK - valid;
          if (Cfg::SKIP_K16 && shifted) {
            kk_lo = count / 16;
            first = 16 * kk_lo;
            count %= 16;
          } else if (Cfg::SKIP_K16) {
            kk_hi = (valid + 15) / 16;
            count = 16 * kk_hi - valid;
          }
          u8* st = smem + stage * L::STAGE_BYTES;
          if (count == 0) {
          } else if constexpr (L::PINGPONG) {
            mask_lines<Cfg>(st, first, count, !shifted, tid, 128, 4 + wg);
          } else if (shifted) {
            mask_a_atom<Cfg>(st, wg, first, count, tid, 4 + wg);
          } else {
            mask_lines<Cfg>(st, first, count, !shifted, tid + 128 * wg, 256, 1);
          }
        }
      }
      const u32 a_tile = smem_addr(smem + stage * L::STAGE_BYTES);
      const u32 b_tile = a_tile + L::A_BYTES;
      // Operand descriptors: the k16 step kk starts kk * 32 bytes (K-major) or kk * 2048 (MN-major)
      // into the stage. DESC_STEP: the stage's descriptors once, and each step adds its offset / 16
      // to their start-address field (the low 14 bits hold address / 16; shared addresses stay
      // below 256 KB, so no carry leaves the field): the same bits with fewer integer instructions
      // on the path to each HGMMA, where the staged SwiGLU epilogue's math holds them up (ncu: the
      // descriptors' LOP3 / SHF / R2UR stalled on the math pipe; bench/NOTES.md v0.19).
      constexpr int STEP_A = Cfg::A_KMAJOR ? 32 : 2048, STEP_B = Cfg::B_KMAJOR ? 32 : 2048;
      constexpr u32 LBO_A = Cfg::A_KMAJOR ? 16 : ATOM_BYTES, LBO_B = Cfg::B_KMAJOR ? 16 : ATOM_BYTES;
      // DESC_LO32: the steps in the descriptors' low words alone, their high words constant
      // (smem_desc_sw128_lo / _hi): the fused SwiGLU dgrad's consumers issued 4 R2UR and two 64-bit adds
      // per HGMMA beside the epilogue warps' math; -2.8% on it (bench/NOTES.md v0.22).
      auto a_desc = [&](int b, int kk) {  // b: the accumulator block, whose 64-row block of A it reads
        const int block = L::PAIR_ROWS ? wg + b * (BM / 64) : row_off(b) / 64;  // (paired: the same rows of half b)
        const u32 at = a_tile + block * (Cfg::A_KMAJOR ? 64 * 128 : ATOM_BYTES);
        if constexpr (Cfg::DESC_STEP && Cfg::DESC_LO32)
          return smem_desc_sw128_hi(1024) | (smem_desc_sw128_lo(at, LBO_A) + kk * (STEP_A / 16));
        return Cfg::DESC_STEP ? smem_desc_sw128(at, LBO_A, 1024) + kk * (STEP_A / 16)
                              : smem_desc_sw128(at + kk * STEP_A, LBO_A, 1024);
      };
      constexpr int KK = BK / 16;
      if constexpr (Cfg::SKIP_K16 && (L::MASK_A || L::MASK_B)) {
        // One of the 7 runs a k-tile can take (a shifted tail starts late, a short group's ends
        // early), chosen by warp votes: ptxas sees each branch taken by the whole warp.
        const auto all = [](bool c) { return __all_sync(0xffffffffu, c); };
        if (all(kk_lo == 0 && kk_hi == KK)) stage_mmas<Cfg, 0, KK>(acc, a_desc, b_tile);
        else if (all(kk_lo == 1)) stage_mmas<Cfg, 1, KK>(acc, a_desc, b_tile);
        else if (all(kk_lo == 2)) stage_mmas<Cfg, 2, KK>(acc, a_desc, b_tile);
        else if (all(kk_lo == 3)) stage_mmas<Cfg, 3, KK>(acc, a_desc, b_tile);
        else if (all(kk_hi == 1)) stage_mmas<Cfg, 0, 1>(acc, a_desc, b_tile);
        else if (all(kk_hi == 2)) stage_mmas<Cfg, 0, 2>(acc, a_desc, b_tile);
        else stage_mmas<Cfg, 0, 3>(acc, a_desc, b_tile);
      } else {  // (the same run inline: through stage_mmas, every GEMM's machine code changed)
        #pragma unroll
        for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
        wgmma_fence();
        const u64 db0 = smem_desc_sw128(b_tile, LBO_B, 1024);
        const u32 db0_lo = smem_desc_sw128_lo(b_tile, LBO_B);
        #pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
          const u64 db = Cfg::DESC_STEP && Cfg::DESC_LO32 ? smem_desc_sw128_hi(1024) | (db0_lo + kk * (STEP_B / 16))
                         : Cfg::DESC_STEP ? db0 + kk * (STEP_B / 16)
                                          : smem_desc_sw128(b_tile + kk * STEP_B, LBO_B, 1024);
          #pragma unroll
          for (int b = 0; b < HV; ++b)
            wgmma_m64k16<BN, Cfg::A_KMAJOR ? 0 : 1, Cfg::B_KMAJOR ? 0 : 1>(acc[b], a_desc(b, kk), db, 1);
        }
        wgmma_commit();
      }
      #pragma unroll
      for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
      if (L::DEFER_STORE && holding && kt + L::HELD_FROM < L::STORE_BATCHES)
        store_held(L::HELD_FROM + kt, L::HELD_FROM + kt + 1);  // under the MMAs
      wgmma_wait<1>();  // the previous stage's MMAs are done: hand its buffers back
      if (prev >= 0) release(prev);
      prev = stage;
      if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
    }
    if constexpr (L::PINGPONG) {
      // All MMAs issued: the other warpgroup's turn. Every warp arrives (turn's count is 4), each
      // once all its lanes are past their own turn wait: a tile without k-steps (a K-grouped
      // tile of an empty group) has no wgmma to hold the warpgroup's warps together, and with one
      // thread arriving for all, a warp still polling turn[wg] could see it complete twice (the
      // other warpgroup's next tile) and wait on the wrong parity forever (found under memcheck,
      // bench/NOTES.md v0.53).
      __syncwarp();
      if (lane == 0) mbar_arrive(&turn[wg ^ 1]);
      ++mine;
    }
    if (L::DEFER_STORE && holding) {  // batches this tile had no k-steps for
      store_held(L::HELD_FROM + (idle ? 0 : nk), L::STORE_BATCHES);
      holding = false;
    }
    TRACE_DRAIN_BEGIN();
    wgmma_wait<0>();
    #pragma unroll
    for (int b = 0; b < HV; ++b) fence_operands(acc[b]);
    TRACE_DRAIN_END(tid == 0 && (L::PINGPONG || wg == 0), t);
    TRACE_TILE_END(tid == 0 && (L::PINGPONG || wg == 0), t);
    TRACE_EPI_BEGIN();
    if (prev >= 0) release(prev);
    if constexpr (Cfg::SPLIT_CLUSTER) {  // summed in the cluster (split_cluster_epilogue)
      if constexpr (L::PAIR_ROWS) {  // the two halves' products of the same rows: first + second
        #pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[0][j] += acc[1][j];
      }
      named_barrier(6, 128 * CONSUMER_WARPGROUPS);  // both warpgroups' MMAs are done with the stages
      stage_accumulators<Cfg>(acc[0], smem, wg, tid);
      continue;
    }
    if constexpr (L::E_STAGED) {  // hand da' to the epilogue warps once they are done with the last
      mbar_wait(&epi_bar[1], (i & 1) ^ 1);
      stage_accumulators<Cfg>(acc[0], smem + L::DACC, wg, tid);
      mbar_arrive(&epi_bar[0]);
      if constexpr (Cfg::HELP_LAST) {  // the CTA's last tile: its rows shared with the epilogue warps
        t_ahead = feed.read(i + 1, lane);
        ahead = true;
        if (t_ahead >= sched.total) {
          named_barrier(6, 128 * CONSUMER_WARPGROUPS);  // both warpgroups' da' is staged
          staged_tile_rows<Cfg>(P.base, tc, smem + L::DACC, L::E_WARPS + 4 * wg + warp, L::LAST_TILE_WARPS,
                                lane, nullptr, 0);
        }
      }
    } else if (L::TMA_STORE && (Cfg::GROUPING != kMGrouped || tc.m0 + row_off(0) + L::WG_ROWS <= tc.m_hi) &&
               (!Cfg::ROW_SPLIT || tc.m0 >= P.base.c2_rows)) {
      if constexpr (L::DEFER_STORE) {
        if (L::HELD_FROM > 0) store_tile_tma<Cfg>(P, tc, LiveResults<Cfg>{acc}, staging, row_off(0), wg, tid, 0, L::HELD_FROM);
        held.hold(acc);
        held_tc = tc;
        holding = true;
      } else {
        store_tile_tma<Cfg>(P, tc, LiveResults<Cfg>{acc}, staging, row_off(0), wg, tid);
      }
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
  if (L::DEFER_STORE && holding) store_held(L::HELD_FROM, L::STORE_BATCHES);
  if (L::TMA_STORE && tid == 0) bulk_wait();
}

// TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
__device__ __forceinline__ u8* aligned_smem(u8* smem_raw) {
  return smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
}

// The CTA's set-up, by thread 0: its barriers, and with EARLY_SETUP its operands' tensor maps
// fetched ahead of their first copies. It reads nothing a prior grid writes, so with EARLY_SETUP
// the kernel runs it before wait_prior_grids(), under the tail of the grid before it (a
// programmatic launch's CTAs start as that grid's last CTAs leave, ~2 us before its memory is
// flushed and the wait returns); else kernel_body runs it after the wait. The barrier before
// the CTA's roles start (kernel_body) publishes it to the other threads.
template <class Cfg>
__device__ __forceinline__ void set_up(const GemmSm90Params& P, u8* smem_raw) {
  using L = Plan<Cfg>;
  if (threadIdx.x != 0) return;
  u8* smem = aligned_smem(smem_raw);
  u64* full = (u64*)(smem + L::BARRIERS);
  u64* empty = full + Cfg::STAGES;
  u64* turn = (u64*)(smem + L::TURNS);
  u64* epi_bar = (u64*)(smem + L::EPI_BARRIERS);
  for (int s = 0; s < Cfg::STAGES; ++s) {
    mbar_init(&full[s], L::FULL_ARRIVALS);
    mbar_init(&empty[s], L::EMPTY_ARRIVALS);
  }
  mbar_init(&turn[0], 4);  // (a warpgroup's four warps: see the consumer)
  mbar_init(&turn[1], 4);
  if constexpr (L::E_STAGED) {
    mbar_init(&epi_bar[0], 128 * CONSUMER_WARPGROUPS);
    mbar_init(&epi_bar[1], 32 * L::E_WARPS);
  }
  const Feed<Cfg> feed(smem + L::FEED, P.base.tile_counter);
  feed.init(L::FEED_READERS);
  fence_barrier_init();
  if constexpr (Cfg::EARLY_SETUP) {
    for (int s = 0; s < P.base.num_segments; ++s) {
      if (P.base.seg_k[s] == 0) continue;  // (its maps were never encoded)
      if constexpr (!L::CPA_A) prefetch_tensormap(&P.tma_a[s]);
      if constexpr (!L::CPA_B) prefetch_tensormap(&P.tma_b[s]);
    }
    if constexpr (L::TMA_STORE) prefetch_tensormap(&P.tma_c);
  }
}

template <class Cfg>
__device__ __forceinline__ void kernel_body(const GemmSm90Params& P, u8* smem_raw) {
  using L = Plan<Cfg>;
  u8* smem = aligned_smem(smem_raw);
  u64* full = (u64*)(smem + L::BARRIERS);
  u64* empty = full + Cfg::STAGES;
  u64* turn = (u64*)(smem + L::TURNS);
  u64* epi_bar = (u64*)(smem + L::EPI_BARRIERS);  // [0] da' staged, [1] buffer free
  int* tile_start = (int*)(smem + L::SCHEDULE);
  const Feed<Cfg> feed(smem + L::FEED, P.base.tile_counter);  // (static: the counter is unused)
  const int tid = threadIdx.x;
  if constexpr (!Cfg::EARLY_SETUP) set_up<Cfg>(P, smem_raw);
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
      if constexpr (Cfg::CLUSTER_RELAXED_EXIT) cluster_sync_relaxed(); else cluster_sync();
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
