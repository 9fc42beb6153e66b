#!/usr/bin/env bash
# Branch wip/next (session 8's unrun work) on the device, in one call (~5 min): the GPU tests it
# touches, then SOL-080's 16 workloads with the branch's plan, with every in-kernel cluster sum
# off (cluster=0: split-K pieces and the router wgrad's pieces through global memory and sum
# kernels), and with the wide d_act at T = 3072 / 6144 (wide=1), interleaved; then timelines. Every step under a
# timeout: a cluster barrier that never completes would hang its kernel.
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
  echo "== SOL-080: base / cluster=0 / wide=1"
  timeout 150 python3 bench/ab_sol080_plans.py base cluster=0 wide=1 2>&1
  for v in "CUPY_MOE_SPLIT_CLUSTER=1 T=192" "CUPY_MOE_SPLIT_CLUSTER=0 T=192" \
           "CUPY_MOE_SOL080_WIDE_D_ACT=0 T=6144" "CUPY_MOE_SOL080_WIDE_D_ACT=1 T=6144"; do
    echo "== timeline $v"
    env ${v% *} timeout 60 python3 bench/profile_kernels.py sol080 ${v#*T=} 2>&1 | grep -v "^ *$"
  done
} > "${OUT:-/tmp}/ab_next.txt" 2>&1
cat "${OUT:-/tmp}/ab_next.txt"
