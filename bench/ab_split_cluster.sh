#!/usr/bin/env bash
# Branch wip/cluster-split-k on the device: the split-K GPU tests (the GEMM's in-kernel sums,
# SOL-080 at small T and at its 16 workloads), then SOL-080 with the pieces summed by a cluster
# per tile vs through global memory and the sum kernels, interleaved, then the T = 192 timeline
# of each. Every step under a timeout: a cluster barrier that never completes hangs the kernel.
# Usage (device): bash bench/ab_split_cluster.sh; log ${OUT:-/tmp}/ab_split_cluster.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache}
{
  echo "== GPU tests"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_gpu_gemm.py \
    tests/test_gpu_sol080.py -k "split or workloads" 2>&1 | tail -4
  echo "== SOL-080, cluster sums vs pieces + sum kernels"
  timeout 120 python3 bench/ab_sol080_plans.py base cluster=0 2>&1
  for c in 1 0; do
    echo "== timeline T = 192, CUPY_MOE_SPLIT_CLUSTER=$c"
    CUPY_MOE_SPLIT_CLUSTER=$c timeout 60 python3 bench/profile_kernels.py sol080 192 2>&1 | grep -v "^ *$"
  done
} > "${OUT:-/tmp}/ab_split_cluster.txt" 2>&1
cat "${OUT:-/tmp}/ab_split_cluster.txt"
