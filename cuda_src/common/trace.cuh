// A per-block SM timeline for bench/sm_timeline.py, compiled in only when the prelude defines
// CUPY_MOE_TRACE (cupy_moe/_build.py adds it when the environment variable CUPY_MOE_TRACE=1):
// which SM ran each block of each launch (%gridid, unique per launch), from when to when
// (%globaltimer, ns, one clock for all SMs). Block 0's thread 0 takes a record at entry; every
// warp stamps its exit, the block's end is the last stamp. Without the define, TRACE_SCOPE() (and
// the GEMM's TRACE_TILE_* / TRACE_EPI_*) are nothing: the kernels the library runs are not touched.
#pragma once

#ifdef CUPY_MOE_TRACE
struct TraceRecord {
  unsigned long long grid;
  unsigned int block, smid;  // (block: in cupy_moe_tile_trace, the GEMM's tile)
  unsigned long long start, end;
};
constexpr unsigned int kTraceCapacity = 1u << 18;
__device__ TraceRecord cupy_moe_trace[kTraceCapacity];
__device__ unsigned int cupy_moe_trace_count;

__device__ __forceinline__ unsigned long long trace_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Which launch (%gridid) and SM wrote record r, for block or tile `index`, from `start`.
__device__ __forceinline__ void trace_stamp(TraceRecord& r, unsigned int index, unsigned long long start) {
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r.smid));
  r.block = index;
  r.start = start;
}

struct TraceScope {
  int rec;
  __device__ TraceScope() {
    __shared__ int slot;
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
      const unsigned int n = atomicAdd(&cupy_moe_trace_count, 1u);
      slot = n < kTraceCapacity ? (int)n : -1;
      if (slot >= 0) {
        TraceRecord& r = cupy_moe_trace[slot];
        trace_stamp(r, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), trace_now());
        r.end = 0;
      }
    }
    __syncthreads();
    rec = slot;
  }
  __device__ ~TraceScope() {
    if (rec >= 0 && (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32 == 0)
      atomicMax(&cupy_moe_trace[rec].end, trace_now());
  }
};
#define TRACE_SCOPE() TraceScope trace_scope_

// Per tile of the Hopper GEMM (bench/sm_timeline.py --tiles): which SM ran tile `tile` of the
// launch, from the consumer's first wait for its operands to its last MMA's completion.
// Five records a tile at most: DeepSeek-V3's layer backward runs ~390K tiles (64 MB of records).
constexpr unsigned int kTileTraceCapacity = 1u << 21;
__device__ TraceRecord cupy_moe_tile_trace[kTileTraceCapacity];
__device__ unsigned int cupy_moe_tile_trace_count;

// The consumer's epilogue of a tile (TRACE_EPI_*: from its last MMA's completion to its result
// handed off) goes to the same records, the tile's index with kTraceEpilogue set.
constexpr unsigned int kTraceEpilogue = 0x80000000u;
// Two more parts of a tile, the same way: from the main loop's start to its first stage's data
// (TRACE_FIRST_WAIT: how long the consumers wait at a tile's start) and from its last MMAs' issue
// to their completion (TRACE_DRAIN_*).
constexpr unsigned int kTraceFirstWait = 0x40000000u, kTraceDrain = 0x20000000u;
// The producer's first stage of a tile: from its wait for a free slot to its loads' issue
// (TRACE_PRODUCER_*): with the consumers' wait0 of the same tile, how long the loads took.
constexpr unsigned int kTraceProducerFirst = 0x10000000u;

__device__ __forceinline__ void trace_tile(unsigned int tile, unsigned long long start) {
  const unsigned int n = atomicAdd(&cupy_moe_tile_trace_count, 1u);
  if (n >= kTileTraceCapacity) return;
  TraceRecord& r = cupy_moe_tile_trace[n];
  trace_stamp(r, tile, start);
  r.end = trace_now();
}
// One record of a tile part (kind: 0 or a kTrace* flag) from `start` to now, where `record`.
#define TRACE_TILE_PART_(record, tile, kind, start) \
  do {                                              \
    if (record) trace_tile((unsigned int)(tile) | (kind), start); \
  } while (0)
#define TRACE_TILE_BEGIN() const unsigned long long trace_tile_start_ = trace_now()
#define TRACE_TILE_END(record, tile) TRACE_TILE_PART_(record, tile, 0u, trace_tile_start_)
#define TRACE_FIRST_WAIT(record, tile) TRACE_TILE_PART_(record, tile, kTraceFirstWait, trace_tile_start_)
#define TRACE_EPI_BEGIN() const unsigned long long trace_epi_start_ = trace_now()
#define TRACE_EPI_END(record, tile) TRACE_TILE_PART_(record, tile, kTraceEpilogue, trace_epi_start_)
#define TRACE_PRODUCER_BEGIN() const unsigned long long trace_producer_start_ = trace_now()
#define TRACE_PRODUCER_END(record, tile) \
  TRACE_TILE_PART_(record, tile, kTraceProducerFirst, trace_producer_start_)
#define TRACE_DRAIN_BEGIN() const unsigned long long trace_drain_start_ = trace_now()
#define TRACE_DRAIN_END(record, tile) TRACE_TILE_PART_(record, tile, kTraceDrain, trace_drain_start_)
#else
// Untraced: every marker is an empty statement (the kernels the library runs are not touched).
#define TRACE_NOTHING_ \
  do {             \
  } while (0)
#define TRACE_SCOPE() TRACE_NOTHING_
#define TRACE_TILE_BEGIN() TRACE_NOTHING_
#define TRACE_TILE_END(record, tile) TRACE_NOTHING_
#define TRACE_EPI_BEGIN() TRACE_NOTHING_
#define TRACE_EPI_END(record, tile) TRACE_NOTHING_
#define TRACE_FIRST_WAIT(record, tile) TRACE_NOTHING_
#define TRACE_PRODUCER_BEGIN() TRACE_NOTHING_
#define TRACE_PRODUCER_END(record, tile) TRACE_NOTHING_
#define TRACE_DRAIN_BEGIN() TRACE_NOTHING_
#define TRACE_DRAIN_END(record, tile) TRACE_NOTHING_
#endif
