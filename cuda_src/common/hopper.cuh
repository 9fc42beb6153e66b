// Hopper (sm_90a) vocabulary: mbarriers, TMA tile loads, cp.async completion on an mbarrier,
// warpgroup MMA (wgmma) fences and shared-memory matrix descriptors, register reallocation.
#pragma once
#include "ptx.cuh"

// A CUtensorMap encoded on the host (cupy_moe/gpu/tma.py); opaque here, 64-byte aligned.
struct alignas(64) TmaDesc { u64 opaque[16]; };

// Brings a tensor map (here: a kernel parameter's) into the TMA unit's descriptor cache ahead of
// its first copy.
__device__ __forceinline__ void prefetch_tensormap(const TmaDesc* desc) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)desc) : "memory");
}

// --- mbarrier --------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(u64* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count));
}
// Makes initialised barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}
// True in one lane of the (converged) warp: a uniform election, no divergence check around it.
__device__ __forceinline__ bool elect_one() {
  u32 one;
  asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n" : "=r"(one));
  return one != 0;
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}
#ifdef CUPY_MOE_WATCHDOG
// A hang finder, compiled in only when the prelude defines CUPY_MOE_WATCHDOG (cupy_moe/_build.py
// adds it for CUPY_MOE_WATCHDOG=1): a wait that has spun for 2^31 cycles (~1.3 s) records who waits
// on which barrier into host-mapped memory (cupy_moe_watchdog_out, set by load_module) and goes on
// waiting, so the host can read the records while the kernel hangs (bench/NOTES.md v0.53).
struct WatchdogRecord {
  u32 block, thread, bar, parity, written;
};
constexpr u32 kWatchdogRecords = 1024;  // (_build.WATCHDOG_RECORDS)
__device__ WatchdogRecord* cupy_moe_watchdog_out;
__device__ unsigned int cupy_moe_watchdog_count;  // (in device memory: PCIe may lack host atomics)
__device__ __forceinline__ void watchdog_record(u32 bar, u32 parity) {
  WatchdogRecord* out = cupy_moe_watchdog_out;
  if (out == nullptr) return;
  const u32 n = atomicAdd(&cupy_moe_watchdog_count, 1u);
  if (n >= kWatchdogRecords) return;
  out[n] = WatchdogRecord{blockIdx.x, threadIdx.x, bar, parity, 1u};
  __threadfence_system();
}
#endif
// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
  const u32 a = smem_addr(bar);
#ifdef CUPY_MOE_WATCHDOG
  const long long t0 = clock64();
  bool told = false;
  while (!mbar_try_wait(a, parity)) {
    if (!told && clock64() - t0 > (1ll << 31)) {
      watchdog_record(a, parity);
      told = true;
    }
  }
#else
  while (!mbar_try_wait(a, parity)) {}
#endif
}
// Arrives on the barrier once every cp.async this thread issued so far has landed (counts
// against the barrier's expected arrivals).
__device__ __forceinline__ void cp_async_arrive_on(u64* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}

// --- TMA -------------------------------------------------------------------------------------
// One box of a 3-D tensor map (c0 innermost) into shared memory, completion as transaction bytes
// on `bar`. Out-of-bounds elements arrive as zeros and still count as bytes.
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDesc* map, u64* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n"
      :: "r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)) : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global into shared memory by the
// bulk-copy engine, completion as transaction bytes on `bar`: no registers held while in flight.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// Shared memory written through the generic proxy (cp.async, st.shared) that wgmma reads next.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Four 8 x 8 bf16 matrices, transposed, from the mma fragment layout (thread t holds row t / 4,
// columns 2 (t % 4) and 2 (t % 4) + 1 of matrix i in r[i]): row k of matrix i's transpose (its
// column k) goes to the 16 bytes at thread 8 i + k's address.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

// --- wgmma -----------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }

// Keeps the compiler from moving accumulator reads/writes across wgmma issue and wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
  #pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// Descriptor of a 128-byte-swizzled shared-memory operand (tile base 1024-byte aligned).
// K-major: rows of 64 elements (128 B), 8-row atoms 1024 B apart (SBO); LBO unused.
// MN-major: rows along K, 64 MN-elements each; LBO = bytes between 64-wide MN atoms,
// SBO = bytes between groups of 8 K rows.
// Its two words: the low one (start address / 16, leading-byte offset / 16) and the high one
// (stride-byte offset / 16, the swizzle mode), a constant for a constant stride. A descriptor
// stepped within its start-address field then costs a 32-bit add and one move to a uniform
// register, where a 64-bit add costs two of each and a carry.
__device__ __forceinline__ u32 smem_desc_sw128_lo(u32 addr, u32 lbo) {
  return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16);
}
__host__ __device__ constexpr u64 smem_desc_sw128_hi(u32 sbo) {
  return ((u64)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ u64 smem_desc_sw128(u32 addr, u32 lbo, u32 sbo) {
  return smem_desc_sw128_lo(addr, lbo) | smem_desc_sw128_hi(sbo);
}

// --- register reallocation between warpgroup roles --------------------------------------------
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R)); }

// --- TMA stores and named barriers (the epilogue) ----------------------------------------------
// One box from shared memory to a 3-D tensor map; elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_3d(const TmaDesc* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               :: "l"(map), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The shared-memory sources of this thread's bulk stores may be overwritten, all but those of its
// newest `pending` groups.
template <int pending = 0>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(pending) : "memory");
}
// This thread's bulk stores are complete in global memory.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// --- thread-block clusters: barrier and distributed shared memory ------------------------------
// Every thread of every CTA of the cluster arrives and waits (all of a warp's threads together);
// shared-memory writes before it are visible to the cluster's reads after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The same without the release / acquire: an arrival that orders no memory operation, so it does
// not wait for this thread's stores to land (for a last barrier that only keeps shared memory
// alive until the peers' reads of it, which their own later uses of the values complete).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n"
               "barrier.cluster.wait.aligned;\n" ::: "memory");
}
// The number of CTAs in this CTA's cluster.
__device__ __forceinline__ u32 cluster_size() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of byte `addr` (a shared::cta address) of CTA `rank`'s shared memory.
__device__ __forceinline__ u32 peer_smem_addr(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_peer_f4(u32 cluster_addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_addr) : "memory");
  return v;
}
