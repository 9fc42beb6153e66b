// Persistent tile scheduler of the Hopper GEMM: a linear tile index -> (group, rows, columns,
// reduction range). Group sizes stay in device memory (no host sync per call); every CTA walks
// tiles blockIdx.x, blockIdx.x + gridDim.x, ... (or claims them as it goes: tile_feed.cuh), its
// producer, consumers and epilogue warps in the same order.
// Order: n fastest, so CTAs running together share an A row block and sweep B, which stays in L2
// (one expert's weights for M-grouped GEMMs).
// Split-K (SPLIT: ungrouped GEMMs, num_groups = S pieces): the reduction, every segment's k-tiles in
// order, is cut into S nearly equal runs of k-tiles; piece s of every output tile goes to the
// fp32 partial C + s * c_group_stride (the caller sums the pieces in a fixed order). Pieces are
// the outermost index, so CTAs running together share operands as without the split; or, when
// the pieces of a tile form a thread-block cluster (PIECES_INNER, one tile per CTA), the innermost:
// CTA t is piece t % S of tile t / S, and its rank in the cluster is its piece. K-grouped with
// PIECES_INNER: the groups and the two halves of the rows whose products add up (the router's
// stacked [hi; lo], gemm(sum_groups_and_halves)) form the cluster, in (group, half) order; with
// PAIR_ROWS the halves share a CTA (m counts both: m / 2 result rows) and the cluster holds the
// groups alone, in order.
#pragma once
#include "../common/types.cuh"
#include "kinds.cuh"

namespace gemm {

struct Tile {
  int group;        // B's expert (M-grouped), C's expert (K-grouped), C's split-K piece; else 0
  int m0, m_hi;     // rows [m0, m0 + BM) of which those below m_hi are real
  int n0;
  int k_lo, k_hi;   // K-grouped: the group's reduction lines; split-K: the piece's k-tiles
};

// SEG_ROWS: segments may have rows of their own (GemmParams.seg_m), and the order may be rotated.
// M_FASTEST (ungrouped, unsplit; an A/B of Sm90Config): rows fastest instead, so CTAs running
// together share a B column block and sweep A (for a product whose B is the larger operand).
// BAND > 1 (unsplit, columns fastest; Sm90Config.BAND_M): row tiles in bands of BAND (M-grouped:
// over all groups' row tiles; K-grouped: within each group), each band's columns in turn and its
// rows fastest within a column, so that the CTAs of a GPC, which run consecutive tiles together,
// hold a few rows x a few columns of tiles (sharing both operands) instead of one row block x
// sixteen columns (bench/NOTES.md v0.31).
template <int BM, int BN, int GROUPING, bool SPLIT, bool PIECES_INNER = false, int BK = 64, bool SEG_ROWS = false,
          bool M_FASTEST = false, int BAND = 1, bool PAIR_ROWS = false>
struct TileScheduler {
  static_assert(!SPLIT || GROUPING == kNone, "split-K pieces of ungrouped GEMMs only");
  static_assert(!M_FASTEST || (GROUPING == kNone && !SPLIT && !SEG_ROWS), "rows fastest: plain GEMMs");
  static_assert(!PIECES_INNER || SPLIT || GROUPING == kKGrouped, "pieces innermost: split-K or K-grouped");
  static_assert(!PAIR_ROWS || (PIECES_INNER && GROUPING == kKGrouped), "paired rows: K-grouped pieces innermost");
  const GemmParams& p;
  const int* tile_start;  // M-grouped: first m-tile of each group, num_groups + 1 entries (smem)
  int tiles_m, tiles_n, total;

  // M-grouped only, run by one warp before the CTA's first barrier: prefix sums of m-tiles.
  __device__ static void build(const GemmParams& p, int* tile_start, int lane) {
    int carry = 0;
    for (int base = 0; base < p.num_groups; base += 32) {
      const int g = base + lane;
      int c = g < p.num_groups ? (p.group_offsets[g + 1] - p.group_offsets[g] + BM - 1) / BM : 0;
      #pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, c, d);
        if (lane >= d) c += v;
      }
      if (g < p.num_groups) tile_start[g + 1] = carry + c;
      carry += __shfl_sync(0xffffffffu, c, 31);
    }
    if (lane == 0) tile_start[0] = 0;
  }

  __device__ TileScheduler(const GemmParams& params, const int* starts) : p(params), tile_start(starts) {
    tiles_n = (p.n + BN - 1) / BN;
    tiles_m = GROUPING == kMGrouped ? tile_start[p.num_groups] : ((PAIR_ROWS ? p.m / 2 : p.m) + BM - 1) / BM;
    total = tiles_m * tiles_n * (GROUPING == kKGrouped || SPLIT ? p.num_groups : 1);
  }

