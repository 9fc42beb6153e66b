#!/usr/bin/env bash
# Session 16's first call (~6 min): where a K-grouped tile's ~1.6 us outside its main loop goes
# (bench/NOTES.md v0.15), and the two branches written for it. Carry the branches' trees first:
#   git archive wip/stmatrix-epilogue | tar -x -C _stm; git archive wip/early-claim | tar -x -C _ec
#   run(command="bash bench/k_grouped_gap.sh", carry=["_stm", "_ec"])
# Then: their GEMM tests (every C_TMA GEMM for _stm; K-grouped and claims for _ec), the K-grouped
# variants in each tree (main's static-order line answers whether claims stand between tiles),
# and main's traced layer timeline with the epilogue stamps. (No layer A/B across trees: across
# processes the GPU's power state moves it ~10%; v0.15.) Logs under ${OUT:-/tmp}.
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
tests() {  # tree, log, pytest -k
  (cd "$1" && timeout 240 python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" \
    tests/test_gpu_gemm.py -k "$3" > "$out/$2" 2>&1; echo "exit $?" >> "$out/$2")
}
[ -d _stm ] && tests _stm t_stm.txt "m_grouped or k_grouped or dense or transposed or more_tiles or dynamic" &
[ -d _ec ] && tests _ec t_ec.txt "k_grouped or dynamic or more_tiles" &
wait
for f in t_stm.txt t_ec.txt; do [ -f "$out/$f" ] && { echo "== $f"; tail -n 2 "$out/$f"; }; done
for tree in . _stm _ec; do
  [ -d "$tree" ] || continue
  echo "== k_grouped_variants: $tree"
  (cd "$tree" && timeout 100 python3 bench/k_grouped_variants.py 2>&1 | tail -n 12)
done
echo "== main's traced layer, per tile (epi / after: the two parts of the gap)"
timeout 120 python3 bench/sm_timeline.py --layer --tiles 8192 2>&1 | grep -v "^ *[0-9]*:  *[0-9]" | tail -n 30
