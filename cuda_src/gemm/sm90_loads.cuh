// Operand tiles into the swizzled stages: by cp.async (gathered lines) or by TMA.
#pragma once
#include "sm90_plan.cuh"

namespace gemm {
namespace sm90 {

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

}  // namespace sm90
}  // namespace gemm
