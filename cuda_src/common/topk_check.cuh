// The top-k index check: which rows of topk_indices are bad, and how a grid publishes its verdict
// without the host waiting in front of the work it guards. Used by the check kernel of its own
// (routing.cu, the layer's calls) and by SOL-080's router kernel, which checks the rows it reads.
//
// Protocol (one check at a time per scratch/report pair, i.e. per CUDA stream):
//   scratch[0], [1]: the first row with an index outside [0, E) / repeating an expert (kNoRow: none)
//   scratch[2]:      blocks done; scratch[3]: the last verdict (nonzero: bad), which the launches
//                    enqueued after the check read at entry (cancelled() in types.cuh)
//   report[0..2]:    host-mapped [first bad-range row, first repeat row, done flag]. The host
//                    clears the flag before it launches the check and waits for every check it
//                    launched, so a set flag is this check's. No sequence number travels to the
//                    device, so a captured CUDA graph can replay the check as it is, and no block
//                    reads host memory (PCIe reads from many blocks serialise: ~1 us each).
// Each block folds its rows into scratch[0..1]; the last block to finish publishes the verdict,
// then the flag, and resets scratch[0..2] for the next call: no memset, no copy and no stream
// sync. The host polls report[2].
#pragma once
#include "types.cuh"

constexpr int kNoRow = 0x7FFFFFFF;

struct TopkRowFaults {
  bool out_of_range = false, repeated = false;
};

// Slot k of a row: its expert outside [0, E), or the same as an earlier slot's (pairwise: K, the
// experts per token, is small). Folded into f.
__device__ __forceinline__ void add_topk_slot_faults(TopkRowFaults& f, const i64* __restrict__ row,
                                                     int k, int E) {
  const i64 e = row[k];
  f.out_of_range |= e < 0 || e >= E;
  for (int j = 0; j < k; ++j) f.repeated |= row[j] == e;
}

__device__ __forceinline__ TopkRowFaults topk_row_faults(const i64* __restrict__ row, int K, int E) {
  TopkRowFaults f;
  for (int k = 0; k < K; ++k) add_topk_slot_faults(f, row, k, E);
  return f;
}

// The same check with a row's slots one a lane (K <= 32): lane k holds slot k's expert, -1 where
// it lies outside [0, E). Slots outside [0, E) take a key of their own, so only in-range experts
// can repeat; a row with one outside is rejected for its range first anyway (the verdict reports
// range faults before repeats). first_of_expert: this slot is the lowest that holds its expert.
struct LaneSlotFaults {
  bool out_of_range, repeated, first_of_expert;
};

__device__ __forceinline__ LaneSlotFaults lane_topk_slot_faults(int expert, int K, int lane) {
  const bool slot = lane < K, in_range = slot && expert >= 0;
  const unsigned same = __match_any_sync(0xffffffffu, in_range ? expert : -2 - lane);
  return {slot && !in_range, in_range && __popc(same) > 1,
          in_range && (same & ((1u << lane) - 1u)) == 0};
}

// Called by one thread of every block, after the block's first bad rows are known (kNoRow: none).
__device__ __forceinline__ void publish_topk_verdict(int block_bad_range, int block_bad_repeat,
                                                     int* __restrict__ scratch, volatile int* report) {
  if (block_bad_range != kNoRow) atomicMin(&scratch[0], block_bad_range);
  if (block_bad_repeat != kNoRow) atomicMin(&scratch[1], block_bad_repeat);
  __threadfence();  // this block's verdict is visible before it counts itself done
  if (atomicAdd(&scratch[2], 1) != (int)(gridDim.x * gridDim.y * gridDim.z) - 1) return;
  __threadfence();
  const int bad_range = atomicExch(&scratch[0], kNoRow), bad_repeat = atomicExch(&scratch[1], kNoRow);
  scratch[3] = bad_range != kNoRow || bad_repeat != kNoRow;
  report[0] = bad_range;
  report[1] = bad_repeat;
  scratch[2] = 0;
  __threadfence_system();  // the verdict reaches the host before the flag does
  report[2] = 1;
}
