// SOL-080's SwiGLU backward contract (sol080.md steps 3-4) on two adjacent elements held as packed
// bf16 pairs: shared by d_act's fused GEMM epilogue and the bulk-copy elementwise kernel, so both
// write the same bits.
#pragma once
#include "types.cuh"

// bf16(a * b) on packed pairs. A product of two bf16 values is exact in fp32 (8 x 8 significand
// bits), so this equals rounding the fp32 product: the same bits in one instruction for two.
__device__ __forceinline__ u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// From d_act (da2, already bf16), gate (gv, as floats) and its sigmoid sg, and up: t = bf16(d_act up);
// d_up = bf16(d_act bf16(silu(g))); d_gate = bf16(t sg (1 + g (1 - sg))).
__device__ __forceinline__ void contract_swiglu_pair(u32 da2, const float (&gv)[2], const float (&sg)[2], u32 u2,
                                                     u32& dg2, u32& du2) {
  float dg[2];
  const u32 t2 = mul_bf16x2(da2, u2);
  du2 = mul_bf16x2(da2, pack_bf16x2(gv[0] * sg[0], gv[1] * sg[1]));
  const float t[2] = {bf16_to_f32(t2 & 0xffff), bf16_to_f32(t2 >> 16)};
  #pragma unroll
  for (int e = 0; e < 2; ++e) dg[e] = t[e] * sg[e] * (1.f + gv[e] * (1.f - sg[e]));
  dg2 = pack_bf16x2(dg[0], dg[1]);
}

// The same from gate as a packed pair, sig from the approximate exponential and reciprocal
// (sigmoid_fast: each instruction competes with the MMAs where this runs in an epilogue).
__device__ __forceinline__ void contract_swiglu_pair(u32 da2, u32 g2, u32 u2, u32& dg2, u32& du2) {
  const float gv[2] = {bf16_to_f32(g2 & 0xffff), bf16_to_f32(g2 >> 16)};
  const float sg[2] = {sigmoid_fast(gv[0]), sigmoid_fast(gv[1])};
  contract_swiglu_pair(da2, gv, sg, u2, dg2, du2);
}
