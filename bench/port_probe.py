"""What slows the wgmma main loop: traffic beside MMAs on one SM, by kind (bench/NOTES.md v0.40).

MMA warpgroups run wgmma m64nNk16 back to back on operands resident in shared memory (no loads),
K-major, 128-byte swizzle, 4 k16 steps a "k-step" (64 deep, as the GEMM's). A traffic warpgroup
beside them moves bytes through the same SM until they finish:
  0 nothing; 1 bulk copies global -> shared (as TMA loads; 16 KB each, RING of them in flight);
  2 st.shared; 3 st.global (a 256 KB region a CTA, L2-resident); 4 bulk copies shared -> global
  (as TMA stores); 5 ld.shared; 6 ld.global.cg (L2 hits); the thread modes by 16-byte (v4) or,
  with VEC=1, also 8-byte (v2) accesses.
Printed per case: the MMA warpgroups' cycles a k-step from the first one's start to the last one's
end, the tensor peak's (4096 FLOP a clock an SM), the wgmma operand bytes a clock that implies
(A 2 KB + B 32 N bytes a wgmma), and the traffic's bytes a clock. SWEEP=1: bulk loads alone and
beside MMAs over 8 .. 132 CTAs (the L2's aggregate rate). Session 40 on an H200: every MMA shape
alone at 100% of peak (128 B a clock of operands included); bulk loads with 128 KB in flight
beside them ~51 B a clock at no MMA cost; thread-issued st.shared / ld.shared / st.global at 22-36
B a clock cost the MMAs 16-26%, and shared-memory accesses twice as much a byte by 8-byte ones as by
16-byte ones; ld.global (L2 hits) at 17-26 B a clock costs nothing; bulk stores 13 B a clock ~5%;
bulk loads alone ~49.5 B a clock an SM on 132 SMs (~13 TB/s), 69 on up to 99.
Usage (device): PYTHONPATH=. python bench/port_probe.py  (ITERS=4000; SWEEP=1; VEC=1)"""
import os
import sys

import numpy as np
import cupy as cp

from cupy_moe import _build, _launch

