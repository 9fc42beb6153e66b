// The GEMM engine's first main loop: cp.async multi-stage pipeline, ldmatrix, mma.sync (bf16 in,
// fp32 accumulate). One template serves every GEMM of the layer; what differs is in Cfg:
//   A_KMAJOR / B_KMAJOR  operand majors (MN-major operands are read with ldmatrix.trans, so no
//                        transposed copy of a weight or an activation is ever made)
//   VEC_A / VEC_B        16-byte cp.async loads (every line, extent and offset a multiple of 8
//                        elements) or element loads (any shape, e.g. tiny test configs)
//   GATHER_A / GATHER_B  the operand's memory lines are read through an index map (line -> map[line]
//                        / gather_div), which fuses the token gather of grouped GEMMs into the loads
//   GROUPING             none | M-grouped (experts' row segments, B per group) | K-grouped (each
//                        group reduces over its own line segment, C per group)
//   EPILOGUE             store bf16 | store fp32 | accumulate into fp32
// C[m, n] = sum over segments s, k of A_s(m, k) * B_s(k, n). Several K segments concatenate the
// reduction ([A1 | A2] @ [B1; B2]) without a concatenated copy of either operand.
// GemmParams is rendered from cupy_moe/gpu/gemm.py (one definition for Python and C++).
#pragma once
#include "../common/ptx.cuh"
#include "kinds.cuh"

