// Routing sort: a deterministic, stable counting sort of the T*K (token, slot) pairs by expert.
// histogram per chunk -> scan (expert offsets, per-chunk bases) -> stable placement per chunk.
// Everything stays on the device; the grouped GEMMs read expert_offsets directly.
#include "common/topk_check.cuh"

constexpr int kChunk = 2048;  // slots per chunk (one block in histogram and placement)

extern "C" __global__ void routing_histogram(const i64* __restrict__ topk_idx, int n_slots, int E,
                                             int* __restrict__ chunk_counts) {
  wait_prior_grids();
  TRACE_SCOPE();
  extern __shared__ int hist[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int base = blockIdx.x * kChunk;
  for (int i = threadIdx.x; i < kChunk && base + i < n_slots; i += blockDim.x)
    atomicAdd(&hist[(int)topk_idx[base + i]], 1);  // integer counts: order-independent
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[(i64)blockIdx.x * E + e] = hist[e];
}

// One block. expert_offsets[e] = sum of all counts of experts < e; chunk_base[c][e] = where chunk
// c's first slot of expert e goes.
extern "C" __global__ void routing_scan(const int* __restrict__ chunk_counts, int chunks, int E,
                                        int* __restrict__ chunk_base, int* __restrict__ expert_offsets,
                                        i64* __restrict__ tokens_per_expert) {
  wait_prior_grids();
  TRACE_SCOPE();
  extern __shared__ int totals[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int sum = 0;
    for (int c = 0; c < chunks; ++c) sum += chunk_counts[(i64)c * E + e];
    totals[e] = sum;
    tokens_per_expert[e] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < E; ++e) { const int v = totals[e]; totals[e] = run; expert_offsets[e] = run; run += v; }
    expert_offsets[E] = run;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = totals[e];
    for (int c = 0; c < chunks; ++c) {
      chunk_base[(i64)c * E + e] = run;
      run += chunk_counts[(i64)c * E + e];
    }
  }
}

// One warp per chunk, 32 slots a step in slot order: lanes holding the same expert rank among
// themselves with __match_any_sync, so slots keep their order within an expert (tokens ascending).
extern "C" __global__ void routing_place(const i64* __restrict__ topk_idx, int n_slots, int E,
                                         const int* __restrict__ chunk_base,
                                         int* __restrict__ sorted_slots, int* __restrict__ row_of_slot) {
  wait_prior_grids();
  TRACE_SCOPE();
  extern __shared__ int running[];
  const int lane = threadIdx.x;
  for (int e = lane; e < E; e += 32) running[e] = chunk_base[(i64)blockIdx.x * E + e];
  __syncwarp();
  const int base = blockIdx.x * kChunk;
  for (int i = 0; i < kChunk; i += 32) {
    const int slot = base + i + lane;
    const bool valid = slot < n_slots;
    const int e = valid ? (int)topk_idx[slot] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (valid) {
      const int rank = __popc(peers & ((1u << lane) - 1u));
      const int row = running[e] + rank;
      sorted_slots[row] = slot;
      row_of_slot[slot] = row;
    }
    __syncwarp();
    if (valid && lane == __ffs(peers) - 1) running[e] += __popc(peers);
    __syncwarp();
    if (base + i + 32 >= n_slots) break;
  }
}

// The top-k index check on its own (common/topk_check.cuh): one thread per row, the block's
// first bad rows folded in shared memory, the grid's verdict published to the host and to the
// launches that follow.
extern "C" __global__ void check_topk_indices(const i64* __restrict__ topk_idx, int T, int K, int E,
                                              int* __restrict__ scratch, volatile int* report) {
  wait_prior_grids();
  TRACE_SCOPE();
  __shared__ int first_bad[2];
  if (threadIdx.x == 0) first_bad[0] = first_bad[1] = kNoRow;
  __syncthreads();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T) {
    const TopkRowFaults f = topk_row_faults(topk_idx + (i64)t * K, K, E);
    if (f.out_of_range) atomicMin(&first_bad[0], t);
    if (f.repeated) atomicMin(&first_bad[1], t);
  }
  __syncthreads();
  if (threadIdx.x == 0) publish_topk_verdict(first_bad[0], first_bad[1], scratch, report);
}
