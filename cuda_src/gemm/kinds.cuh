// What a GEMM instantiation does, shared by both main loops (values match cupy_moe/gpu/gemm.py).
#pragma once

namespace gemm {
enum Grouping { kNone = 0, kMGrouped = 1, kKGrouped = 2 };
enum Epilogue { kStoreBf16 = 0, kStoreF32 = 1, kAccumulateF32 = 2, kSwigluBackward = 3 };

// First reduction line of a K-grouped GEMM's group g: group_offsets[g], or without offsets the
// g-th of num_groups equal pieces of the lines (split-K; no table to allocate or keep).
template <class Params>
__device__ __forceinline__ int k_group_start(const Params& p, int g) {
  return p.group_offsets ? p.group_offsets[g] : (int)((long long)p.seg_k[0] * g / p.num_groups);
}
}  // namespace gemm
