// What a GEMM instantiation does, shared by both main loops (values match cupy_moe/gpu/gemm.py).
#pragma once

namespace gemm {
enum Grouping { kNone = 0, kMGrouped = 1, kKGrouped = 2 };
enum Epilogue { kStoreBf16 = 0, kStoreF32 = 1, kAccumulateF32 = 2, kSwigluBackward = 3 };
}  // namespace gemm