  __device__ Tile tile(int t) const {
    // Ungrouped: the order can start at tile_rotation instead of 0, so that the first tiles (the
    // costly ones of a segment that reaches only the first rows, Segment.m) fall to the CTAs of
    // the persistent grid that take one tile fewer (cupy_moe/gpu/gemm.py).
    if constexpr (SEG_ROWS && GROUPING == kNone)
      if (p.tile_rotation) t = (t + p.tile_rotation) % total;
    Tile c;
    c.n0 = (M_FASTEST ? t / tiles_m : t % tiles_n) * BN;
    int mt = M_FASTEST ? t % tiles_m : t / tiles_n;
    if constexpr (BAND > 1 && !SPLIT && !M_FASTEST && !PIECES_INNER) {
      const int per = GROUPING == kKGrouped ? tiles_m * tiles_n : total;  // a K-group's tiles, else all
      const int g = t / per, r = t - g * per;
      const int band = r / (BAND * tiles_n), rest = r - band * BAND * tiles_n;
      const int rows = min(BAND, tiles_m - band * BAND);  // (the last band may be narrower)
      c.n0 = rest / rows * BN;
      mt = g * tiles_m + band * BAND + rest % rows;
    }
    c.group = 0; c.k_lo = 0; c.k_hi = 0; c.m_hi = p.m;
    if constexpr (GROUPING == kMGrouped) {
      int lo = 0, hi = p.num_groups;  // the last group whose first m-tile is <= mt
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (tile_start[mid] <= mt) lo = mid; else hi = mid;
      }
      c.group = lo;
      c.m0 = p.group_offsets[lo] + (mt - tile_start[lo]) * BM;
      c.m_hi = p.group_offsets[lo + 1];
    } else if constexpr (GROUPING == kKGrouped) {
      if constexpr (PIECES_INNER && PAIR_ROWS) {
        // The groups of one output tile innermost: CTA t is group t % G of output tile t / G.
        const int rest = t / p.num_groups;
        c.group = t % p.num_groups;
        c.m0 = rest % tiles_m * BM;
        c.n0 = rest / tiles_m * BN;
      } else if constexpr (PIECES_INNER) {
        // The rows' two halves and the groups of one output tile innermost, (group, half) order:
        // CTA t is half t % 2 of group t / 2 % G of row block b of column tile n (tiles_m = 2B).
        const int B = tiles_m / 2, half = t % 2, rest = t / (2 * p.num_groups);
        c.group = t / 2 % p.num_groups;
        c.m0 = (half * B + rest % B) * BM;
        c.n0 = rest / B * BN;
      } else {
        c.group = mt / tiles_m;
        c.m0 = (mt % tiles_m) * BM;
      }
      c.k_lo = k_group_start(p, c.group);
      c.k_hi = k_group_start(p, c.group + 1);
    } else if constexpr (SPLIT) {
      int all = 0;  // k-tiles of the whole reduction
      for (int s = 0; s < p.num_segments; ++s) all += (p.seg_k[s] + BK - 1) / BK;
      if constexpr (PIECES_INNER) {
        const int tile = t / p.num_groups;
        c.group = t % p.num_groups;  // the piece
        c.n0 = (tile % tiles_n) * BN;
        c.m0 = (tile / tiles_n) * BM;
      } else {
        c.group = mt / tiles_m;  // the piece
        c.m0 = (mt % tiles_m) * BM;
      }
      c.k_lo = (int)((long long)all * c.group / p.num_groups);
      c.k_hi = (int)((long long)all * (c.group + 1) / p.num_groups);
    } else {
      c.m0 = mt * BM;
    }
    return c;
  }

  // Whether the producer loads k-tile kt (counted over all segments) for this tile.
  __device__ bool loads(const Tile& c, int kt) const {
    return !SPLIT || (kt >= c.k_lo && kt < c.k_hi);
  }

  // Whether segment s reaches the tile's rows (a segment whose A has only seg_m[s] rows, the rest
  // zeros, adds nothing to the rows past them: its loads and MMAs are skipped there).
  __device__ bool in_segment(const Tile& c, int s) const { return !SEG_ROWS || p.seg_m[s] == 0 || c.m0 < p.seg_m[s]; }

  // Reduction tiles of a tile: every segment's k range in BK steps (split-K: its piece's).
  __device__ int k_tiles(const Tile& c) const {
    if constexpr (SPLIT) return c.k_hi - c.k_lo;
    int n = 0;
    for (int s = 0; s < p.num_segments; ++s) {
      if (!in_segment(c, s)) continue;
      const int k = GROUPING == kKGrouped ? c.k_hi - c.k_lo : p.seg_k[s];
      n += (k + BK - 1) / BK;
    }
    return n;
  }
};

}  // namespace gemm