namespace gemm {

// Shared-memory tile of one operand: K-major [OUTER][BK] or MN-major [BK][OUTER]; rows padded by
// 8 elements (16 B) so ldmatrix's eight row reads hit eight different bank quads.
template <int OUTER, int BK, bool KMAJOR>
struct TileShape {
  static constexpr int ROWS = KMAJOR ? OUTER : BK;
  static constexpr int DATA_COLS = KMAJOR ? BK : OUTER;
  static constexpr int COLS = DATA_COLS + 8;
  static constexpr int ELEMS = ROWS * COLS;
};

// Where one operand's tile comes from: memory lines [line0, line_hi) of `ld` elements, valid
// columns [c0, c_hi) within a line, lines optionally remapped through `map`.
struct TileSource {
  const bf16_t* base;
  i64 ld;
  const int* map;
  int map_div;
  int line0, line_hi;
  int c0, c_hi;
};

template <class Shape, bool VEC, int THREADS>
__device__ __forceinline__ void load_tile(bf16_t* smem, const TileSource& s) {
  if constexpr (VEC) {
    constexpr int CHUNKS_PER_ROW = Shape::DATA_COLS / 8;
    constexpr int CHUNKS = Shape::ROWS * CHUNKS_PER_ROW;
    #pragma unroll
    for (int i = threadIdx.x; i < CHUNKS; i += THREADS) {
      const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
      const int line = s.line0 + r, col = s.c0 + c;
      const bool ok = line < s.line_hi && col < s.c_hi;
      const bf16_t* src = s.base;  // any valid address when !ok (zero-filled)
      if (ok) {
        const i64 mem = s.map ? (i64)(s.map[line] / s.map_div) : (i64)line;
        src = s.base + mem * s.ld + col;
      }
      cp_async_16(smem + r * Shape::COLS + c, src, ok ? 16 : 0);
    }
  } else {
    constexpr int ELEMS = Shape::ROWS * Shape::DATA_COLS;
    for (int i = threadIdx.x; i < ELEMS; i += THREADS) {
      const int r = i / Shape::DATA_COLS, c = i % Shape::DATA_COLS;
      const int line = s.line0 + r, col = s.c0 + c;
      bf16_t v = 0;
      if (line < s.line_hi && col < s.c_hi) {
        const i64 mem = s.map ? (i64)(s.map[line] / s.map_div) : (i64)line;
        v = s.base[mem * s.ld + col];
      }
      smem[r * Shape::COLS + c] = v;
    }
  }
}

// A fragments (m16 x k16) for one warp's MI row tiles from a K-major or M-major tile.
template <class Shape, bool KMAJOR, int MI>
__device__ __forceinline__ void load_a_frags(u32 (&a)[MI][4], const bf16_t* t, int wm0, int kk, int lane) {
  #pragma unroll
  for (int i = 0; i < MI; ++i) {
    if constexpr (KMAJOR) {
      const int row = wm0 + i * 16 + (lane % 16), col = kk * 16 + (lane / 16) * 8;
      ldmatrix_x4(a[i], t + row * Shape::COLS + col);
    } else {
      const int q = lane / 8, r = lane % 8;
      const int k = kk * 16 + (q / 2) * 8 + r, m = wm0 + i * 16 + (q % 2) * 8;
      ldmatrix_x4_trans(a[i], t + k * Shape::COLS + m);
    }
  }
}

// B fragments (k16 x n8) for NI column tiles, two per ldmatrix.x4.
template <class Shape, bool KMAJOR, int NI>
__device__ __forceinline__ void load_b_frags(u32 (&b)[NI][2], const bf16_t* t, int wn0, int kk, int lane) {
  #pragma unroll
  for (int j = 0; j < NI / 2; ++j) {
    u32 r4[4];
    const int q = lane / 8, r = lane % 8;
    if constexpr (KMAJOR) {
      const int n = wn0 + j * 16 + (q / 2) * 8 + r, k = kk * 16 + (q % 2) * 8;
      ldmatrix_x4(r4, t + n * Shape::COLS + k);
    } else {
      const int k = kk * 16 + (q % 2) * 8 + r, n = wn0 + j * 16 + (q / 2) * 8;
      ldmatrix_x4_trans(r4, t + k * Shape::COLS + n);
    }
    b[2 * j][0] = r4[0]; b[2 * j][1] = r4[1];
    b[2 * j + 1][0] = r4[2]; b[2 * j + 1][1] = r4[3];
  }
}

// The tile a block owns: its rows [m0, m_hi), columns [n0, N), reduction lines [k_lo, k_hi) for
// K-grouped GEMMs, and the group (which selects B for M-grouped, C for K-grouped).
struct TileCoord {
  int group, m0, m_hi, n0, k_lo, k_hi;
  bool valid;
};

template <class Cfg>
__device__ __forceinline__ TileCoord locate_tile(const GemmParams& p) {
  TileCoord t;
  t.n0 = blockIdx.x * Cfg::BN;
  t.group = 0; t.k_lo = 0; t.k_hi = 0; t.valid = true;
  if constexpr (Cfg::GROUPING == kMGrouped) {
    // Walk the experts' row segments to find which one holds this block's m-tile; sizes stay on
    // the device, the grid is the upper bound ceil(M / BM) + groups.
    int tile = blockIdx.y, g = 0;
    t.valid = false;
    for (; g < p.num_groups; ++g) {
      const int lo = p.group_offsets[g], hi = p.group_offsets[g + 1];
      const int tiles = (hi - lo + Cfg::BM - 1) / Cfg::BM;
      if (tile < tiles) {
        t.group = g; t.m0 = lo + tile * Cfg::BM; t.m_hi = hi; t.valid = true;
        break;
      }
      tile -= tiles;
    }
  } else {
    t.m0 = blockIdx.y * Cfg::BM;
    t.m_hi = p.m;
    if constexpr (Cfg::GROUPING == kKGrouped) {
      t.group = blockIdx.z;
      t.k_lo = k_group_start(p, t.group);
      t.k_hi = k_group_start(p, t.group + 1);
    }
  }
  return t;
}

template <class Cfg>
__device__ __forceinline__ void gemm_kernel_body(const GemmParams& p, bf16_t* smem) {
  using ShapeA = TileShape<Cfg::BM, Cfg::BK, Cfg::A_KMAJOR>;
  using ShapeB = TileShape<Cfg::BN, Cfg::BK, Cfg::B_KMAJOR>;
  constexpr int THREADS = Cfg::WARPS_M * Cfg::WARPS_N * 32;
  constexpr int WTM = Cfg::BM / Cfg::WARPS_M, WTN = Cfg::BN / Cfg::WARPS_N;
  constexpr int MI = WTM / 16, NI = WTN / 8;
  constexpr int STAGE_ELEMS = ShapeA::ELEMS + ShapeB::ELEMS;
  static_assert(Cfg::GROUPING != kMGrouped || Cfg::A_KMAJOR, "M-grouped GEMMs take a K-major A");
  static_assert(Cfg::GROUPING != kKGrouped || (!Cfg::A_KMAJOR && !Cfg::B_KMAJOR),
                "K-grouped GEMMs reduce over memory lines: both operands MN-major");
  static_assert(NI % 2 == 0 && Cfg::BK % 16 == 0, "tile shape");
  static_assert(Cfg::EPILOGUE <= kAccumulateF32, "fused epilogues are the Hopper main loop's");

  const TileCoord tc = locate_tile<Cfg>(p);
  if (!tc.valid || tc.n0 >= p.n) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm0 = (warp / Cfg::WARPS_N) * WTM, wn0 = (warp % Cfg::WARPS_N) * WTN;

  // k-tiles of each segment, concatenated.
  int seg_tiles[MAX_SEGMENTS];
  int total_tiles = 0;
  #pragma unroll
  for (int s = 0; s < MAX_SEGMENTS; ++s) {
    const int k = Cfg::GROUPING == kKGrouped ? tc.k_hi - tc.k_lo : p.seg_k[s];
    seg_tiles[s] = s < p.num_segments ? (k + Cfg::BK - 1) / Cfg::BK : 0;
    total_tiles += seg_tiles[s];
  }

  auto issue_loads = [&](int tile, int stage) {
    int s = 0;
    while (s + 1 < p.num_segments && tile >= seg_tiles[s]) { tile -= seg_tiles[s]; ++s; }
    const int kbase = tile * Cfg::BK;
    const int seg_k = Cfg::GROUPING == kKGrouped ? tc.k_hi : p.seg_k[s];
    const int k_first = Cfg::GROUPING == kKGrouped ? tc.k_lo + kbase : kbase;
    const i64 b_off = Cfg::GROUPING == kMGrouped ? (i64)tc.group * p.b_group_stride[s] : 0;
    TileSource a, b;
    a.base = (const bf16_t*)p.a[s]; a.ld = p.lda[s];
    a.map = Cfg::GATHER_A ? p.gather_a : nullptr; a.map_div = p.gather_div;
    b.base = (const bf16_t*)p.b[s] + b_off; b.ld = p.ldb[s];
    b.map = Cfg::GATHER_B ? p.gather_b : nullptr; b.map_div = p.gather_div;
    if (Cfg::A_KMAJOR) { a.line0 = tc.m0; a.line_hi = tc.m_hi; a.c0 = k_first; a.c_hi = seg_k; }
    else               { a.line0 = k_first; a.line_hi = seg_k; a.c0 = tc.m0; a.c_hi = tc.m_hi; }
    if (Cfg::B_KMAJOR) { b.line0 = tc.n0; b.line_hi = p.n; b.c0 = k_first; b.c_hi = seg_k; }
    else               { b.line0 = k_first; b.line_hi = seg_k; b.c0 = tc.n0; b.c_hi = p.n; }
    bf16_t* st = smem + stage * STAGE_ELEMS;
    load_tile<ShapeA, Cfg::VEC_A, THREADS>(st, a);
    load_tile<ShapeB, Cfg::VEC_B, THREADS>(st + ShapeA::ELEMS, b);
  };

  float acc[MI][NI][4];
  #pragma unroll
  for (int i = 0; i < MI; ++i)
    #pragma unroll
    for (int j = 0; j < NI; ++j)
      #pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

  #pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < total_tiles) issue_loads(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < total_tiles; ++kt) {
    cp_async_wait<Cfg::STAGES - 2>();
    __syncthreads();
    const int next = kt + Cfg::STAGES - 1;
    if (next < total_tiles) issue_loads(next, next % Cfg::STAGES);
    cp_async_commit();
    const bf16_t* ta = smem + (kt % Cfg::STAGES) * STAGE_ELEMS;
    const bf16_t* tb = ta + ShapeA::ELEMS;
    #pragma unroll
    for (int kk = 0; kk < Cfg::BK / 16; ++kk) {
      u32 af[MI][4], bfr[NI][2];
      load_a_frags<ShapeA, Cfg::A_KMAJOR, MI>(af, ta, wm0, kk, lane);
      load_b_frags<ShapeB, Cfg::B_KMAJOR, NI>(bfr, tb, wn0, kk, lane);
      #pragma unroll
      for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j) mma_bf16_16816(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: straight from the accumulator fragments (row gid / gid+8, columns 2*tig, 2*tig+1).
  const i64 c_off = Cfg::GROUPING == kKGrouped ? (i64)tc.group * p.c_group_stride : 0;
  const int gid = lane / 4, tig = lane % 4;
  #pragma unroll
  for (int i = 0; i < MI; ++i)
    #pragma unroll
    for (int j = 0; j < NI; ++j)
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = tc.m0 + wm0 + i * 16 + gid + h * 8;
        if (row >= tc.m_hi) continue;
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = tc.n0 + wn0 + j * 8 + tig * 2 + e;
          if (col >= p.n) continue;
          const i64 at = c_off + (i64)row * p.ldc + col;
          const float v = acc[i][j][h * 2 + e];
          if constexpr (Cfg::EPILOGUE == kStoreBf16) ((bf16_t*)p.c)[at] = f32_to_bf16(v);
          else if constexpr (Cfg::EPILOGUE == kStoreF32) ((float*)p.c)[at] = v;
          else ((float*)p.c)[at] += v;
        }
      }
}

}  // namespace gemm
