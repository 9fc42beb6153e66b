#!/usr/bin/env bash
# One device call that checks a kernel change meant to keep every bit against the tree before it
# (carried as _old/) and times it there (~7 min): the final check (suite, sanitizers, SOL-080 A/B
# of AB_VARIANTS, _old's SOL-080), every output's digest in both trees (bench/same_bits.py), and
# the layer traced alternately in both trees (LAYER_ROUNDS times each), its launches' spans side by
# side. Summaries go to files that sort first, since a device call brings back at most 8 files.
# Usage (local): rm -rf _old && mkdir _old && git archive HEAD | tar -x -C _old; then apply the
# change; then on the device, carrying _old: [AB_VARIANTS="base dyn=all"] bash bench/verify_against_old.sh
cd "$(dirname "$0")/.."
[ -d _old ] || { echo "no _old/ tree: carry the tree before the change as _old"; exit 2; }
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
SHARD_TIMEOUT=${SHARD_TIMEOUT:-280} SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-120} bash bench/final_check.sh > "$out/final.txt" 2>&1
{
  echo "== digests: this tree"
  timeout 120 python3 bench/same_bits.py 2>&1 | tail -6
  echo "== digests: _old"
  (cd _old && PYTHONPATH=. timeout 120 python3 bench/same_bits.py 2>&1 | tail -6)
} > "$out/01-same-bits.txt"
for i in $(seq "${LAYER_ROUNDS:-2}"); do
  for tree in . _old; do
    echo "== layer traced, tree $tree, round $i"
    (cd "$tree" && PYTHONPATH=. timeout 100 python3 bench/sm_timeline.py --layer 8192 2>&1 |
      sed -n '/call span/,/^busy/p' | grep -E "call span|gemm_sm90|busy")
  done
done > "$out/02-layer-traces.txt" 2>&1
cat "$out/00-check-summary.txt" "$out/01-same-bits.txt" "$out/02-layer-traces.txt"
tail -40 "$out/sol080_ab.txt"
