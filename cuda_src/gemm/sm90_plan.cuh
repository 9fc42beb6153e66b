// The Hopper GEMM's plan per Cfg: tile and block shape, shared-memory layout, register split,
// and the compile-time checks of what combines with what (mainloop_wgmma.cuh has the design).
#pragma once
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
  // Ungrouped, MN-major A and B (gemm.py K_TAIL_BOXES): a segment's last k-step short of BK lines
  // comes by boxes of exactly its lines (GemmSm90Params::tma_a_half, tma_b_tail) and the stage's
  // other lines of both operands by bulk copies of zeros (lines past K, loaded, would be
  // zero-filled by the TMA unit, which slows every CTA's loads: bench/NOTES.md v0.45).
  static constexpr bool K_TAIL = Cfg::K_TAIL && Cfg::GROUPING == kNone && !Cfg::A_KMAJOR && !Cfg::B_KMAJOR &&
                                 !CPA && !Cfg::SPLIT_K && !Cfg::PAIR_ROWS;
  static constexpr bool TMA_STORE = Cfg::C_TMA;  // bf16 or fp32 output with 16-byte aligned strides
  // PAIR_ROWS (K-grouped [hi; lo] halves summed in the CTA, gemm(sum_groups_and_halves)): a stage
  // holds A's rows m0 .. m0 + BM - 1 and the same rows of the second half (m0 + m / 2 ...); each
  // warpgroup multiplies its 64 rows of both into two accumulator blocks and adds them at the
  // tile's end, so one CTA reads x once for both halves (bench/NOTES.md v0.43).
  static constexpr bool PAIR_ROWS = Cfg::PAIR_ROWS;
  static constexpr int A_ROWS = PAIR_ROWS ? 2 * BM : BM;
  static constexpr int A_BYTES = A_ROWS * BK * 2, B_BYTES = Cfg::BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr u32 TMA_BYTES = (CPA_A ? 0 : A_BYTES) + (CPA_B ? 0 : B_BYTES);
  // A cooperative tile with at most 64 real rows (an expert's or the matrix's last) loads only the
  // first 64 rows of a K-major A (GemmSm90Params::tma_a_half), the rows of the one warpgroup that
  // multiplies: the other is idle. Where such tiles share a GEMM's last round with full ones,
  // fewer bytes end the round sooner: SOL-080 -5..-7 us at the T with <= 64 rows in the last
  // m-tile; the layer's M-grouped GEMMs -0.15..-0.45% (bench/NOTES.md v0.26).
  static constexpr bool HALF_A = !CPA_A && Cfg::A_KMAJOR && !Cfg::PINGPONG && Cfg::GROUPING != kKGrouped;
  static constexpr bool PINGPONG = Cfg::PINGPONG;
  static constexpr int HALVES = PINGPONG || PAIR_ROWS ? 2 : 1;  // 64-row accumulator blocks per warpgroup
  static constexpr int WG_ROWS = PINGPONG ? 128 : 64;              // result rows per warpgroup
  // A consumer warpgroup's results leave through shared memory in units of 64 rows of 128 bytes
  // (64 bf16 or 32 fp32 columns; 8 KB, one TMA box each): all its units at once, or
  // (Cfg::STORE_RING) through a ring of that many units, a unit's buffer reused once the TMA store
  // before has read it. The ring's 32 KB instead of 64 let a 128 x 256 tile keep a 4th stage.
  static constexpr int C_BYTES = Cfg::EPILOGUE == kStoreF32 ? 4 : 2;
  static constexpr int UNIT_COLS = 128 / C_BYTES;
  static constexpr int STORE_UNITS = HALVES * Cfg::BN / UNIT_COLS;
  static constexpr int RING = Cfg::STORE_RING > 0 ? Cfg::STORE_RING : STORE_UNITS;
  static constexpr int STORE_BATCH = Cfg::STORE_RING > 0 ? RING / 2 : STORE_UNITS;  // units a batch
  static constexpr int STORE_BATCHES = STORE_UNITS / STORE_BATCH;
  // DEFER_STORE: a cooperative warpgroup keeps its last HELD_BATCHES batches of a finished tile's
  // bf16 results packed in registers (as many as Cfg::DEFER_STORE registers a thread hold, beside
  // the next tile's BN / 2 accumulators) and stores them a batch per k-step under the next tile's
  // first MMAs, so the tensor pipes and the load stream stop for fewer stores at each tile switch
  // (what the K-grouped weight gradients' 8 k-step tiles lost, bench/NOTES.md v0.18). Tiles with
  // fewer k-steps than held batches store the rest after their loop.
  static constexpr int UNIT_REGS = 64 * 64 / 128 / 2;  // a bf16 unit's bf16x2 pairs a consumer thread holds
  static constexpr int BATCH_REGS = STORE_BATCH * UNIT_REGS * HALVES;
  static constexpr int HELD_BATCHES =
      TMA_STORE && C_BYTES == 2 && !PINGPONG && !Cfg::E_STAGED && !Cfg::SPLIT_CLUSTER
          ? (Cfg::DEFER_STORE / BATCH_REGS < STORE_BATCHES ? Cfg::DEFER_STORE / BATCH_REGS : STORE_BATCHES)
          : 0;
  static constexpr bool DEFER_STORE = HELD_BATCHES > 0;
  static constexpr int HELD_FROM = STORE_BATCHES - HELD_BATCHES;
  static constexpr int STAGING = Cfg::STAGES * STAGE_BYTES;        // per consumer warpgroup:
  static constexpr int STAGING_BYTES = TMA_STORE ? RING * ATOM_BYTES : 0;  // its units' buffers
  // SwiGLU backward with E_STAGED: the consumers leave each tile's fp32 accumulators (da') in
  // this buffer and go on with the next tile; E_WARPS epilogue warps (the producer warpgroup's
  // spare warps 1..3 and a fourth warpgroup) turn them into dg, du (and aw, dw) meanwhile,
  // reading gate, up (and act) from global memory. (Their cost to the main loop is mostly their
  // math's issue slots, not their loads' latency: bench/NOTES.md v0.7.)
  static constexpr bool E_STAGED = Cfg::E_STAGED;
  static constexpr int E_WARPS = E_STAGED ? 3 + 4 : 0;
  // Cfg::HELP_LAST: the warps that share a CTA's last staged tile, the consumers' after these.
  static constexpr int LAST_TILE_WARPS = E_WARPS + 4 * CONSUMER_WARPGROUPS;
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
  // DEFER_STORE's held results take 232 (a 40-register producer; at 224 the 128 x 256 tiles spilled).
  static constexpr int PRODUCER_REGS = DEFER_STORE ? 40 : 56, CONSUMER_REGS = DEFER_STORE ? 232 : 224;
  static_assert(Cfg::BN == 64 || Cfg::BN == 128 || Cfg::BN == 256, "BN");
  static_assert(!PINGPONG || Cfg::BN <= 128, "a ping-pong warpgroup holds 128 x BN accumulators");
  static_assert(MAX_SEGMENTS >= 1, "segments");
  static_assert(!Cfg::C_TMA || Cfg::EPILOGUE == kStoreBf16 ||
                (Cfg::EPILOGUE == kStoreF32 && !Cfg::C_TRANS && !Cfg::SPLIT_K && !PINGPONG),
                "TMA stores carry bf16 results, or fp32 ones of whole cooperative tiles");
  static_assert(Cfg::STORE_RING == 0 || (Cfg::C_TMA && STORE_UNITS % Cfg::STORE_RING == 0 &&
                                          Cfg::STORE_RING % 2 == 0 && Cfg::STORE_RING < STORE_UNITS),
                "a store ring: an even count of units that divides the warpgroup's, fewer than all");
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
  static_assert(!PAIR_ROWS || (Cfg::SPLIT_CLUSTER && Cfg::GROUPING == kKGrouped && Cfg::EPILOGUE == kStoreF32),
                "paired rows: the router's [hi; lo] halves, summed in the CTA, pieces in the cluster");
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
                                Cfg::M_FASTEST, Cfg::BAND_M, Cfg::PAIR_ROWS>;
template <class Cfg>
using Feed = TileFeed<Cfg::DYNAMIC, Cfg::STATIC_SHUFFLE>;

}  // namespace sm90
}  // namespace gemm
