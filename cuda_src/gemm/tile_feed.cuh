// Which tiles a persistent CTA computes, handed from its producer to every warp that walks them.
//
// Static (DYNAMIC false, Sm90Config.DYNAMIC): tiles blockIdx.x, blockIdx.x + gridDim.x, ...; the
// feed compiles to nothing (its ring in a static kernel cost SOL-080 ~8 us through the larger
// code of every warp's loop, bench/NOTES.md v0.10).
// Dynamic (a counter pair in global memory, GemmParams.tile_counter): the first tile is
// blockIdx.x, every later one is claimed with one atomicAdd when the CTA's producer has issued
// the loads of its current tile. A CTA that starts late (its SM was held by a kernel on another
// stream) or whose tiles are cheaper (an M-grouped tile past its expert's end) then simply takes
// fewer tiles, instead of finishing its fixed share after everyone else. Each tile is still
// computed whole by one CTA in the same order of operations, so which CTA takes it does not move
// a bit of the result: deterministic.
//
// Dynamic, the producer's thread 0 writes each tile index into a small ring in shared memory; the
// readers (consumer warps, epilogue warps) wait on its full barrier, read, and hand the slot back;
// a cp.async producer's other threads get it through a named barrier (to_producer). The last
// entry is an index >= the tile count: everyone stops there.
// Counter reset: counter[1] counts the CTAs whose producer is done claiming; the last of them
// zeroes both words, so the next launch on the stream (stream order, and every kernel waits for
// the grid before it: wait_prior_grids) finds them zero: no memset per launch. Two launches that
// may overlap (other streams) must use different pairs (cupy_moe/gpu/gemm.py gives each prepared
// launch its own).
#pragma once
#include "../common/hopper.cuh"

namespace gemm {

// SHUFFLE (static only; an A/B of Sm90Config.STATIC_SHUFFLE): CTA b starts at tile pi(b), a fixed
// permutation of [0, gridDim.x), then steps by gridDim.x as before: each round runs the same tiles
// as the plain static order, but neighbouring CTAs hold unrelated tiles, as claimed tiles do.
template <bool DYNAMIC, bool SHUFFLE = false>
struct TileFeed {
  static constexpr int SLOTS = 4;  // the producer may run this many tiles ahead of the slowest reader
  static constexpr int BYTES = SLOTS * (4 + 8 + 8) + 16;
  // Not volatile: the full barrier's try_wait (an acquire, and an asm with a memory clobber)
  // already orders the read after the producer's write. A volatile read made ptxas put a YIELD
  // into the consumers' k-loop of every cooperative dynamic build; without it the layer's
  // grouped GEMMs and SOL-080 timed the same (bench/NOTES.md v0.30): not what claims cost.
  int* slot;
  u64* full;
  u64* empty;
  volatile int* producer_tile;  // thread 0's claim, for a cp.async producer's other threads
  int* counter;

  __device__ TileFeed(u8* at, int* tile_counter)
      : slot((int*)at), full((u64*)(at + 4 * SLOTS)), empty(full + SLOTS),
        producer_tile((volatile int*)(empty + SLOTS)), counter(tile_counter) {}

  __device__ void init(int readers) const {  // one thread, before the CTA's first barrier
    if constexpr (!DYNAMIC) return;
    for (int s = 0; s < SLOTS; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], readers);
    }
  }

  // The producer's thread 0 (and, static, every reader): the CTA's first tile, and the one after tile t.
  __device__ int first() const {
    if constexpr (SHUFFLE && !DYNAMIC) {  // b -> b p mod grid, p a prime not dividing the grid
      const unsigned p = gridDim.x % 37 == 0 ? 41u : 37u;
      return (int)(blockIdx.x * p % gridDim.x);
    }
    return blockIdx.x;
  }
  __device__ int after(int t) const {
    if constexpr (DYNAMIC) return (int)gridDim.x + atomicAdd(counter, 1);
    return t + (int)gridDim.x;
  }

  // The producer's thread 0: tile t is the CTA's entry i.
  __device__ void publish(int i, int t) const {
    if constexpr (!DYNAMIC) return;  // static: every reader knows it
    const int s = i % SLOTS;
    mbar_wait(&empty[s], ((i / SLOTS) & 1) ^ 1);
    slot[s] = t;
    mbar_arrive(&full[s]);
  }

  // A reader warp, all lanes: entry i. Lane 0 reads the slot and hands it back; the others get
  // the index by the shuffle. (Every lane reading it was correct, the shuffle ordering their
  // reads before lane 0's hand-back, but racecheck does not see that order and reported each
  // slot's reuse as a WAR hazard.)
  __device__ int read(int i, int lane) const {
    if constexpr (!DYNAMIC) return first() + i * (int)gridDim.x;
    const int s = i % SLOTS;
    mbar_wait(&full[s], (i / SLOTS) & 1);
    const int t = __shfl_sync(0xffffffffu, lane == 0 ? slot[s] : 0, 0);  // (warp-uniform: see the producer)
    if (lane == 0) mbar_arrive(&empty[s]);
    return t;
  }

  // A cp.async producer warpgroup (all 128 threads): thread 0's tile t, to every thread. Few
  // registers: the producer runs on 56.
  __device__ int to_producer(int t, int tid) const {
    if constexpr (!DYNAMIC) return t;  // every thread walks the static order itself
    if (tid == 0) *producer_tile = t;
    named_barrier(PRODUCER_BARRIER, 128);
    t = *producer_tile;
    named_barrier(PRODUCER_BARRIER, 128);  // all have read it before thread 0 writes the next
    return t;
  }
  static constexpr int PRODUCER_BARRIER = 8;  // (1 .. 6: the main loop's own)

  // The producer's thread 0, after publishing its last entry (an index past the tiles).
  __device__ void done() const {
    if constexpr (!DYNAMIC) return;
    __threadfence();  // this CTA's claims are performed before it counts itself done
    if (atomicAdd(counter + 1, 1) == (int)gridDim.x - 1) {
      counter[0] = 0;  // every CTA has made its last claim
      counter[1] = 0;
    }
  }
};

}  // namespace gemm