SRC = r'''
#include "gemm/wgmma_ops.cuh"
constexpr int CHUNK = 16384;

__device__ __forceinline__ void bulk_store(void* dst, const void* src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               :: "l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
}

template <int N, int WGS, int MODE, int RING, int VEC>
__device__ __forceinline__ void probe(const u8* src, u8* dst, unsigned long long* out, int iters, long long max_bytes) {
  extern __shared__ __align__(1024) u8 raw[];
  u8* smem = (u8*)(((unsigned long long)raw + 1023) & ~1023ull);
  constexpr int B_OFF = WGS * 8192, FILL_OFF = B_OFF + N * 128, BAR_OFF = FILL_OFF + RING * CHUNK;
  u64* bars = (u64*)(smem + BAR_OFF);
  volatile int* done = (volatile int*)(smem + BAR_OFF + 64);
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  for (int i = tid; i < FILL_OFF / 4; i += blockDim.x) {  // operands: +-(1 .. 2), random mantissas
    const u32 h = (u32)i * 2654435761u;
    ((u32*)smem)[i] = 0x3f803f80u | (h & 0x807f807fu);
  }
  if (tid == 0) {
    for (int i = 0; i < RING; ++i) mbar_init(&bars[i], 1);
    *done = 0;
    fence_barrier_init();
  }
  fence_proxy_async();
  __syncthreads();
  if (wg == WGS) {
    if (MODE == 0) return;
    long long bytes = 0;
    const unsigned long long t0 = clock64();
    auto stop = [&]() { return WGS > 0 ? *done != 0 : bytes >= max_bytes; };
    if constexpr (MODE == 1 || MODE == 4) {
      if (t == 0) {
        const u8* g = src + (unsigned long long)(blockIdx.x % 64) * 65536;
        u8* d = dst + (unsigned long long)blockIdx.x * 262144;
        long long n = 0;
        while (!stop()) {
          const int s = (int)(n % RING);
          u8* ring = smem + FILL_OFF + s * CHUNK;
          if constexpr (MODE == 1) {
            if (n >= RING) mbar_wait(&bars[s], (u32)((n / RING - 1) & 1));
            mbar_arrive_expect_tx(&bars[s], CHUNK);
            bulk_load(ring, g + (n % 16) * CHUNK, CHUNK, &bars[s]);
          } else {
            bulk_wait_read<RING - 1>();
            bulk_store(d + (n % 16) * CHUNK, ring, CHUNK);
            bulk_commit();
          }
          ++n;
          bytes += CHUNK;
        }
        if constexpr (MODE == 1) {
          for (long long m = n > RING ? n - RING : 0; m < n; ++m) mbar_wait(&bars[m % RING], (u32)((m / RING) & 1));
        } else {
          bulk_wait();
        }
      }
    } else {
      // VEC-byte accesses (16: v4, 8: v2), 256 bytes a thread a loop trip either way.
      constexpr int PER = 256 / VEC;
      u8* base = smem + FILL_OFF;
      u8* gbase = dst + (unsigned long long)blockIdx.x * 262144;
      const u8* gsrc = src + (unsigned long long)(blockIdx.x % 64) * 65536;
      uint4 v = make_uint4(t, 1, 2, 3), acc = make_uint4(0, 0, 0, 0);
      int j = 0;
      while (!stop()) {
        #pragma unroll
        for (int i = 0; i < PER; ++i) {
          const int idx = (t + 128 * (i + PER * j)) % (RING * CHUNK / VEC);
          const u32 addr = smem_addr(base + VEC * idx);
          const int gidx = (t + 128 * (i + PER * j)) % (262144 / VEC);
          if constexpr (MODE == 2) {
            if constexpr (VEC == 16)
              asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
            else
              asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" :: "r"(addr), "r"(v.x), "r"(v.y) : "memory");
          } else if constexpr (MODE == 3) {
            if constexpr (VEC == 16) ((uint4*)gbase)[gidx] = v;
            else ((uint2*)gbase)[gidx] = make_uint2(v.x, v.y);
          } else if constexpr (MODE == 6) {
            const unsigned long long ga = (unsigned long long)(gsrc + VEC * (gidx % (65536 / VEC)));
            u32 r0, r1, r2 = 0, r3 = 0;
            if constexpr (VEC == 16)
              asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "l"(ga) : "memory");
            else
              asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "l"(ga) : "memory");
            acc.x ^= r0; acc.y ^= r1; acc.z ^= r2; acc.w ^= r3;
          } else {
            uint4 r = make_uint4(0, 0, 0, 0);
            if constexpr (VEC == 16)
              asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr) : "memory");
            else
              asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "r"(addr) : "memory");
            acc.x ^= r.x; acc.y ^= r.y; acc.z ^= r.z; acc.w ^= r.w;
          }
        }
        j = (j + 1) & 7;
        v.x += 1;
        bytes += 256 * 128;  // the warpgroup's bytes (each thread counts them all; t == 0 reports)
      }
      if (acc.x == 0x12345678u && acc.y == 7u) out[blockIdx.x * 16 + 12] = acc.z;
    }
    const unsigned long long t1 = clock64();
    if (t == 0) {
      out[blockIdx.x * 16 + 8] = (unsigned long long)bytes;
      out[blockIdx.x * 16 + 9] = t1 - t0;
    }
  } else {
    float acc[N / 2];
    #pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    const u64 da = smem_desc_sw128(smem_addr(smem + wg * 8192), 16, 1024);
    const u64 db = smem_desc_sw128(smem_addr(smem + B_OFF), 16, 1024);
    const unsigned long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
      fence_operands(acc);
      wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_m64k16<N, 0, 0>(acc, da + 2 * kk, db + 2 * kk, 1);
      wgmma_commit();
      fence_operands(acc);
      wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_operands(acc);
    const unsigned long long t1 = clock64();
    if (t == 0) {
      out[blockIdx.x * 16 + wg] = t0;
      out[blockIdx.x * 16 + 4 + wg] = t1;
    }
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < N / 2; ++i) s += acc[i];
    if (s == 1.2345f) out[blockIdx.x * 16 + 13] = 1;
    named_barrier(1, 128 * WGS);
    if (tid == 0) *done = 1;
  }
}

#define PROBE_V(N, WGS, MODE, RING, VEC) \
  extern "C" __global__ void __launch_bounds__((WGS + 1) * 128, 1) \
  probe_##N##_##WGS##_##MODE##_##RING##_##VEC(const u8* src, u8* dst, unsigned long long* out, int iters, \
                                               long long max_bytes) { \
    probe<N, WGS, MODE, RING, VEC>(src, dst, out, iters, max_bytes); }
#define PROBE(N, WGS, MODE, RING) PROBE_V(N, WGS, MODE, RING, 16)
PROBE_V(256, 2, 2, 3, 8) PROBE_V(256, 2, 3, 3, 8) PROBE_V(256, 2, 5, 3, 8) PROBE_V(256, 2, 6, 3, 8)
PROBE(256, 2, 6, 3) PROBE(64, 0, 6, 3) PROBE_V(64, 0, 2, 3, 8) PROBE_V(64, 0, 3, 3, 8) PROBE_V(64, 0, 5, 3, 8)
PROBE_V(64, 0, 6, 3, 8)
PROBE(256, 2, 0, 3) PROBE(128, 2, 0, 3) PROBE(128, 4, 0, 3) PROBE(64, 2, 0, 3) PROBE(64, 4, 0, 3)
PROBE(256, 2, 1, 3) PROBE(128, 2, 1, 3) PROBE(128, 4, 1, 3) PROBE(64, 4, 1, 3)
PROBE(256, 2, 1, 8) PROBE(128, 2, 1, 8) PROBE(128, 4, 1, 8) PROBE(64, 4, 1, 8)
PROBE(256, 2, 2, 3) PROBE(128, 2, 2, 3) PROBE(256, 2, 3, 3) PROBE(128, 2, 3, 3) PROBE(256, 2, 4, 3) PROBE(128, 2, 4, 3)
PROBE(256, 2, 5, 3) PROBE(128, 2, 5, 3) PROBE(128, 4, 2, 3) PROBE(128, 4, 5, 3)
PROBE(64, 0, 1, 3) PROBE(64, 0, 1, 8) PROBE(64, 0, 2, 3) PROBE(64, 0, 3, 3) PROBE(64, 0, 4, 3) PROBE(64, 0, 5, 3)
'''

