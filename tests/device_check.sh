#!/usr/bin/env bash
# Everything a device session should prove, in one call (about 7-8 minutes on one H200): the GPU
# suite (three shards in parallel, compute-sanitizer on the small cases beside them), then alone on
# the GPU the endurance run, the benchmark tables and the expert-parallel checks.
# Usage (from the repo root, on the device): bash tests/device_check.sh; logs under ${OUT:-/tmp}
# (five files: the device hands back at most eight). Knobs: BENCH_ARGS (default "--sol080
# --layer"; "" for every table), ENDURANCE_SECONDS (default 150).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_MOE_CACHE_DIR=${CUPY_MOE_CACHE_DIR:-/tmp/cupy_moe_cache} PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
gpu='gpu or slow'
pytest_shard() {  # name, then pytest arguments
  local name=$1; shift
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m "$gpu" -k "not wheel" "$@" > "$out/suite-$name.txt" 2>&1
  echo "shard $name exit $?" >> "$out/suite-$name.txt"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$out/gpu.txt"
pytest_shard gemm tests/test_gpu_gemm.py &
pytest_shard layer tests/test_gpu_layer.py tests/test_properties.py &
pytest_shard rest tests/ --ignore=tests/test_gpu_gemm.py --ignore=tests/test_gpu_layer.py \
  --ignore=tests/test_properties.py &
SANITIZE_TIMEOUT=200 bash tests/sanitize.sh memcheck racecheck synccheck initcheck > "$out/sanitize-summary.txt" 2>&1 &
wait
{ cat "$out/gpu.txt"; for s in gemm layer rest; do echo "== shard $s"; cat "$out/suite-$s.txt"; done; } > "$out/suite.txt"
rm -f "$out"/suite-*.txt "$out/gpu.txt"
grep -E "passed|failed|error|exit" "$out/suite.txt" | grep -v "^\." | tail -8
{ cat "$out/sanitize-summary.txt"; for f in "$out"/sanitize-*.log; do echo "== $f"; cat "$f"; done; } > "$out/sanitize.log"
rm -f "$out"/sanitize-*.log "$out/sanitize-summary.txt"; grep -E "exit" "$out/sanitize.log"
s=${ENDURANCE_SECONDS:-150}
timeout $((s + 60)) python3 bench/endurance.py --calls 2000 --check-every 200 --time-limit "$s" > "$out/endurance.txt" 2>&1
echo "endurance exit $?" >> "$out/endurance.txt"; tail -4 "$out/endurance.txt"
# The clocks the tables ran at (the layer's benchmark runs power-capped: bench/NOTES.md v0.5).
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 500 > "$out/clocks.csv" 2>/dev/null &
clock_log=$!
timeout 200 python3 bench/benchmark.py --reps 20 ${BENCH_ARGS---sol080 --layer} > "$out/bench.txt" 2>&1
if [[ "${BENCH_ARGS---sol080 --layer}" == *sol080* ]]; then  # the side-stream A/B in the same run
  echo "== CUPY_MOE_SOL080_STREAMS=0" >> "$out/bench.txt"
  CUPY_MOE_SOL080_STREAMS=0 timeout 90 python3 bench/benchmark.py --reps 20 --sol080 2>&1 | tail -19 >> "$out/bench.txt"
fi
kill "$clock_log" 2>/dev/null
python3 bench/clocks.py "$out/clocks.csv" >> "$out/bench.txt" 2>&1 || true
rm -f "$out/clocks.csv"
tail -46 "$out/bench.txt"
{ timeout 120 python3 bench/ep_scaling.py --tokens 4096 --reps 3 --worlds 1,2,4
  timeout 120 python3 examples/expert_parallel.py --gpu --world 1 --tokens 96; echo "example exit $?"; } > "$out/ep.txt" 2>&1
cat "$out/ep.txt"
