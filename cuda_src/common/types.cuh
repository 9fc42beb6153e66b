// Scalar types and conversions shared by every kernel. No system headers: NVRTC compiles this tree
// as it is, on the device and on a CPU-only machine alike.
#pragma once

typedef unsigned short bf16_t;        // raw bf16 bits
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
  return __uint_as_float(((u32)h) << 16);
}

// Round to nearest even (the hardware conversion; NaN stays NaN).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Two floats -> packed bf16x2 (low half = a).
__device__ __forceinline__ u32 pack_bf16x2(float a, float b) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float sigmoid_f32(float z) { return 1.0f / (1.0f + expf(-z)); }

// The same from the approximate exponential and reciprocal (relative error ~1e-6, far below bf16's
// 4e-3), for gradients rounded to bf16 in a GEMM epilogue, where each instruction stalls the
// tensor cores; the router keeps the exact one (its scores choose experts).
__device__ __forceinline__ float sigmoid_fast(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }

// Programmatic dependent launch: cupy_moe/_launch.py lets a kernel start while the grid before it
// on the stream is finishing, so its launch and set-up overlap that grid's tail. Every kernel
// calls this before it reads anything an earlier launch wrote and before it writes anything: it
// returns once the earlier grids have completed and their memory is visible (a no-op for a
// launch without the attribute, and before sm_90).
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// A call whose input check fails still has its launches enqueued (the host reads the check's
// verdict after enqueueing them, so the GPU never waits on the host): each of them reads the
// verdict the check kernel left earlier on the same stream, and does nothing when it is set.
// cancel == nullptr: nothing to read (launches no check guards).
__device__ __forceinline__ bool cancelled(const int* cancel) {
  return cancel != nullptr && *(const volatile int*)cancel != 0;
}

// Element i of the sum of split-K pieces laid out [count][n], added in piece order (deterministic).
// It starts from piece 0, not from 0.f, so a sum of negative zeros stays -0 as one product would.
__device__ __forceinline__ float sum_of_pieces(const float* __restrict__ pieces, int count, i64 n, i64 i) {
  float acc = pieces[i];
  for (int s = 1; s < count; ++s) acc += pieces[s * n + i];
  return acc;
}

// Elements i .. i + 7 of the same sum (n % 8 == 0, pieces 16-byte aligned): 16-byte loads.
__device__ __forceinline__ void sum_of_pieces_x8(const float* __restrict__ pieces, int count, i64 n, i64 i,
                                                 float (&out)[8]) {
  float4 a = *(const float4*)(pieces + i), b = *(const float4*)(pieces + i + 4);
  for (int s = 1; s < count; ++s) {
    const float4 c = *(const float4*)(pieces + s * n + i), d = *(const float4*)(pieces + s * n + i + 4);
    a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
    b.x += d.x; b.y += d.y; b.z += d.z; b.w += d.w;
  }
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

#include "trace.cuh"  // TRACE_SCOPE(): every kernel's second statement
