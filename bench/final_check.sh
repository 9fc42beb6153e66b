#!/usr/bin/env bash
# A short device check for a session's last call (~8 min): the GPU suite in three shards with the
# four compute-sanitizers beside them (tests/device_check.sh's first half), then SOL-080's 16
# workloads under this tree's plan and the variants in AB_VARIANTS (default: the router wgrad as
# its own GEMM) interleaved, then the tree in _old/ (an earlier commit, carried) for a same-machine
# reference.
# Usage (device): [AB_VARIANTS="base wdpp=0"] bash bench/final_check.sh; logs under ${OUT:-/tmp}
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
shard() {
  local name=$1; shift
  timeout ${SHARD_TIMEOUT:-270} python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" -k "not wheel" "$@" > "$out/suite-$name.txt" 2>&1
  echo "shard $name exit $?" >> "$out/suite-$name.txt"
}
shard gemm tests/test_gpu_gemm.py &
shard layer tests/test_gpu_layer.py tests/test_properties.py &
shard rest tests/ --ignore=tests/test_gpu_gemm.py --ignore=tests/test_gpu_layer.py --ignore=tests/test_properties.py &
SANITIZE_TIMEOUT=130 bash tests/sanitize.sh memcheck racecheck synccheck initcheck > "$out/sanitize-summary.txt" 2>&1 &
wait
# One summary file, named to sort first: a device call brings back at most 8 files of $OUT.
{
  for s in gemm layer rest; do echo "== shard $s"; grep -E "passed|failed|error|exit" "$out/suite-$s.txt" | grep -v "^\." | tail -3; done
  cat "$out/sanitize-summary.txt"
} > "$out/00-check-summary.txt"
cat "$out/00-check-summary.txt"
{
  echo "== SOL-080: this tree, ${AB_VARIANTS:=base fwgrad=0}"
  timeout 150 python3 bench/ab_sol080_plans.py --rounds 1 $AB_VARIANTS 2>&1
  if [ -d _old ]; then
    echo "== SOL-080 at the reference tree _old/"
    (cd _old && PYTHONPATH=. timeout 90 python3 bench/ab_sol080_plans.py --rounds 1 base 2>&1)
  fi
} > "$out/sol080_ab.txt" 2>&1
cat "$out/sol080_ab.txt"