MODES = {0: "none", 1: "bulk load", 2: "st.shared", 3: "st.global", 4: "bulk store", 5: "ld.shared", 6: "ld.global"}
CASES = [(256, 2, 0, 3), (128, 2, 0, 3), (128, 4, 0, 3), (64, 2, 0, 3), (64, 4, 0, 3),
         (64, 0, 1, 3), (64, 0, 1, 8), (64, 0, 2, 3), (64, 0, 3, 3), (64, 0, 4, 3), (64, 0, 5, 3),
         (256, 2, 1, 3), (128, 2, 1, 3), (128, 4, 1, 3), (64, 4, 1, 3),
         (256, 2, 1, 8), (128, 2, 1, 8), (128, 4, 1, 8), (64, 4, 1, 8),
         (256, 2, 2, 3), (128, 2, 2, 3), (128, 4, 2, 3), (256, 2, 3, 3), (128, 2, 3, 3),
         (256, 2, 4, 3), (128, 2, 4, 3), (256, 2, 5, 3), (128, 2, 5, 3), (128, 4, 5, 3)]


def main():
    path = os.path.join(_build.cuda_src_dir(), "_port_probe.cu")
    with open(path, "w") as f:
        f.write(SRC)
    try:
        mod = _build.load_module("_port_probe.cu")
    finally:
        os.remove(path)
    src = cp.random.standard_normal(128 * 65536 // 4, dtype=cp.float32)
    dst = cp.zeros(132 * 262144, cp.uint8)
    iters = int(os.environ.get("ITERS", "4000"))
    print(f"{'N':>4} {'WGs':>3} {'traffic':>13} {'CTAs':>4} | {'MMA cyc/kstep':>13} {'peak':>5} {'%peak':>6} "
          f"{'wgmma B/clk':>11} | {'traffic B/clk':>13} | sum B/clk")
    sweep, vec = os.environ.get("SWEEP"), os.environ.get("VEC")
    vec_cases = [(n, w, m, 3, v) for v in (16, 8) for m in (2, 3, 5, 6) for n, w in ((64, 0), (256, 2))]
    for ctas in ((8, 16, 33, 66, 99, 132) if sweep else (132,) if vec else (16, 132)):
        for case in ([(64, 0, 1, 3), (64, 0, 1, 8), (128, 2, 1, 8), (256, 2, 1, 8)] if sweep else
                     vec_cases if vec else CASES):
            n, wgs, mode, ring = case[:4]
            width = case[4] if len(case) > 4 else 16
            out = cp.zeros(ctas * 16, cp.uint64)
            smem = wgs * 8192 + n * 128 + ring * 16384 + 128 + 1024
            args = [_launch.ptr(src), _launch.ptr(dst), _launch.ptr(out), _launch.i32(iters), _launch.i64(64 << 20)]
            name = f"probe_{n}_{wgs}_{mode}_{ring}_{width}"
            for _ in range(2):  # the second run is the one read
                out.fill(0)
                _launch.launch(mod, name, (ctas,), ((wgs + 1) * 128,), args, smem)
                cp.cuda.Device().synchronize()
            o = out.get().reshape(ctas, 16).astype(np.float64)
            label = MODES[mode] + (f" x{ring}" if mode in (1, 4) else f" v{width // 4}" if mode in (2, 3, 5, 6) else "")
            line = f"{n:>4} {wgs:>3} {label:>13} {ctas:>4} | "
            if wgs:
                cyc = (o[:, 4:4 + wgs].max(axis=1) - o[:, :wgs].min(axis=1)).mean() / iters
                peak = wgs * 64 * n * 64 * 2 / 4096  # FLOP a k-step / 4096 FLOP a clock an SM
                wg_bytes = wgs * 4 * (2048 + n * 32) / cyc
                line += f"{cyc:13.1f} {peak:5.0f} {100 * peak / cyc:5.1f}% {wg_bytes:11.1f} | "
            else:
                wg_bytes = 0.0
                line += f"{'':13} {'':5} {'':6} {'':11} | "
            if mode:
                tb = (o[:, 8] / np.maximum(o[:, 9], 1)).mean()
                line += f"{tb:13.1f} | {wg_bytes + tb:6.1f}   (all CTAs: {tb * ctas:7.0f} B/clk)"
            print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
