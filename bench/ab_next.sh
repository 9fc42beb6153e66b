#!/usr/bin/env bash
# Branch wip/next on the device, in one call (~5 min): the GPU tests it touches, then SOL-080's 16
# workloads interleaved: the branch's plan (base), d_act's and the dgrad's split-K cluster sums off
# (scluster=0), the router wgrad's in-GEMM sum off (rcluster=0), every cluster sum off (cluster=0),
# the element-by-element SwiGLU contract (packed=0, must give the same bits); then timelines of
# T = 8192 with and without the router wgrad's in-GEMM sum. Every step under a timeout: a cluster
# barrier that never completes would hang its kernel.
# Usage (device): bash bench/ab_next.sh; log ${OUT:-/tmp}/ab_next.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
{
  echo "== GPU tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_gemm.py \
    -k "split" > /tmp/t_gemm.txt 2>&1 &
  timeout 220 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_layer.py \
    > /tmp/t_layer.txt 2>&1 &
  timeout 220 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_sol080.py \
    tests/test_gpu_router.py tests/test_determinism.py > /tmp/t_sol.txt 2>&1
  wait
  tail -n 3 /tmp/t_gemm.txt /tmp/t_layer.txt /tmp/t_sol.txt
  cp /tmp/t_gemm.txt /tmp/t_layer.txt /tmp/t_sol.txt "${OUT:-/tmp}/" 2>/dev/null
  echo "== SOL-080: base / scluster=0 / rcluster=0 / cluster=0 / packed=0"
  timeout 240 python3 bench/ab_sol080_plans.py base scluster=0 rcluster=0 cluster=0 packed=0 2>&1
  for v in "CUPY_MOE_ROUTER_WGRAD_CLUSTER=1 8192" "CUPY_MOE_ROUTER_WGRAD_CLUSTER=0 8192"; do
    echo "== timeline $v"
    env ${v% *} timeout 60 python3 bench/profile_kernels.py sol080 ${v#* } 2>&1 | grep -v "^ *$"
  done
} > "${OUT:-/tmp}/ab_next.txt" 2>&1
cat "${OUT:-/tmp}/ab_next.txt"
