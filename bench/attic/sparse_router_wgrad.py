"""SCRATCH (bench/NOTES.md v0.54): a bound for the router weight gradient as an expert-major gather over
its K nonzeros a token (SIMT, exact fp32 products, deterministic token order) against the library's tensor-core form
(router.weight_gradient: [hi | lo]^T x), each alone, L2 flushed. Usage (device): PYTHONPATH=. python bench/attic/sparse_router_wgrad.py"""
import sys
sys.path.insert(0, "bench")
import numpy as np
import cupy as cp
from benchmark import timer
from cupy_moe import bfloat16
from cupy_moe.gpu import router

SRC = r'''
#define CHUNK_TOKENS 1024
extern "C" __global__ void __launch_bounds__(256) wgrad_sparse(const long long* __restrict__ idx,
    const float* __restrict__ wsel, const unsigned short* __restrict__ x, float* __restrict__ out,
    int T, int K, int E, int H) {
  __shared__ int tok[CHUNK_TOKENS];
  __shared__ float wt[CHUNK_TOKENS];
  __shared__ int warp_total[8];
  const int e = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int c0 = (blockIdx.x * 256 + tid) * COLS;
  float acc[COLS];
  #pragma unroll
  for (int i = 0; i < COLS; ++i) acc[i] = 0.f;
  for (int t0 = 0; t0 < T; t0 += CHUNK_TOKENS) {
    // thread tid scans tokens t0 + tid * (CHUNK_TOKENS / 256) + j, in token order
    constexpr int PER = CHUNK_TOKENS / 256;
    int mine = 0;
    int hit_k[PER];
    #pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int t = t0 + tid * PER + j;
      hit_k[j] = -1;
      if (t < T) for (int k = 0; k < K; ++k) if (idx[(long long)t * K + k] == e) { hit_k[j] = k; }
      mine += hit_k[j] >= 0;
    }
    int incl = mine;
    #pragma unroll
    for (int d = 1; d < 32; d *= 2) { const int v = __shfl_up_sync(0xffffffffu, incl, d); if (lane >= d) incl += v; }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    int before = 0, n = 0;
    for (int w = 0; w < 8; ++w) { if (w < warp) before += warp_total[w]; n += warp_total[w]; }
    int pos = before + incl - mine;
    #pragma unroll
    for (int j = 0; j < PER; ++j) if (hit_k[j] >= 0) {
      const int t = t0 + tid * PER + j;
      tok[pos] = t; wt[pos] = wsel[(long long)t * K + hit_k[j]]; ++pos;
    }
    __syncthreads();
    if (c0 < H) {
      int m = 0;
      for (; m + 4 <= n; m += 4) {
        uint4 v[4][COLS / 8];
        #pragma unroll
        for (int u = 0; u < 4; ++u)
          #pragma unroll
          for (int q = 0; q < COLS / 8; ++q) v[u][q] = *(const uint4*)(x + (long long)tok[m + u] * H + c0 + 8 * q);
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float w = wt[m + u];
          #pragma unroll
          for (int q = 0; q < COLS / 8; ++q) {
            const unsigned int p[4] = {v[u][q].x, v[u][q].y, v[u][q].z, v[u][q].w};
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
              acc[8 * q + 2 * r] = fmaf(w, __uint_as_float(p[r] << 16), acc[8 * q + 2 * r]);
              acc[8 * q + 2 * r + 1] = fmaf(w, __uint_as_float(p[r] & 0xffff0000u), acc[8 * q + 2 * r + 1]);
            }
          }
        }
      }
      for (; m < n; ++m) {
        const float w = wt[m];
        #pragma unroll
        for (int q = 0; q < COLS / 8; ++q) {
          const uint4 v = *(const uint4*)(x + (long long)tok[m] * H + c0 + 8 * q);
          const unsigned int p[4] = {v.x, v.y, v.z, v.w};
          #pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[8 * q + 2 * r] = fmaf(w, __uint_as_float(p[r] << 16), acc[8 * q + 2 * r]);
            acc[8 * q + 2 * r + 1] = fmaf(w, __uint_as_float(p[r] & 0xffff0000u), acc[8 * q + 2 * r + 1]);
          }
        }
      }
    }
    __syncthreads();
  }
  if (c0 < H) {
    #pragma unroll
    for (int q = 0; q < COLS / 4; ++q)
      *(float4*)(out + (long long)e * H + c0 + 4 * q) = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
  }
}
'''
E, K, H = 128, 8, 4096


def router_wgrad_inputs(T):
    """Random routing of T tokens: (idx [T, K] int64, wsel [T, K] fp32: grl at each slot, hilo
    [T, 2E] bf16: the library's [hi | lo] of grl, x [T, H] bf16, ref = grl^T x in fp64)."""
    rng = np.random.default_rng(T)
    scores = cp.asarray(rng.random((T, E), dtype=np.float32))
    idx = cp.asarray(np.argsort(-rng.random((T, E)), axis=1)[:, :K].astype(np.int64))
    c = cp.asarray(rng.standard_normal(T).astype(np.float32) * 1e-6)
    s_sel = cp.take_along_axis(scores, idx, axis=1)
    wsel = (c[:, None] * s_sel * (1 - s_sel)).astype(cp.float32)
    grl = cp.zeros((T, E), cp.float32)
    cp.put_along_axis(grl, idx, wsel, axis=1)
    hi = grl.astype(bfloat16)
    lo = (grl - hi.astype(cp.float32)).astype(bfloat16)
    x = cp.random.standard_normal((T, H), dtype=cp.float32).astype(bfloat16)
    return idx, wsel, cp.concatenate([hi, lo], axis=1), x, grl.astype(cp.float64).T @ x.astype(cp.float64)


def main():
    measure = timer(20)
    for T in (997, 1321, 1879, 2053, 3089, 4093, 8192):
        idx, wsel, hilo, x, ref = router_wgrad_inputs(T)
        out_t = cp.empty((E, H), cp.float32)
        t_tc = measure(lambda: router.weight_gradient(hilo, x, out_t))
        row = [f"T {T:5d}: tensor form {t_tc:6.1f} us (err {float(cp.linalg.norm(out_t - ref) / cp.linalg.norm(ref)):.1e})"]
        for cols in (8, 16):
            mod = cp.RawModule(code=SRC, options=("-std=c++17", f"-DCOLS={cols}"))
            k = mod.get_function("wgrad_sparse")
            out_s = cp.full((E, H), cp.nan, cp.float32)
            grid = ((H // cols + 255) // 256, E)
            f = lambda: k(grid, (256,), (idx, wsel, x.view(cp.uint16), out_s, np.int32(T), np.int32(K), np.int32(E), np.int32(H)))
            us = measure(f)
            err = float(cp.linalg.norm(out_s - ref) / cp.linalg.norm(ref))
            row.append(f"sparse cols {cols} ({grid[0] * E} CTAs) {us:6.1f} us (err {err:.1e})")
        print("; ".join(row), flush=True)


if __name__ == "__main__":
    main()
