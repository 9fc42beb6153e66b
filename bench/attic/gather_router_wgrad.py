"""SCRATCH (bench/NOTES.md v0.54): a bound for the router weight gradient as an expert-major gather whose
token rows come in by bulk copies (a ring of SLOTS x ROWS rows in shared memory, one CTA an expert,
H = 4096, K = 8), against the tensor-core form (router.weight_gradient), each alone, L2 flushed.
Usage (device): PYTHONPATH=. python bench/attic/gather_router_wgrad.py (writes cuda_src/_probe_gather.cu for its run)"""
import os, sys
sys.path.insert(0, "bench")
sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import cupy as cp
from benchmark import timer
from cupy_moe import bfloat16, _build
from cupy_moe.gpu import router
from sparse_router_wgrad import E, K, H, router_wgrad_inputs

SRC = r'''
#include "common/hopper.cuh"
// ROWS token rows a slot (one bulk copy each, one barrier a slot); the chunk's hits found by a
// coalesced scan of the int64 routing rows (16-byte words), then compacted in token order.
constexpr int kConsumerWarps = 16, kChunk = 2048, kK = 8;
extern "C" __global__ void __launch_bounds__(32 * (kConsumerWarps + 1), 1)
wgrad_gather(const i64* __restrict__ idx, const float* __restrict__ wsel, const bf16_t* __restrict__ x,
             float* __restrict__ out, int T, int K) {
  constexpr int H = 4096, kThreads = 32 * kConsumerWarps;
  extern __shared__ __align__(128) u8 ring[];
  __shared__ __align__(8) u64 full[SLOTS], empty[SLOTS];
  __shared__ int tok[kChunk];
  __shared__ float wt[kChunk];
  __shared__ signed char hitk[kChunk];
  __shared__ int warp_total[kConsumerWarps];
  const int e = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    for (int s = 0; s < SLOTS; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], kConsumerWarps); }
    fence_barrier_init();
  }
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  u32 it = 0;  // slots used so far
  for (int t0 = 0; t0 < T; t0 += kChunk) {
    const int tokens = min(kChunk, T - t0);
    for (int i = tid; i < kChunk; i += blockDim.x) hitk[i] = -1;
    __syncthreads();
    // (K = 8: a token's row is 4 words of two experts each)
    const uint4* words = (const uint4*)(idx + (i64)t0 * kK);
    const int nw = tokens * kK / 2;
    #pragma unroll 4
    for (int w = tid; w < nw; w += blockDim.x) {
      const uint4 v = words[w];
      if ((int)v.x == e && v.y == 0) hitk[(2 * w) / kK] = (2 * w) % kK;
      if ((int)v.z == e && v.w == 0) hitk[(2 * w + 1) / kK] = (2 * w + 1) % kK;
    }
    __syncthreads();
    constexpr int PER = kChunk / kThreads;
    int mine = 0, incl = 0;
    if (warp < kConsumerWarps) {
      #pragma unroll
      for (int j = 0; j < PER; ++j) mine += hitk[tid * PER + j] >= 0;
      incl = mine;
      #pragma unroll
      for (int d = 1; d < 32; d *= 2) { const int v = __shfl_up_sync(0xffffffffu, incl, d); if (lane >= d) incl += v; }
      if (lane == 31) warp_total[warp] = incl;
    }
    __syncthreads();
    if (warp < kConsumerWarps) {
      int pos = incl - mine;
      for (int w = 0; w < warp; ++w) pos += warp_total[w];
      #pragma unroll
      for (int j = 0; j < PER; ++j) {
        const int k = hitk[tid * PER + j];
        if (k >= 0) {
          const int t = t0 + tid * PER + j;
          tok[pos] = t; wt[pos] = wsel[(i64)t * kK + k]; ++pos;
        }
      }
    }
    __syncthreads();
    int n = 0;
    for (int w = 0; w < kConsumerWarps; ++w) n += warp_total[w];
    const int groups = (n + ROWS - 1) / ROWS;
    if (warp == kConsumerWarps) {  // the producer
      if (lane == 0)
        for (int m = 0; m < groups; ++m) {
          const u32 g = it + m, s = g % SLOTS;
          const int rows = min(ROWS, n - m * ROWS);
          mbar_wait(&empty[s], ((g / SLOTS) & 1) ^ 1);
          mbar_arrive_expect_tx(&full[s], rows * H * 2);
          for (int r = 0; r < rows; ++r)
            bulk_load(ring + (s * ROWS + r) * H * 2, x + (i64)tok[m * ROWS + r] * H, H * 2, &full[s]);
        }
    } else {
      for (int m = 0; m < groups; ++m) {
        const u32 g = it + m, s = g % SLOTS;
        const int rows = min(ROWS, n - m * ROWS);
        mbar_wait(&full[s], (g / SLOTS) & 1);
        uint4 v[ROWS];
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) v[r] = *(const uint4*)(ring + (s * ROWS + r) * H * 2 + tid * 16);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (r < rows) {
            const float w = wt[m * ROWS + r];
            const u32 p[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
            #pragma unroll
            for (int q = 0; q < 4; ++q) {
              acc[2 * q] = fmaf(w, __uint_as_float(p[q] << 16), acc[2 * q]);
              acc[2 * q + 1] = fmaf(w, __uint_as_float(p[q] & 0xffff0000u), acc[2 * q + 1]);
            }
          }
        }
      }
    }
    it += groups;
    __syncthreads();
  }
  if (warp < kConsumerWarps) {
    float4* o = (float4*)(out + (i64)e * H + tid * 8);
    o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}
'''
path = os.path.join("cuda_src", "_probe_gather.cu")
with open(path, "w") as f:
    f.write(SRC)
measure = timer(20)
mods = {}
for slots, rows in ((4, 4), (6, 4), (3, 8)):
    mod = _build.load_module("_probe_gather.cu", f"#define SLOTS {slots}\n#define ROWS {rows}\n")
    k = mod.get_function("wgrad_gather")
    from cupy.cuda import driver
    driver.funcSetAttribute(k.kernel.ptr, 8, slots * rows * H * 2)  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    mods[(slots, rows)] = k
for T in (997, 1321, 1879, 2053, 3089):
    idx, wsel, hilo, x, ref = router_wgrad_inputs(T)
    out_t = cp.empty((E, H), cp.float32)
    f_t = lambda: router.weight_gradient(hilo, x, out_t)
    row = [f"T {T:5d}: tensor {measure(f_t):5.1f} us"]
    for (slots, rows), k in mods.items():
        out_s = cp.full((E, H), cp.nan, cp.float32)
        f = lambda: k((E,), (32 * 17,), (idx, wsel, x, out_s, np.int32(T), np.int32(K)), shared_mem=slots * rows * H * 2)
        us = measure(f)
        err = float(cp.linalg.norm(out_s - ref) / cp.linalg.norm(ref))
        row.append(f"gather {slots}x{rows} {us:5.1f} us (err {err:.1e})")
    print("; ".join(row), flush=True)
os.remove(path)
