#!/usr/bin/env bash
# Everything a device session should prove, in one call (about 8-10 minutes on one H200):
# the GPU suite, compute-sanitizer on the small cases, the benchmark tables, the endurance run.
# Usage (from the repo root, on the device): bash tests/device_check.sh; logs under ${OUT:-/tmp}.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
# Four logs come back (the device returns at most 8 files): suite, sanitize, bench, endurance.
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/suite.txt"
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/ -m "gpu or slow" -k "not wheel" \
  >> "$out/suite.txt" 2>&1; echo "suite exit $?" >> "$out/suite.txt"; tail -3 "$out/suite.txt"
SANITIZE_TIMEOUT=150 bash tests/sanitize.sh memcheck racecheck synccheck initcheck
for f in "$out"/sanitize-*.log; do echo "== $f"; cat "$f"; done > "$out/sanitize.log"; rm -f "$out"/sanitize-*.log
timeout 300 python3 bench/benchmark.py --reps 20 > "$out/bench.txt" 2>&1; tail -45 "$out/bench.txt"
timeout 330 python3 bench/endurance.py --calls 2000 --check-every 200 --time-limit 300 > "$out/endurance.txt" 2>&1
echo "endurance exit $?" >> "$out/endurance.txt"; tail -4 "$out/endurance.txt"
